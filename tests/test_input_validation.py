"""Bad configs and model inputs (`tf_family.modeling.configuration`, `tf_family.modeling.validation`): each ends in a
`ValueError` / `TypeError` naming the field or argument, rather than being accepted silently or failing with an
unrelated error (KeyError, AssertionError, AttributeError, torch's "normal expects std >= 0.0", a raw ``max()`` error).
"""

from __future__ import annotations

import math

import pytest
import torch

from tf_family.models.knn_lm.configuration_knn_lm import TffKNNLMConfig
from tf_family.registry import create_model, get_arch


def tiny(arch: str, task: str, **overrides):
    torch.manual_seed(0)
    return create_model(arch, task, **overrides).eval()


def ids(batch: int = 2, length: int = 8, vocab: int = 128) -> torch.Tensor:
    return torch.randint(4, vocab, (batch, length), generator=torch.Generator().manual_seed(0))


def trajectory(model, batch: int = 2, steps: int = 4) -> dict:
    config = model.config
    actions = (
        torch.randint(0, config.act_dim, (batch, steps))
        if config.discrete
        else torch.zeros(batch, steps, config.act_dim)
    )
    return {
        "states": torch.randn(batch, steps, config.state_dim),
        "actions": actions,
        "returns_to_go": torch.ones(batch, steps, 1),
        "timesteps": torch.arange(steps).expand(batch, steps),
    }


# ------------------------------------------------------------------------------ class 6: silent nonsense (inputs)
@pytest.mark.parametrize("arch", ["transfo_xl", "compressive"])
def test_out_of_vocabulary_ids_in_the_adaptive_input_are_refused(arch):
    # they used to get a zero embedding: the model ran on and returned numbers for them
    model = tiny(arch, "causal_lm")
    bad = ids()
    bad[0, 3] = model.config.vocab_size + 5
    with pytest.raises(ValueError, match=r"input_ids must lie in \[0, vocab_size=128\)"):
        model(bad)


@pytest.mark.parametrize("arch", ["transfo_xl", "compressive"])
def test_out_of_vocabulary_labels_of_the_adaptive_softmax_are_refused(arch):
    # they used to count as zero loss
    model = tiny(arch, "causal_lm")
    labels = ids()
    labels[1, 5] = model.config.vocab_size + 5
    with pytest.raises(ValueError, match=r"labels must lie in \[0, vocab_size=128\) or -100"):
        model(ids(), labels=labels)


def test_a_nan_state_is_refused_before_it_poisons_the_row():
    model = tiny("decision_transformer", "action")
    inputs = trajectory(model)
    inputs["states"][0, -1, 0] = math.nan  # the last step: attention spread it to every earlier step of row 0
    with pytest.raises(ValueError, match="states holds NaN"):
        model(**inputs)


# ------------------------------------------------------------------------------ class 6: silent nonsense (configs)
@pytest.mark.parametrize(
    ("arch", "field", "value"),
    [
        ("decision_transformer", "state_std", [math.nan] * 5),
        ("decision_transformer", "state_mean", [0.0, math.inf, 0.0, 0.0, 0.0]),
        ("decision_transformer", "return_scale", math.inf),
        ("decision_transformer", "target_return", math.nan),
        ("decision_transformer", "state_loss_weight", math.inf),
        ("compressive", "attention_reconstruction_loss_weight", math.nan),
        ("calm", "meta_loss_weight", math.nan),
    ],
)
def test_nan_and_inf_config_floats_are_refused(arch, field, value):
    with pytest.raises(ValueError, match=f"{field}.*finite"):
        get_arch(arch).tiny_config(**{field: value})


@pytest.mark.parametrize(
    ("arch", "field"),
    [
        ("transfo_xl", "layer_norm_epsilon"),
        ("memorizing", "layer_norm_epsilon"),
        ("longformer", "layer_norm_eps"),
        ("big_bird", "layer_norm_eps"),
        ("reformer", "layer_norm_eps"),
        ("calm", "rms_norm_eps"),
        ("decision_transformer", "layer_norm_epsilon"),
    ],
)
def test_a_negative_layer_norm_epsilon_is_refused(arch, field):
    with pytest.raises(ValueError, match=f"{field} must be > 0"):
        get_arch(arch).tiny_config(**{field: -1e-5})


