"""Task heads shared by the encoder models: masked LM, sequence and token classification, question answering and
multiple choice, each calling its base model by keyword.

The same answer as transformers v5's `GenericForSequenceClassification` (``transformers/modeling_layers.py``, used
by ``class LlamaForSequenceClassification(GenericForSequenceClassification, LlamaPreTrainedModel): ...``): a head
is a mixin listed before the model's ``PreTrainedModel`` class. It builds the base model from the class attribute
``base_model_class`` (stored under the model's ``base_model_prefix``, so checkpoints keep ``longformer.*`` /
``bert.*``), puts its own layers on the model itself under the names transformers uses (``classifier``,
``qa_outputs``, ``lm_head``; PEFT's ``modules_to_save`` defaults — ``classifier`` / ``score`` for
``task_type="SEQ_CLS"``, ``qa_outputs`` for ``"QUESTION_ANS"`` — find them), and passes
every keyword argument it does not use itself on to the base model: a model's own inputs (Longformer's
``global_attention_mask``, BigBird's ``random_seed``) need no head of their own. A model subclasses a head to add a
rule (Longformer's default global tokens) and sets the few choices below where transformers' heads differ:

- ``classifier_activation`` / ``lm_head_activation``: an activation name (``ACT2FN``), or ``None`` for the
  config's ``hidden_act``;
- ``dropout_field``: the config field of the dropout before a classifier (falling back to ``hidden_dropout_prob``
  when the field is ``None``).

Pooled rows are each row's first real token (from ``attention_mask``), so left and right padding classify alike.
The heads' losses (`sequence_classification_loss`, `span_loss`, here because they check their targets with
`tf_family.modeling.validation`, which `tf_family.modeling.losses` does not import) are built on `tf_family.modeling.losses`; they never write
``problem_type`` into the config and honour `Trainer`'s ``num_items_in_batch`` (the sum over the labelled items
divided by their count over the accumulated batch), so gradient accumulation gives the update of one large batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import (
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import ModelOutput

from .losses import NumItems, cross_entropy, divide_by_num_items
from .utils import Dropout, build_activation, find_first_real_token
from .validation import check_class_labels, check_sequence_labels, check_span_positions, check_tensor


def classifier_dropout(config, field: str = "classifier_dropout") -> Dropout:
    """The dropout before a classifier: ``config.<field>``, or ``hidden_dropout_prob`` when that is ``None``."""
    probability = getattr(config, field)
    return Dropout(probability if probability is not None else config.hidden_dropout_prob)


# ------------------------------------------------------------------------------------ the heads' losses
def sequence_classification_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_labels: int,
    problem_type: str | None,
    num_items_in_batch: NumItems = None,
) -> torch.Tensor:
    """Regression (MSE), single-label (cross-entropy) or multi-label (BCE) loss, inferred like transformers does
    when ``problem_type`` is ``None``: one label -> regression, integer labels -> single-label, else multi-label.

    With ``num_items_in_batch`` (`Trainer` counts every entry of ``labels``: one per row, ``num_labels`` per row for
    multi-label or multi-output regression) the sum over the entries is divided by it. Labels outside the classes are
    refused (`tf_family.modeling.validation.check_sequence_labels`)."""
    check_sequence_labels(labels, logits.shape[0], num_labels, problem_type)
    labels = labels.to(logits.device)
    if problem_type is None:
        if num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    reduction = "mean" if num_items_in_batch is None else "sum"
    if problem_type == "regression":
        if num_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1), labels.to(logits.dtype), reduction=reduction)
        else:
            loss = F.mse_loss(logits, labels, reduction=reduction)
    elif problem_type == "single_label_classification":
        return cross_entropy(logits.view(-1, num_labels), labels.view(-1), num_items_in_batch)
    elif problem_type == "multi_label_classification":
        loss = F.binary_cross_entropy_with_logits(logits.float(), labels.to(torch.float32), reduction=reduction)
    else:
        raise ValueError(
            f"problem_type must be 'regression', 'single_label_classification' or 'multi_label_classification', "
            f"got {problem_type!r}."
        )
    return loss if num_items_in_batch is None else divide_by_num_items(loss, num_items_in_batch)


def span_loss(
    start_logits: torch.Tensor,
    end_logits: torch.Tensor,
    start_positions: torch.Tensor,
    end_positions: torch.Tensor,
    num_items_in_batch: NumItems = None,
) -> torch.Tensor:
    """Extractive question answering: mean of the start and end cross-entropies; positions outside the input
    (clamped to its length) are ignored; negative ones are refused. `Trainer` gives no ``num_items_in_batch`` here
    (the targets are not called ``labels``) and divides by the accumulation steps itself; a caller that counts the
    answered rows may pass it."""
    check_span_positions(start_positions, end_positions, start_logits.shape[0])
    length = start_logits.shape[1]
    start = start_positions.reshape(-1).clamp(0, length).to(start_logits.device)
    end = end_positions.reshape(-1).clamp(0, length).to(end_logits.device)
    start_loss = cross_entropy(start_logits, start, num_items_in_batch, ignore_index=length)
    end_loss = cross_entropy(end_logits, end, num_items_in_batch, ignore_index=length)
    return (start_loss + end_loss) / 2


class LMPredictionHead(nn.Module):
    """Dense + activation + layer norm + decoder (tied to the input embeddings): BERT's and RoBERTa's LM head."""

    def __init__(self, hidden_size: int, vocab_size: int, activation: str, layer_norm_eps: float):
        super().__init__()
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.activation = build_activation(activation)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.decoder = nn.Linear(hidden_size, vocab_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.layer_norm(self.activation(self.dense(hidden))))  # (B, T, V)


# Checkpoints saved before the sequence-classification head was a ``classifier`` module (its ``dense`` and
# ``out_proj`` sat on the model itself) load through the renaming of ``TffPreTrainedModel.from_pretrained``,
# which reads a class's ``_checkpoint_key_mapping``; saving writes the new names.
CLASSIFIER_KEY_MAPPING = {r"^dense\.": "classifier.dense.", r"^out_proj\.": "classifier.out_proj."}


class ClassificationHead(nn.Module):
    """Dropout, dense, activation, dropout, linear ``out_proj`` on pooled rows ``(B, in_features)``: the
    sequence-classification head of RoBERTa, Longformer, BigBird and Reformer, which transformers (and PEFT's
    ``modules_to_save`` default) call ``classifier``."""

    def __init__(self, in_features: int, hidden_size: int, num_labels: int, activation: str, dropout: float):
        super().__init__()
        self.dropout = Dropout(dropout)
        self.dense = nn.Linear(in_features, hidden_size)
        self.activation = build_activation(activation)
        self.out_proj = nn.Linear(hidden_size, num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.dropout(self.activation(self.dense(self.dropout(pooled)))))  # (B, num_labels)


class _Head:
    """What every head shares: the base model built from ``base_model_class`` and called by keyword, and (for the
    heads with ``labels``) one forward pass: base model -> `_logits` -> `_loss` -> ``output_class``."""

    base_model_class: type[nn.Module]
    add_pooling_layer = False  # only multiple choice reads the base model's pooler
    output_class: type[ModelOutput]

    def __init__(self, config):
        super().__init__(config)
        setattr(self, self.base_model_prefix, self.base_model_class(config, add_pooling_layer=self.add_pooling_layer))

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        return_dict=None,
        num_items_in_batch: NumItems = None,
        **kwargs,
    ):
        r"""transformers' head signature (`Trainer` and pipelines pass these by name), hence more than ~6 parameters.

        Args:
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds: as the base model takes them.
            labels: see the head's `_loss`.
            num_items_in_batch: the labels (not -100) over the whole accumulated batch, from `Trainer`: the loss is
                then their sum over it (`tf_family.modeling.losses`).
            kwargs: everything else (``output_attentions``, ``output_hidden_states``, the model's own inputs)
                goes to the base model by name.
        """
        outputs = self._encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        logits = self._logits(outputs, attention_mask)
        return self._finish(
            outputs, logits, labels=labels, return_dict=return_dict, num_items_in_batch=num_items_in_batch
        )

    def _encode(self, **inputs):
        """The base model's output (a `ModelOutput`), called by keyword with ``inputs`` as they are (the token
        inputs, ``output_attentions``, ``output_hidden_states``, the model's own inputs)."""
        return self.base_model(**inputs, return_dict=True)

    def _finish(
        self, outputs: ModelOutput, logits: torch.Tensor, *, labels, return_dict: bool | None, num_items_in_batch=None
    ):
        """The head's ``output_class`` (a tuple when ``return_dict`` is false), with the loss when labels are given."""
        output = self.output_class(
            loss=None if labels is None else self._loss(logits, labels, num_items_in_batch),
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output if self._returns_dict(return_dict) else output.to_tuple()

    def _returns_dict(self, return_dict: bool | None) -> bool:
        return return_dict if return_dict is not None else self.config.return_dict


class GenericForMaskedLM(_Head):
    """Masked language modelling: `LMPredictionHead` on every position. ``labels``: ``(B, T)`` token ids to predict
    at masked positions, -100 elsewhere. Subclasses declare
    ``_tied_weights_keys = {"lm_head.decoder.weight": "<prefix>.embeddings.word_embeddings.weight"}``."""

    lm_head_activation: str | None = None
    output_class = MaskedLMOutput

    def __init__(self, config):
        super().__init__(config)
        activation = self.lm_head_activation or config.hidden_act
        self.lm_head = LMPredictionHead(config.hidden_size, config.vocab_size, activation, config.layer_norm_eps)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    def _logits(self, outputs: ModelOutput, attention_mask) -> torch.Tensor:
        return self.lm_head(outputs.last_hidden_state)  # (B, T, V)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: NumItems) -> torch.Tensor:
        check_class_labels("labels", labels, logits.shape[-1], tuple(logits.shape[:2]), "vocab_size")
        return cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), num_items_in_batch)


