"""Fuzzing the forward / generate inputs of every task class of every architecture (the registry).

Each example starts from sound inputs (`tests.fuzz.tasks.valid_inputs`) and breaks one argument: its dtype (float
ids, bool, int32, float64), its shape (a dimension dropped or added, an empty batch or sequence, another batch or
length), its values (ids past the vocabulary, negative, NaN / inf, huge) or its kind (a list, a string), or replaces
a carried state (``mems``, ``cache``) with one of another batch or width, or garbage. An input ends in a
clear ``ValueError`` / ``TypeError`` naming the argument (or, for a shape mismatch, the argument it must match), or is
accepted with finite outputs of the right shape (`tests.fuzz.tasks.check_outputs`). `generate` (every model that
generates) and the Decision Transformer's `get_action` are fuzzed the same way. Models are built once per module.
"""

from __future__ import annotations

import functools
import inspect
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.outcomes import expect_clear_error_or_ok
from tests.fuzz.tasks import GENERATING, TASK_CLASSES, check_outputs, valid_inputs
from tf_family.models.knn_lm import _TINY_LLAMA
from tf_family.registry import ARCHITECTURES

BATCH, LENGTH = 2, 12
TENSOR_MUTATIONS = [
    "float", "bool", "int32", "float64", "drop_dim", "add_dim", "zero_batch", "zero_length", "other_batch",
    "other_length", "too_high", "negative", "nan", "inf", "huge", "list", "string", "ignore_all",
]  # fmt: skip
SCALARS = [-1, 0, 1, 2, 3, 10**6, 2**70, 1.5, math.nan, "x", True, [1]]
# arguments some models take beyond the common ones (scalars, or tensors built by `_extra_tensor`)
EXTRA_SCALARS = {
    "big_bird": ["random_seed"],
    "reformer": ["num_hashes", "hash_seed"],
    "calm": ["exit_layer"],
    "knn_lm": ["k"],
}
# a shape mismatch is named from either side: the argument broken, or one it must match
SHAPE_PARTNERS = [
    "input_ids", "attention_mask", "labels", "states", "inputs_embeds", "input", "token_type_ids", "position_ids",
    "global_attention_mask", "returns_to_go", "actions", "timesteps",
]  # fmt: skip


@functools.cache
def model(arch: str, task: str):
    torch.manual_seed(0)
    return ARCHITECTURES[arch].model_classes[task](ARCHITECTURES[arch].tiny_config(task=task)).eval()


# the overrides that build an architecture at another width (for those that carry a memory or a cache between calls,
# whose state then no longer fits), keyed by registry name: an architecture that carries state must have its entry
OTHER_WIDTH = {
    "transfo_xl": {"d_model": 16, "d_embed": 16, "d_head": 8},
    "compressive": {"d_model": 16, "d_embed": 16, "d_head": 8},
    "memorizing": {"d_model": 16, "d_embed": 16, "d_head": 8},
    "calm": {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2},
    "longformer": {"hidden_size": 16},
    "reformer": {"hidden_size": 16, "axial_pos_embds_dim": [8, 8], "attention_head_size": 8},
    "knn_lm": {"base_config": {**_TINY_LLAMA, "hidden_size": 16}},
}


@functools.cache
def other_width_model(arch: str, task: str):
    """The same architecture at another width (its memories / caches do not fit the first)."""
    spec = ARCHITECTURES[arch]
    if arch not in OTHER_WIDTH:
        raise KeyError(f"{arch} carries a memory or cache: add the overrides of a narrower {arch} to OTHER_WIDTH")
    torch.manual_seed(0)
    return spec.model_classes[task](spec.tiny_config(task=task, **OTHER_WIDTH[arch])).eval()


def _mutate(value: torch.Tensor, kind: str, high: int):
    """``value`` broken in one way (``high``: the first invalid id of an integer argument)."""
    flat = value.clone().reshape(-1)
    if kind == "float":
        return value.float() + (0.5 if not value.is_floating_point() else 0.0)
    if kind == "bool":
        return value.bool()
    if kind == "int32":
        return value.int() if not value.is_floating_point() else value
    if kind == "float64":
        return value.double()
    if kind == "drop_dim":
        return value.reshape(-1)
    if kind == "add_dim":
        return value[None]
    if kind == "zero_batch":
        return value[:0]
    if kind == "zero_length":
        return value[:, :0] if value.dim() >= 2 else value[:0]
    if kind == "other_batch":
        return torch.cat([value, value[:1]])
    if kind == "other_length":
        return value[:, :-1] if value.dim() >= 2 else value[:-1]
    if flat.numel() == 0:
        return value
    if kind == "too_high":
        flat[-1] = high + 3 if not value.is_floating_point() else 1e6
    elif kind == "negative":
        flat[0] = -7
    elif kind == "nan":
        return value.float().reshape(-1).index_fill(0, torch.tensor([0]), math.nan).view_as(value)
    elif kind == "inf":
        return value.float().reshape(-1).index_fill(0, torch.tensor([0]), math.inf).view_as(value)
    elif kind == "huge":
        flat.fill_(2**40 if not value.is_floating_point() else 1e30)
    elif kind == "list":
        return value.tolist()
    elif kind == "string":
        return "x"
    elif kind == "ignore_all":
        flat.fill_(-100)
    return flat.view_as(value)


