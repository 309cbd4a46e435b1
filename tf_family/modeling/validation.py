"""Input validation: the checks a value or a model input runs once, cheaply, at the edge.

One vocabulary of errors (a `TypeError` for a value of the wrong kind, a `ValueError` for a value out of range; each
names the field or argument, the value and the fix). Two kinds of check live here:

* **values**: small typed checks of one number, choice or list (`check_int`, `check_positive_int`, `check_float`,
  `check_probability`, `check_choice`, `check_activation`, `check_list_of`, `check_token_id`, `check_seed`), used by
  the configs' ``validate_architecture`` and by ``forward`` arguments alike;
* **model inputs**: checks of one tensor (`check_tensor`, `check_ids_in_range`, `check_finite`, labels, caches,
  memories), which the ``_check_*`` methods of `tf_family.modeling.pretrained.TffPreTrainedModel` run at the top of
  each ``forward`` (``input_ids`` integer, 2-D, non-empty and inside the vocabulary; masks shaped like the input;
  labels inside their classes or ``-100``; float inputs finite). Reading the extreme ids costs one ``min`` / ``max``
  per call; nothing is checked inside the layers.

Config validation (unknown keys, field types, the fields every config shares, then ``validate_architecture``) is in
`tf_family.modeling.configuration`, which uses the value checks above.

This module imports only torch, transformers and `tf_family.modeling.losses` (for `IGNORE_INDEX`; a remote-code export carries
both beside the models).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from transformers import GenerationMixin
from transformers.activations import ACT2FN

from .losses import IGNORE_INDEX

# The largest size a dimension-like config field may take: every realistic width, vocabulary, length or memory is
# far below it, and values past it overflow the index types of kernels (and the memory of any machine).
MAX_SIZE = 2**31 - 1
# Seeds go to `torch.Generator.manual_seed`, which takes a 64-bit value.
MAX_SEED = 2**63 - 1
# Inputs larger than this overflow float32 once squared and summed (a layer norm's variance): refused at the entry.
MAX_INPUT_MAGNITUDE = 1e12
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)
_FLOAT32_TINY = float(torch.finfo(torch.float32).tiny)


# -------------------------------------------------------------------------------------------------------- values
def _is_int(value: Any) -> bool:
    # bool is an int in Python; a field typed int never means True / False
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return type(value).__name__


def check_int(
    name: str, value: Any, *, minimum: int | None = None, maximum: int | None = MAX_SIZE, fix: str | None = None
) -> None:
    """``value`` is an int (not a bool) in ``[minimum, maximum]``."""
    if not _is_int(value):
        raise TypeError(f"{name} must be an int, got {value!r} ({_kind(value)}); pass a whole number.")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}; {fix or f'set {name} >= {minimum}'}.")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum}, got {value}; {fix or f'set {name} <= {maximum}'}.")


def check_positive_int(name: str, value: Any, *, maximum: int | None = MAX_SIZE, fix: str | None = None) -> None:
    """``value`` is an int >= 1."""
    check_int(name, value, minimum=1, maximum=maximum, fix=fix)


def check_nonnegative_int(name: str, value: Any, *, maximum: int | None = MAX_SIZE, fix: str | None = None) -> None:
    """``value`` is an int >= 0."""
    check_int(name, value, minimum=0, maximum=maximum, fix=fix)


def check_seed(name: str, value: Any) -> None:
    """``value`` is an int seed for a `torch.Generator`: in ``[0, 2**63)``."""
    check_int(name, value, minimum=0, maximum=MAX_SEED, fix=f"pass a non-negative int seed as {name}")


def check_float(
    name: str,
    value: Any,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    min_open: bool = False,
    max_open: bool = False,
    allow_inf: bool = False,
    fix: str | None = None,
) -> None:
    """``value`` is a real number (an int is fine, a bool is not), not NaN, finite unless ``allow_inf``, inside the
    interval ``[minimum, maximum]`` (``min_open`` / ``max_open`` exclude an end)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise TypeError(f"{name} must be a number, got {value!r} ({_kind(value)}); pass a float.")
    if math.isnan(value) or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{name} must be a finite number, got {value}; {fix or f'set {name} to a finite float'}.")
    # models compute in float32 (or lower): a value it rounds to inf or to 0 would turn into inf / NaN downstream
    if math.isfinite(value) and (abs(value) > _FLOAT32_MAX or 0 < abs(value) < _FLOAT32_TINY):
        raise ValueError(
            f"{name}={value} is outside float32's range (|x| in [{_FLOAT32_TINY:.3g}, {_FLOAT32_MAX:.3g}] or 0), "
            f"where the model computes; {fix or f'set {name} to a representable value'}."
        )
    low_bad = minimum is not None and (value <= minimum if min_open else value < minimum)
    high_bad = maximum is not None and (value >= maximum if max_open else value > maximum)
    if low_bad or high_bad:
        if maximum is None:
            rule = f"{'>' if min_open else '>='} {minimum}"
        elif minimum is None:
            rule = f"{'<' if max_open else '<='} {maximum}"
        else:
            rule = f"in {'(' if min_open else '['}{minimum}, {maximum}{')' if max_open else ']'}"
        raise ValueError(f"{name} must be {rule}, got {value}; {fix or f'set {name} inside that range'}.")