class GenericForSequenceClassification(_Head):
    """A `ClassificationHead` ``classifier`` (RoBERTa's and BigBird's) on each row's first real token. ``labels``:
    ``(B,)`` class ids (floats for regression, ``(B, num_labels)`` for multi-label); the loss follows
    ``problem_type``, or is inferred from them (`tf_family.modeling.losses.sequence_classification_loss`)."""

    classifier_activation: str | None = "tanh"
    dropout_field = "classifier_dropout"
    output_class = SequenceClassifierOutput
    _checkpoint_key_mapping = CLASSIFIER_KEY_MAPPING

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.classifier = ClassificationHead(
            config.hidden_size,
            config.hidden_size,
            config.num_labels,
            self.classifier_activation or config.hidden_act,
            classifier_dropout(config, self.dropout_field).p,
        )
        self.post_init()

    def _logits(self, outputs: ModelOutput, attention_mask) -> torch.Tensor:
        hidden = outputs.last_hidden_state  # (B, T, D)
        first = find_first_real_token(attention_mask, hidden.shape[0], hidden.device)
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), first]  # (B, D)
        return self.classifier(pooled)  # (B, num_labels)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: NumItems) -> torch.Tensor:
        return sequence_classification_loss(
            logits, labels, self.num_labels, self.config.problem_type, num_items_in_batch
        )