# ---------------------------------------------------------------------- class 7: errors that named nothing (configs)
@pytest.mark.parametrize(
    ("arch", "field"),
    [("transfo_xl", "init_std"), ("longformer", "initializer_range"), ("calm", "initializer_range")],
)
def test_a_negative_init_std_is_refused_by_name(arch, field):
    # torch used to say "normal expects std >= 0.0" while building the model
    with pytest.raises(ValueError, match=f"{field} must be >= 0"):
        create_model(arch, get_arch(arch).tasks[0], **{field: -0.1})


@pytest.mark.parametrize("arch", ["longformer", "big_bird", "reformer", "calm"])
def test_an_unknown_hidden_act_is_refused_by_name(arch):
    # a KeyError 'nope' while building the model, before
    with pytest.raises(ValueError, match="hidden_act='nope' is not a known activation"):
        create_model(arch, get_arch(arch).tasks[0], hidden_act="nope")


@pytest.mark.parametrize("arch", ["big_bird", "calm", "transfo_xl"])
def test_a_pad_token_id_beyond_the_vocabulary_is_refused(arch):
    # an AssertionError from nn.Embedding (BigBird, CALM), or accepted (Transformer-XL)
    with pytest.raises(ValueError, match=r"pad_token_id=1000 is not a token of the vocabulary \[0, vocab_size=128\)"):
        create_model(arch, get_arch(arch).tasks[0], pad_token_id=1000)


def test_a_base_config_given_as_a_model_type_name_is_refused_with_the_supported_types():
    # an AttributeError ('str' object has no attribute 'get'), before
    with pytest.raises(TypeError, match=r"base_config must be a dict with a 'model_type'.*'llama'.*e\.g\. \["):
        TffKNNLMConfig(base_config="llama")


@pytest.mark.parametrize("arch", ["transfo_xl", "longformer", "reformer", "calm", "knn_lm"])
def test_float_input_ids_are_refused_by_name(arch):
    model = tiny(arch, "causal_lm")
    with pytest.raises(TypeError, match="input_ids must hold integer ids"):
        model(ids().float())


@pytest.mark.parametrize(("arch", "task"), [("longformer", "masked_lm"), ("big_bird", "masked_lm")])
@pytest.mark.parametrize("shape", [(2, 0), (0, 8)])
def test_empty_sequences_and_batches_are_refused_by_name(arch, task, shape):
    # a raw "max(): Expected reduction dim to be specified for input.numel() == 0", before
    model = tiny(arch, task)
    with pytest.raises(ValueError, match=r"input_ids is empty \(shape"):
        model(torch.zeros(shape, dtype=torch.long))


@pytest.mark.parametrize("steps_or_batch", ["steps", "batch"])
def test_an_empty_trajectory_is_refused_by_name(steps_or_batch):
    model = tiny("decision_transformer", "action")
    inputs = trajectory(model)
    cut = (slice(None), slice(0, 0)) if steps_or_batch == "steps" else (slice(0, 0),)
    inputs = {name: value[cut] for name, value in inputs.items()}
    with pytest.raises(ValueError, match="states is empty"):
        model(**inputs)


@pytest.mark.parametrize("arch", ["transfo_xl", "compressive", "memorizing"])
def test_mems_of_another_width_are_refused_by_name(arch):
    narrow = tiny(arch, "causal_lm", d_model=16, d_embed=16, d_head=8)
    with torch.no_grad():
        mems = narrow(ids(), use_cache=True).mems
    model = tiny(arch, "causal_lm")
    with pytest.raises(ValueError, match="mems.* has shape .* but this model carries"):
        model(ids(), mems=mems)


def test_a_string_random_seed_is_refused_by_name():
    model = tiny("big_bird", "masked_lm")
    with pytest.raises(TypeError, match="random_seed must be an int, got 'x'"):
        model(ids(length=20), random_seed="x")


def test_out_of_range_discrete_actions_are_refused_by_name():
    model = tiny("decision_transformer", "action", action_space="discrete", action_tanh=False)
    inputs = trajectory(model)
    inputs["actions"][0, 1] = model.config.act_dim + 2
    with pytest.raises(ValueError, match=r"actions must lie in \[0, act_dim=3\)"):
        model(**inputs)
    inputs = trajectory(model)
    labels = inputs["actions"].clone()
    labels[1, 0] = 7
    with pytest.raises(ValueError, match=r"labels must lie in \[0, act_dim=3\) or -100"):
        model(**inputs, labels=labels)