def check_probability(name: str, value: Any, *, optional: bool = False) -> None:
    """A dropout probability: a float in ``[0, 1)`` (or ``None`` when ``optional``)."""
    if optional and value is None:
        return
    check_float(name, value, minimum=0.0, maximum=1.0, max_open=True, fix=f"set {name} to a dropout rate in [0, 1)")


def check_choice(name: str, value: Any, choices: Iterable[Any]) -> None:
    """``value`` is one of ``choices``."""
    choices = list(choices)
    if isinstance(value, bool) or not any(value == choice and type(value) is type(choice) for choice in choices):
        raise ValueError(f"{name} must be one of {choices}, got {value!r}; pick one of those.")


def check_activation(name: str, value: Any) -> None:
    """``value`` names an activation of `transformers.activations.ACT2FN`."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be an activation name (str), got {value!r} ({_kind(value)}).")
    if value not in ACT2FN:
        raise ValueError(f"{name}={value!r} is not a known activation; choose one of {sorted(ACT2FN)}.")


def check_list_of(
    name: str,
    value: Any,
    check_item: Callable[[str, Any], None],
    *,
    min_length: int = 0,
    length: int | None = None,
) -> None:
    """``value`` is a list (or tuple) whose items each pass ``check_item(f"{name}[i]", item)``."""
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be a list, got {value!r} ({_kind(value)}).")
    if length is not None and len(value) != length:
        raise ValueError(f"{name} must have {length} entries, got {len(value)}: {list(value)}.")
    if len(value) < min_length:
        raise ValueError(f"{name} must have at least {min_length} entries, got {list(value)}.")
    for index, item in enumerate(value):
        check_item(f"{name}[{index}]", item)


def check_token_id(name: str, value: Any, vocab_size: int) -> None:
    """A special token id: ``None``, or an int (a list of ints for ``eos_token_id``) in ``[0, vocab_size)``."""
    if value is None:
        return
    values = value if isinstance(value, (list, tuple)) else [value]
    for item in values:
        if not _is_int(item):
            raise TypeError(f"{name} must be an int token id (or None), got {value!r}.")
        if not 0 <= item < vocab_size:
            raise ValueError(
                f"{name}={value!r} is not a token of the vocabulary [0, vocab_size={vocab_size}); set {name} to an "
                "id below vocab_size (or None)."
            )


# -------------------------------------------------------------------------------------------------- model inputs
def _tracing() -> bool:
    # under torch.compile / export, data-dependent checks would break the graph: shapes are still checked
    return torch.compiler.is_compiling()


def check_tensor(name: str, value: Any, *, integer: bool | None = None, dim: int | tuple[int, ...] | None = None):
    """``value`` is a tensor of the right kind (``integer=True``: an integer dtype, not bool; ``False``: floating) and
    number of dimensions."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {_kind(value)}.")
    if integer is True and (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool):
        raise TypeError(
            f"{name} must hold integer ids (torch.long), got dtype {value.dtype}; convert with {name}.long() if the "
            "values are whole numbers."
        )
    if integer is False and not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}; convert with .float().")
    dims = (dim,) if isinstance(dim, int) else dim
    if dims is not None and value.dim() not in dims:
        expected = " or ".join(f"{d}-D" for d in dims)
        raise ValueError(f"{name} must be {expected}, got shape {tuple(value.shape)}.")


def check_ids_in_range(name: str, ids: torch.Tensor, high: int, *, what: str = "vocab_size", ignore_index=None):
    """Every entry of the integer tensor ``ids`` lies in ``[0, high)`` (or equals ``ignore_index``): one min / max."""
    if ids.numel() == 0 or _tracing():
        return
    values = ids if ignore_index is None else ids[ids != ignore_index]
    if values.numel() == 0:
        return
    low, top = int(values.min()), int(values.max())
    if low < 0 or top >= high:
        ignored = f" or {ignore_index} (ignored)" if ignore_index is not None else ""
        raise ValueError(
            f"{name} must lie in [0, {what}={high}){ignored}, got values in [{low}, {top}]; ids outside the "
            f"{'vocabulary' if what == 'vocab_size' else 'range'} have no meaning here: fix the tokenizer or {name}."
        )