class GenericForTokenClassification(_Head):
    """Dropout and a linear ``classifier`` on every position. ``labels``: ``(B, T)`` class ids, -100 where
    ignored."""

    dropout_field = "classifier_dropout"
    output_class = TokenClassifierOutput

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.dropout = classifier_dropout(config, self.dropout_field)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def _logits(self, outputs: ModelOutput, attention_mask) -> torch.Tensor:
        return self.classifier(self.dropout(outputs.last_hidden_state))  # (B, T, num_labels)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: NumItems) -> torch.Tensor:
        check_class_labels("labels", labels, self.num_labels, tuple(logits.shape[:2]), "num_labels")
        return cross_entropy(logits.view(-1, self.num_labels), labels.view(-1), num_items_in_batch)


def question_answering_output(
    logits: torch.Tensor, start_positions, end_positions, *, outputs: ModelOutput, num_items_in_batch: NumItems = None
) -> QuestionAnsweringModelOutput:
    """Start / end logits from ``(B, T, 2)`` span ``logits``, with `tf_family.modeling.losses.span_loss` when both positions
    are given; hidden states and attentions from the base model's ``outputs``."""
    start_logits, end_logits = (x.squeeze(-1).contiguous() for x in logits.split(1, dim=-1))  # (B, T) each
    loss = None
    if start_positions is not None and end_positions is not None:
        loss = span_loss(start_logits, end_logits, start_positions, end_positions, num_items_in_batch)
    return QuestionAnsweringModelOutput(
        loss=loss,
        start_logits=start_logits,
        end_logits=end_logits,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
    )