def _upper_bound(arch: str, task: str, name: str, config) -> int:
    if name in ("input_ids", "exit_targets") or (name == "labels" and task in ("causal_lm", "masked_lm")):
        return config.vocab_size
    if name == "labels" and task == "multiple_choice":
        return 2
    if name == "labels" and task == "action":
        return config.act_dim
    if name == "labels":
        return config.num_labels
    if name == "timesteps":
        return config.max_ep_len
    if name == "actions":
        return config.act_dim
    if name in ("start_positions", "end_positions"):
        return LENGTH
    if name == "token_type_ids":
        return config.type_vocab_size
    if name == "position_ids":
        return getattr(config, "max_positions", None) or config.max_position_embeddings
    return 2


def _extra_tensors(arch: str, task: str, inputs: dict) -> dict:
    """Further tensor arguments a model takes, with sound values to break."""
    signature = inspect.signature(model(arch, task).forward).parameters
    extras = {}
    if "input_ids" in inputs and task != "multiple_choice":
        batch, length = inputs["input_ids"].shape
        if arch in ("longformer", "big_bird"):
            extras["token_type_ids"] = torch.zeros(batch, length, dtype=torch.long)
        if arch in ("longformer", "big_bird", "reformer", "calm"):
            extras["position_ids"] = torch.arange(length).expand(batch, length).clone()
            if arch == "longformer":
                extras["position_ids"] = extras["position_ids"] + 2
        if "global_attention_mask" in signature or arch == "longformer":
            extras["global_attention_mask"] = torch.zeros(batch, length, dtype=torch.long)
        if "reset_mems" in signature:
            extras["reset_mems"] = torch.zeros(batch, dtype=torch.bool)
        if arch == "calm" and task == "causal_lm":
            extras["exit_targets"] = inputs["input_ids"].clone()
        if arch == "big_bird" and task == "question_answering":
            extras["question_lengths"] = torch.ones(batch, dtype=torch.long)
    return extras


def _carried_state(arch: str, task: str, kind: str, inputs: dict):
    """A memory / cache for ``inputs``: ``kind`` = "other_batch", "other_width" or "garbage"."""
    name = "mems" if ARCHITECTURES[arch].memory_model else "cache"
    if kind == "garbage":
        return name, [torch.zeros(2, 3)] if name == "mems" else ("x", 1)
    source = model(arch, task) if kind == "other_batch" else other_width_model(arch, task)
    ids = inputs["input_ids"]
    ids = torch.cat([ids, ids[:1]]) if kind == "other_batch" else ids
    use_cache = {"use_cache": True} if name == "cache" else {}
    with torch.no_grad():
        output = source(input_ids=ids % source.config.vocab_size, **use_cache)
    state = output.get("mems") if name == "mems" else output.get("cache")
    return name, state


def _budget(examples: int) -> int:
    """``examples`` in the CI profile (its budget caps it), the profile's own budget in deeper runs."""
    default = settings.default.max_examples
    return min(examples, default) if default <= 20 else default


def _has_carried_state(arch: str, task: str) -> bool:
    spec = ARCHITECTURES[arch]
    if spec.memory_model:
        return True
    return arch in ("calm", "reformer", "longformer", "knn_lm") and task == "causal_lm"