def check_finite(name: str, value: torch.Tensor, max_abs: float | None = MAX_INPUT_MAGNITUDE) -> None:
    """A float input holds no NaN or infinity, and no value beyond ``max_abs`` (one pass; a NaN spreads through
    attention, and a value past ~1e19 overflows float32 inside a layer norm's variance)."""
    if not value.is_floating_point() or _tracing() or value.numel() == 0:
        return
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} holds NaN or infinite values; clean them (e.g. torch.nan_to_num) before the call.")
    if max_abs is not None and float(value.abs().max()) > max_abs:
        raise ValueError(
            f"{name} holds values up to {float(value.abs().max()):.3g}, beyond {max_abs:.0e} where float32 arithmetic "
            "in the layers overflows; rescale them (normalise the features)."
        )


def _check_long(name: str, value: torch.Tensor) -> None:
    # what torch's cross-entropy takes as targets
    if value.dtype != torch.long:
        raise TypeError(f"{name} must be torch.long (int64) ids, got dtype {value.dtype}; convert with {name}.long().")


def check_class_labels(name: str, labels: Any, num_classes: int, shape: tuple[int, ...], what: str) -> None:
    """Class-id labels (``torch.long``) of exactly ``shape``, each in ``[0, num_classes)`` or ``-100`` (ignored)."""
    check_tensor(name, labels, integer=True)
    _check_long(name, labels)
    if tuple(labels.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(labels.shape)}.")
    check_ids_in_range(name, labels, num_classes, what=what, ignore_index=IGNORE_INDEX)


def check_memory_states(name: str, states: Sequence[torch.Tensor], width: int, *, heads: int | None = None) -> None:
    """Carried per-layer states (a memory passed back in) have the model's width: ``(B, M, width)``, or
    ``(B, heads, N, width)`` with ``heads``; a memory from another model would otherwise fail deep in a layer."""
    for layer, state in enumerate(states):
        if heads is None:
            wrong = state.dim() != 3 or state.shape[-1] != width
        else:
            wrong = state.dim() != 4 or (state.shape[1], state.shape[-1]) != (heads, width)
        if wrong:
            shape = f"(B, {heads}, N, {width})" if heads is not None else f"(B, M, {width})"
            raise ValueError(
                f"{name} layer {layer} has shape {tuple(state.shape)} but this model carries {shape}: it was made by "
                f"a model of another width; pass the {name} this model returned, or None to start a new stream."
            )


def check_sequence_labels(labels: Any, batch: int, num_labels: int, problem_type: str | None) -> None:
    """Sequence-classification labels: ``(B,)`` class ids in ``[0, num_labels)``, or finite floats (regression
    ``(B,)`` / ``(B, 1)``, multi-label ``(B, num_labels)``)."""
    check_tensor("labels", labels)
    if labels.is_floating_point():
        regression = num_labels == 1 or problem_type == "regression"
        shapes = ((batch,), (batch, 1)) if regression and num_labels == 1 else ((batch, num_labels),)
        if problem_type == "single_label_classification":
            raise TypeError(f"single-label classification takes integer class ids as labels, got {labels.dtype}.")
        if tuple(labels.shape) not in shapes:
            what = "regression targets" if regression else f"multi-label targets (one column per label, {num_labels})"
            raise ValueError(f"labels as {what} must have shape {shapes[0]}, got {tuple(labels.shape)}.")
        check_finite("labels", labels)
        return
    check_tensor("labels", labels, integer=True)
    if num_labels == 1 or problem_type == "regression":
        if tuple(labels.shape) not in ((batch,), (batch, 1)):
            raise ValueError(f"regression labels must have shape ({batch},), got {tuple(labels.shape)}.")
        return
    if problem_type == "multi_label_classification":
        if tuple(labels.shape) != (batch, num_labels):
            raise ValueError(f"multi-label labels must have shape ({batch}, {num_labels}), got {tuple(labels.shape)}.")
        return
    if tuple(labels.shape) == (batch, 1):
        labels = labels.view(-1)
    check_class_labels("labels", labels, num_labels, (batch,), "num_labels")