class GenericForQuestionAnswering(_Head):
    """Extractive question answering: a linear ``qa_outputs`` to ``num_labels`` (2: start, end) logits per token."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.qa_outputs = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        start_positions=None,
        end_positions=None,
        return_dict=None,
        num_items_in_batch: NumItems = None,
        **kwargs,
    ) -> QuestionAnsweringModelOutput | tuple:
        r"""transformers' head signature (`Trainer` and pipelines pass these by name), hence more than ~6 parameters.

        start_positions, end_positions: ``(B,)`` token indices of the answer span (`Trainer` passes no
        ``num_items_in_batch`` for them and scales for accumulation itself). Other keyword arguments go to the base
        model."""
        outputs = self._encode(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        logits = self.qa_outputs(outputs.last_hidden_state)  # (B, T, 2)
        output = question_answering_output(
            logits, start_positions, end_positions, outputs=outputs, num_items_in_batch=num_items_in_batch
        )
        return output if self._returns_dict(return_dict) else output.to_tuple()


class GenericForMultipleChoice(_Head):
    """One score per choice: dropout and a linear ``classifier`` on the base model's pooled output.

    Every tensor input is per choice, ``(B, C, T)`` (``inputs_embeds``: ``(B, C, T, D)``), and is flattened to
    ``(B*C, ...)`` for the base model; other values (a seed) pass unchanged."""

    add_pooling_layer = True
    dropout_field = "classifier_dropout"
    output_class = MultipleChoiceModelOutput

    def __init__(self, config):
        super().__init__(config)
        self.dropout = classifier_dropout(config, self.dropout_field)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        labels=None,
        return_dict=None,
        num_items_in_batch: NumItems = None,
        **kwargs,
    ) -> MultipleChoiceModelOutput | tuple:
        r"""transformers' head signature (`Trainer` and pipelines pass these by name), hence more than ~6 parameters.

        Args:
            input_ids, attention_mask and the other tensors: ``(B, C, T)``, one row per choice (``inputs_embeds``:
                ``(B, C, T, D)``).
            labels: ``(B,)`` index of the right choice.
            num_items_in_batch: the labelled rows of the accumulated batch (`Trainer`).
        """
        for name, value, dims in (("input_ids", input_ids, 3), ("inputs_embeds", inputs_embeds, 4)):
            if value is not None:
                check_tensor(name, value, dim=dims)
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of input_ids and inputs_embeds.")
        source = input_ids if input_ids is not None else inputs_embeds
        num_choices = source.shape[1]
        per_choice = (
            ("attention_mask", attention_mask),
            ("token_type_ids", token_type_ids),
            ("position_ids", position_ids),
        )
        for name, value in per_choice:
            if value is None:
                continue
            check_tensor(name, value)
            if tuple(value.shape[:2]) != tuple(source.shape[:2]):
                raise ValueError(
                    f"{name} must be (B, C, T) like the input, {tuple(source.shape[:3])}, got {tuple(value.shape)}."
                )

        def flat(value):
            return value.flatten(0, 1) if isinstance(value, torch.Tensor) else value  # (B*C, T, ...)

        inputs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "token_type_ids": token_type_ids,
            "position_ids": position_ids,
            "inputs_embeds": inputs_embeds,
            **kwargs,
        }
        outputs = self._encode(**{name: flat(value) for name, value in inputs.items()})
        logits = self.classifier(self.dropout(outputs.pooler_output)).view(-1, num_choices)  # (B, C)
        return self._finish(
            outputs, logits, labels=labels, return_dict=return_dict, num_items_in_batch=num_items_in_batch
        )

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: NumItems) -> torch.Tensor:
        check_class_labels("labels", labels, logits.shape[-1], (logits.shape[0],), "num_choices")
        return cross_entropy(logits, labels.view(-1), num_items_in_batch)


def memory_generation_inputs(
    input_ids: torch.LongTensor,
    mems,
    attention_mask: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    use_cache: bool | None,
    is_first_iteration: bool = True,
) -> dict:
    """``prepare_inputs_for_generation`` of a language model that carries a memory object as ``mems`` (the
    Transformer-XL family): the memory is what `generate` carries between steps (under ``mems``,
    `tf_family.modeling.state_names`), so once it exists only the newest token is fed (the
    rest is in the memory, which the model reads and updates); without one (first step, or no memory kept) the whole
    prefix is read."""
    model_inputs = {"attention_mask": attention_mask, "use_cache": use_cache}
    if mems is not None:
        model_inputs["input_ids"] = input_ids[:, -1:]
        model_inputs["mems"] = mems
    elif inputs_embeds is not None and is_first_iteration:
        model_inputs["inputs_embeds"] = inputs_embeds
    else:
        model_inputs["input_ids"] = input_ids
    return model_inputs


__all__ = [
    "CLASSIFIER_KEY_MAPPING",
    "ClassificationHead",
    "GenericForMaskedLM",
    "GenericForMultipleChoice",
    "GenericForQuestionAnswering",
    "GenericForSequenceClassification",
    "GenericForTokenClassification",
    "LMPredictionHead",
    "classifier_dropout",
    "memory_generation_inputs",
    "question_answering_output",
    "sequence_classification_loss",
    "span_loss",
]
