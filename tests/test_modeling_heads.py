"""The shared task heads (`tf_family.modeling.heads`): they call the base model by keyword and pass a model's own
inputs through, name their layers as transformers does, pick the loss from ``problem_type`` or the labels, and pool
each row's first real token whichever side the padding is on."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import find_labels

from tf_family.modeling.heads import (
    GenericForMaskedLM,
    GenericForMultipleChoice,
    GenericForQuestionAnswering,
    GenericForSequenceClassification,
    GenericForTokenClassification,
)
from tf_family.modeling.utils import find_first_real_token
from tf_family.models.big_bird.modeling_big_bird import TffBigBirdForMultipleChoice, TffBigBirdPreTrainedModel
from tf_family.models.longformer.modeling_longformer import TffLongformerForMultipleChoice
from tf_family.registry import get_arch

BATCH, LENGTH = 3, 7


class KeywordOnlyBase(TffBigBirdPreTrainedModel):
    """A base model that refuses positional arguments; each token's state depends on that token only, so a row's
    real tokens look the same under left and right padding."""

    def __init__(self, config, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings

    def forward(self, *, input_ids=None, attention_mask=None, inputs_embeds=None, return_dict=None, **kwargs):
        hidden = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, T, D)
        pooled = None
        if self.pooler is not None:
            first = find_first_real_token(attention_mask, hidden.shape[0], hidden.device)
            pooled = torch.tanh(self.pooler(hidden[torch.arange(hidden.shape[0]), first]))  # (B, D)
        return BaseModelOutputWithPooling(last_hidden_state=hidden, pooler_output=pooled)


class ToyForMaskedLM(GenericForMaskedLM, TffBigBirdPreTrainedModel):
    base_model_class = KeywordOnlyBase


class ToyForSequenceClassification(GenericForSequenceClassification, TffBigBirdPreTrainedModel):
    base_model_class = KeywordOnlyBase


class ToyForTokenClassification(GenericForTokenClassification, TffBigBirdPreTrainedModel):
    base_model_class = KeywordOnlyBase


class ToyForQuestionAnswering(GenericForQuestionAnswering, TffBigBirdPreTrainedModel):
    base_model_class = KeywordOnlyBase


class ToyForMultipleChoice(GenericForMultipleChoice, TffBigBirdPreTrainedModel):
    base_model_class = KeywordOnlyBase


def build(head, **overrides):
    torch.manual_seed(0)
    config = get_arch("big_bird").tiny_config(hidden_dropout_prob=0.0, **overrides)
    return head(config).eval()


def record_base_inputs(model) -> dict:
    seen = {}

    def hook(module, args, kwargs):
        assert args == (), "the head must call the base model by keyword"
        seen.update(kwargs)

    model.base_model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


@pytest.mark.parametrize(
    "head", [ToyForMaskedLM, ToyForSequenceClassification, ToyForTokenClassification, ToyForQuestionAnswering]
)
def test_heads_call_the_base_model_by_keyword_and_pass_model_inputs_through(head):
    model = build(head)
    seen = record_base_inputs(model)
    ids = torch.randint(3, 50, (BATCH, LENGTH))
    outputs = model(ids, torch.ones_like(ids), random_seed=7, output_hidden_states=True)
    assert seen["random_seed"] == 7 and seen["output_hidden_states"] is True
    assert seen["input_ids"] is ids and seen["return_dict"] is True
    assert isinstance(model(ids, return_dict=False), tuple)
    assert outputs.loss is None


def test_multiple_choice_flattens_every_tensor_input_and_passes_other_values():
    model = build(ToyForMultipleChoice)
    seen = record_base_inputs(model)
    ids = torch.randint(3, 50, (BATCH, 2, LENGTH))
    global_mask = torch.zeros_like(ids)
    labels = torch.tensor([0, 1, 1])
    outputs = model(ids, global_attention_mask=global_mask, random_seed=3, labels=labels)
    assert seen["input_ids"].shape == seen["global_attention_mask"].shape == (BATCH * 2, LENGTH)
    assert seen["random_seed"] == 3
    assert outputs.logits.shape == (BATCH, 2)
    torch.testing.assert_close(outputs.loss, F.cross_entropy(outputs.logits, labels))


def test_head_layers_have_transformers_names():
    names = {head: {n.split(".")[0] for n in build(head).state_dict()} for head in (
        ToyForMaskedLM, ToyForSequenceClassification, ToyForTokenClassification, ToyForQuestionAnswering,
        ToyForMultipleChoice,
    )}  # fmt: skip
    assert names[ToyForMaskedLM] == {"bert", "lm_head"}
    assert names[ToyForSequenceClassification] == {"bert", "classifier"}
    assert names[ToyForTokenClassification] == {"bert", "classifier"}
    assert names[ToyForQuestionAnswering] == {"bert", "qa_outputs"}
    assert names[ToyForMultipleChoice] == {"bert", "classifier"}
    assert "bert.pooler.weight" in build(ToyForMultipleChoice).state_dict()
    assert "bert.pooler.weight" not in build(ToyForSequenceClassification).state_dict()


@pytest.mark.parametrize(
    ("num_labels", "problem_type", "labels", "expected"),
    [
        (1, None, torch.tensor([0.5, -1.0, 2.0]), lambda logits, y: F.mse_loss(logits.squeeze(-1), y)),
        (3, None, torch.tensor([0, 2, 1]), lambda logits, y: F.cross_entropy(logits, y)),
        (3, None, torch.tensor([[1.0, 0, 1], [0, 0, 1], [1, 1, 0]]), F.binary_cross_entropy_with_logits),
        (2, "regression", torch.tensor([[0.5, 1.0], [0, 0], [2, 1]]), F.mse_loss),
        (3, "multi_label_classification", torch.tensor([[1, 0, 1], [0, 0, 1], [1, 1, 0]]),
         lambda logits, y: F.binary_cross_entropy_with_logits(logits, y.float())),
    ],
)  # fmt: skip
def test_sequence_classification_loss_types(num_labels, problem_type, labels, expected):
    model = build(ToyForSequenceClassification, num_labels=num_labels, problem_type=problem_type)
    outputs = model(torch.randint(3, 50, (BATCH, LENGTH)), labels=labels)
    torch.testing.assert_close(outputs.loss, expected(outputs.logits, labels))
    assert model.config.problem_type == problem_type  # the head never writes the inferred type into the config


def test_sequence_classification_pools_the_first_real_token_under_either_padding_side():
    model = build(ToyForSequenceClassification)
    real = torch.randint(3, 50, (BATCH, 4))
    pad = torch.zeros(BATCH, 3, dtype=torch.long)
    ones, zeros = torch.ones(BATCH, 4, dtype=torch.long), torch.zeros(BATCH, 3, dtype=torch.long)
    right = model(torch.cat([real, pad], 1), torch.cat([ones, zeros], 1)).logits
    left = model(torch.cat([pad, real], 1), torch.cat([zeros, ones], 1)).logits
    torch.testing.assert_close(left, right, rtol=0, atol=0)
    hidden = model.base_model.embeddings(real[:, 0])
    torch.testing.assert_close(right, model.classifier.out_proj(torch.tanh(model.classifier.dense(hidden))))


def test_token_classification_and_question_answering_losses():
    ids = torch.randint(3, 50, (BATCH, LENGTH))
    model = build(ToyForTokenClassification, num_labels=4)
    labels = torch.randint(0, 4, (BATCH, LENGTH))
    labels[0, :2] = -100
    outputs = model(ids, labels=labels)
    torch.testing.assert_close(outputs.loss, F.cross_entropy(outputs.logits.view(-1, 4), labels.view(-1)))

    model = build(ToyForQuestionAnswering)
    start, end = torch.tensor([1, 2, 99]), torch.tensor([3, 2, 99])  # the last row's answer lies outside: ignored
    outputs = model(ids, start_positions=start, end_positions=end)
    assert outputs.start_logits.shape == outputs.end_logits.shape == (BATCH, LENGTH)
    expected = (
        F.cross_entropy(outputs.start_logits[:2], start[:2]) + F.cross_entropy(outputs.end_logits[:2], end[:2])
    ) / 2
    torch.testing.assert_close(outputs.loss, expected)


def test_dropout_field_picks_the_config_field():
    """Longformer's multiple-choice head reads `classifier_dropout`; BigBird's reads `hidden_dropout_prob`, as in
    transformers."""
    overrides = {"classifier_dropout": 0.3, "hidden_dropout_prob": 0.1}
    longformer = TffLongformerForMultipleChoice(get_arch("longformer").tiny_config(**overrides))
    big_bird = TffBigBirdForMultipleChoice(get_arch("big_bird").tiny_config(**overrides))
    assert (longformer.dropout.p, big_bird.dropout.p) == (0.3, 0.1)
    unset = TffLongformerForMultipleChoice(get_arch("longformer").tiny_config(hidden_dropout_prob=0.2))
    assert unset.dropout.p == 0.2


@pytest.mark.parametrize("arch", ["longformer", "big_bird"])
def test_head_signatures_name_the_labels_and_the_model_inputs(arch):
    """`Trainer` keeps the dataset columns and finds the labels the forward signature names."""
    for task, head in get_arch(arch).model_classes.items():
        expected = {"base": [], "question_answering": ["start_positions", "end_positions"]}.get(task, ["labels"])
        assert find_labels(head) == expected, task
        parameters = inspect.signature(head.forward).parameters
        assert {"input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds"} <= set(parameters)
        assert ("global_attention_mask" in parameters) == (arch == "longformer"), task