def check_span_positions(start_positions: Any, end_positions: Any, batch: int) -> None:
    """Question-answering targets: integer token indices ``(B,)``, >= 0 (indices past the input are ignored)."""
    for name, positions in (("start_positions", start_positions), ("end_positions", end_positions)):
        check_tensor(name, positions, integer=True)
        _check_long(name, positions)
        if positions.numel() != batch:
            raise ValueError(f"{name} must have one index per row, shape ({batch},), got {tuple(positions.shape)}.")
        if positions.numel() and not _tracing() and int(positions.min()) < 0:
            raise ValueError(
                f"{name} must be token indices >= 0, got {positions.tolist()}; an index past the input marks a row "
                "without an answer."
            )


def check_cache(
    cache: Any, batch: int, heads: int | None = None, head_dim: int | None = None, cache_type: type | None = None
) -> None:
    """A key/value cache passed in: a ``cache_type`` (default `transformers.Cache`) whose filled layers hold
    ``(B, heads, S, head_dim)`` keys of this input's batch and this model's shape (``None``: not checked)."""
    if cache is None:
        return
    if cache_type is None:
        from transformers import Cache as cache_type
    if not isinstance(cache, cache_type):
        raise TypeError(
            f"cache (past_key_values) must be a {cache_type.__name__}, got {type(cache).__name__}; pass the cache a previous "
            "call returned, or None."
        )
    layers = getattr(cache, "layers", ())
    keys = next((layer.keys for layer in layers if isinstance(getattr(layer, "keys", None), torch.Tensor)), None)
    if keys is None or keys.dim() != 4 or not keys.numel():
        return
    heads = keys.shape[1] if heads is None else heads
    head_dim = keys.shape[-1] if head_dim is None else head_dim
    if (keys.shape[0], keys.shape[1], keys.shape[-1]) != (batch, heads, head_dim):
        raise ValueError(
            f"cache (past_key_values) holds keys of shape {tuple(keys.shape)} but this input and model need (B, heads, S, "
            f"head_dim) = ({batch}, {heads}, S, {head_dim}); pass the cache returned for this batch by this model, "
            "or None."
        )


def refuse_key_value_cache(name: str, value: Any, model: str, state: str) -> None:
    """A `transformers.Cache` (keys and values per layer: a generation cache, or the learned prefix PEFT prefix
    tuning passes) given to a model that carries other ``state`` between calls: a TypeError naming what to use."""
    from transformers import Cache

    if isinstance(value, Cache):
        raise TypeError(
            f"{name} got a {type(value).__name__} (keys and values per layer: a generation cache of another model, or "
            f"the learned prefix of PEFT prefix tuning), but {model} carries {state} between calls, not keys and "
            "values. With PEFT, adapt it with prompt tuning (PromptTuningConfig: learned input tokens), LoRA / DoRA "
            "(LoraConfig) or IA3 (IA3Config) instead of prefix tuning."
        )


class ValidatedGenerationMixin(GenerationMixin):
    """transformers' `GenerationMixin` whose `generate` first checks the prompt as `forward` would (integer, 2-D,
    non-empty, inside the vocabulary, with a mask of the same shape): some malformed prompts otherwise fail inside
    transformers before the first forward, with an error that does not name them. Listed by every tf_family model
    that generates, in place of `GenerationMixin`; the model's own arguments (CALM's ``exit_layer``, Reformer's
    ``num_hashes``, kNN-LM's ``k`` …) reach its ``forward``, which checks them."""

    def generate(self, inputs: torch.Tensor | None = None, *args, **kwargs):
        prompt = inputs if inputs is not None else kwargs.get("input_ids")
        if prompt is not None:  # (the model's checks: it is a TffPreTrainedModel)
            vocab_size = self.config.vocab_size
            batch, length = self._check_token_inputs(prompt, None, vocab_size=vocab_size)
            self._check_mask("attention_mask", kwargs.get("attention_mask"), batch, length)
        return super().generate(inputs, *args, **kwargs)


__all__ = [
    "MAX_INPUT_MAGNITUDE",
    "MAX_SEED",
    "MAX_SIZE",
    "ValidatedGenerationMixin",
    "check_activation",
    "check_cache",
    "check_choice",
    "check_class_labels",
    "check_finite",
    "check_float",
    "check_ids_in_range",
    "check_int",
    "check_list_of",
    "check_memory_states",
    "check_nonnegative_int",
    "check_positive_int",
    "check_probability",
    "check_seed",
    "check_span_positions",
    "check_sequence_labels",
    "check_tensor",
    "check_token_id",
    "refuse_key_value_cache",
]