@pytest.mark.parametrize("arch, task", TASK_CLASSES, ids=[f"{a}-{t}" for a, t in TASK_CLASSES])
@settings(max_examples=_budget(4))
@given(data=st.data())
def test_forward_inputs(arch, task, data):
    net = model(arch, task)
    config = net.config
    inputs = valid_inputs(arch, task, config, BATCH, LENGTH)
    inputs.update(_extra_tensors(arch, task, inputs))
    targets = [*sorted(inputs), *EXTRA_SCALARS.get(arch, [])]
    if "input_ids" in inputs:
        targets.append("inputs_embeds")
    if _has_carried_state(arch, task):
        targets.append("carried_state")
    target = data.draw(st.sampled_from(targets), label="argument")
    names, ignored = [target], False
    if target in EXTRA_SCALARS.get(arch, []):
        inputs[target] = data.draw(st.sampled_from(SCALARS), label="value")
    elif target == "inputs_embeds":
        ids = inputs.pop("input_ids")
        width = config.d_model if hasattr(config, "d_model") else config.hidden_size
        embeds = torch.randn(*ids.shape, width)
        kind = data.draw(st.sampled_from(["sound", "nan", "float64", "drop_dim", "other_width", "int"]), label="kind")
        inputs["inputs_embeds"] = {
            "sound": embeds,
            "nan": embeds.index_fill(-1, torch.tensor([0]), math.nan),
            "float64": embeds.double(),
            "drop_dim": embeds[..., 0],
            "other_width": embeds[..., :-1],
            "int": embeds.long(),
        }[kind]
    elif target == "carried_state":
        kind = data.draw(st.sampled_from(["other_batch", "other_width", "garbage"]), label="state")
        name, state = _carried_state(arch, task, kind, inputs)
        inputs[name] = state
        names = [name, "mems", "cache", "past_key_values"]
        if name == "cache":
            inputs["use_cache"] = True
    else:
        kind = data.draw(st.sampled_from(TENSOR_MUTATIONS), label="mutation")
        inputs[target] = _mutate(inputs[target], kind, _upper_bound(arch, task, target, config))
        # every label ignored (-100, or answer positions past the input): the mean loss is 0 / 0
        ignored = (kind == "ignore_all" and "label" in target) or (
            target.endswith("_positions") and kind in ("too_high", "huge")
        )
        if kind.startswith(("other_", "zero_", "drop_", "add_")):
            names = [target, *SHAPE_PARTNERS]
    length = None if task in ("sequence_classification", "multiple_choice", "action") else LENGTH
    if length is not None and isinstance(inputs.get("input_ids"), torch.Tensor) and inputs["input_ids"].dim() == 2:
        length = inputs["input_ids"].shape[1]  # memory models accept an input shorter than their mask
    with torch.no_grad():
        expect_clear_error_or_ok(
            lambda: net(**inputs),
            suite="inputs",
            names=names,
            check=lambda output: check_outputs(task, output, BATCH, length, loss_may_be_nan=ignored),
            describe=f"{arch}/{task} forward, {target} broken",
        )


def _check_sequences(config, batch: int, prompt_length: int):
    def check(sequences) -> bool:
        return (
            sequences.shape[0] == batch
            and prompt_length < sequences.shape[1] <= prompt_length + 2
            and not sequences.is_floating_point()
            and int(sequences.min()) >= 0
            and int(sequences.max()) < config.vocab_size
        )

    return check


@pytest.mark.parametrize("arch, task", GENERATING, ids=[f"{a}-{t}" for a, t in GENERATING])
@settings(max_examples=_budget(4))
@given(data=st.data())
def test_generate_inputs(arch, task, data):
    net = model(arch, task)
    config = net.config
    inputs = valid_inputs(arch, task, config, BATCH, 5, labels=False)
    targets = ["input_ids", "attention_mask", *EXTRA_SCALARS.get(arch, [])]
    target = data.draw(st.sampled_from(targets), label="argument")
    names = [target]
    if target in EXTRA_SCALARS.get(arch, []):
        inputs[target] = data.draw(st.sampled_from(SCALARS), label="value")
    else:
        kind = data.draw(st.sampled_from([k for k in TENSOR_MUTATIONS if k != "ignore_all"]), label="mutation")
        inputs[target] = _mutate(inputs[target], kind, config.vocab_size)
        if kind.startswith(("other_", "zero_", "drop_", "add_")):
            names = [target, *SHAPE_PARTNERS]
    prompt = inputs.pop("input_ids")
    expect_clear_error_or_ok(
        lambda: net.generate(
            prompt, max_new_tokens=2, do_sample=False, pad_token_id=config.pad_token_id or 0, **inputs
        ),
        suite="inputs",
        names=names,
        check=_check_sequences(config, BATCH, 5),
        describe=f"{arch}/{task} generate, {target} broken",
    )


@settings(max_examples=_budget(8))
@given(data=st.data())
def test_get_action_inputs(data):
    net = model("decision_transformer", "action")
    config = net.config
    inputs = valid_inputs("decision_transformer", "action", config, BATCH, 5, labels=False)
    inputs.pop("attention_mask")
    target = data.draw(st.sampled_from(sorted(inputs)), label="argument")
    kind = data.draw(st.sampled_from(TENSOR_MUTATIONS), label="mutation")
    inputs[target] = _mutate(inputs[target], kind, _upper_bound("decision_transformer", "action", target, config))
    names = [target, *SHAPE_PARTNERS] if kind.startswith(("other_", "zero_", "drop_", "add_")) else [target]

    def check(action) -> bool:
        if config.discrete:
            return action.shape == (BATCH,) and int(action.min()) >= 0 and int(action.max()) < config.act_dim
        return action.shape == (BATCH, config.act_dim) and bool(torch.isfinite(action).all())

    expect_clear_error_or_ok(
        lambda: net.get_action(**inputs),
        suite="inputs",
        names=[*names, "steps", "timesteps"] if target == "timesteps" else names,
        check=check,
        describe=f"decision_transformer get_action, {target} broken ({kind})",
    )
