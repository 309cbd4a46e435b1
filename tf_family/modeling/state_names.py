"""The names of the state a model carries from one call to the next, and their aliases, declared here once.

One state, one name:

- **Transformer-XL family** (models with a ``carried_state``: Transformer-XL, Compressive, Memorizing, SPALM): the
  memory is ``mems``: the ``forward`` argument, the output field, and, inside `generate`, the key under which the
  memory travels from one step to the next (`MEMORY_NAME`). It is transformers 4.x's ``TransfoXLModel`` name, and
  transformers 5's own segment-memory model (XLNet) keeps it the same way: ``mems`` in and out, and in `generate`'s
  model kwargs (its ``DEPRECATED_CACHE_NAMES`` list it, so beam search and ``return_dict_in_generate`` find it).
  The memory is not a key/value cache (it holds hidden states, and `tf_family.memory` objects, not a
  `transformers.Cache`), so it does not take the cache's name.
- **Key/value-cache models** (every other causal LM): the `transformers.Cache` is ``cache`` (`CACHE_NAME`,
  transformers 5.24's name).

Aliases, only where a caller outside needs them:

- ``past_key_values`` for ``cache`` (`accepts_past_key_values`): the name before transformers 5.24. It stays: PEFT's
  prompt learning reads and replaces the cache under that key in the prepared generation inputs
  (`GENERATION_CACHE_KEY`), and callers written for transformers 4.x / early 5.x pass it.
- ``cache`` and ``past_key_values`` for ``mems`` (`memory_from_aliases`): the Transformer-XL family took both until
  this release; they still work, with a `FutureWarning`, and will be refused in the next one. (A `transformers.Cache`
  passed under either name, as PEFT's prefix tuning does, reaches the model's own refusal, which says what to use.)

`state_argument_name` says which name a model takes, for code that feeds any causal LM (the kNN-LM over its base).
"""

from __future__ import annotations

import functools
import warnings
from typing import Any

# the Transformer-XL family's memory: forward argument, output field, generation model-kwargs key
MEMORY_NAME = "mems"
# a key/value-cache model's `transformers.Cache` (transformers 5.24's name)
CACHE_NAME = "cache"
# The key under which a `prepare_inputs_for_generation` hands a key/value cache to ``forward`` (which takes either
# name, see `accepts_past_key_values`). transformers 5.24 renamed the argument ``cache``, but PEFT's prompt learning
# (peft 0.21, `PeftModelForCausalLM.prepare_inputs_for_generation`) reads and replaces ``past_key_values`` in the
# prepared inputs: a cache under ``cache`` is invisible to it, so it injects its prefix again on every step.
GENERATION_CACHE_KEY = "past_key_values"
# the names the Transformer-XL family took for ``mems`` until now, accepted with a FutureWarning for one release
_DEPRECATED_MEMORY_NAMES = ("cache", "past_key_values")


def state_argument_name(model: Any) -> str:
    """The ``forward`` argument (and output field) that carries ``model``'s state between calls: `MEMORY_NAME` for a
    model with a ``carried_state`` (the Transformer-XL family), `CACHE_NAME` for any other (a key/value cache)."""
    return MEMORY_NAME if getattr(model, "carried_state", None) is not None else CACHE_NAME


def accepts_past_key_values(function):
    """Let a ``forward`` or ``prepare_inputs_for_generation`` that takes the key/value cache as ``cache`` (its name
    since transformers 5.24) also take it under its older name ``past_key_values``, as PEFT's prompt learning and
    callers written for earlier transformers releases pass it. Passing both is a ValueError."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if "past_key_values" in kwargs:
            old = kwargs.pop("past_key_values")
            if kwargs.get("cache") is not None and old is not None and kwargs["cache"] is not old:
                raise ValueError(
                    "Got both `cache` and `past_key_values`: they are the same argument (`past_key_values` is the "
                    "name transformers used before 5.24). Pass the cache once, as `cache`."
                )
            if kwargs.get("cache") is None:
                kwargs["cache"] = old
        return function(*args, **kwargs)

    return wrapper


def memory_from_aliases(mems: Any, kwargs: dict, model_name: str) -> Any:
    """``mems``, or the memory a caller passed under a name the Transformer-XL family took until this release
    (``cache``, ``past_key_values``), popped from ``kwargs`` (a ``forward``'s ``**kwargs``) with a `FutureWarning`.
    Two different memories under two names are a ValueError naming them."""
    from transformers import Cache

    given = {name: kwargs.pop(name) for name in _DEPRECATED_MEMORY_NAMES if name in kwargs}
    given = {name: value for name, value in given.items() if value is not None}
    if not given:
        return mems
    for name, value in given.items():
        if mems is not None and value is not mems:
            raise ValueError(
                f"{model_name} got both `mems` and `{name}`: they are the same argument (the memory, named `mems`). "
                "Pass the memory once, as `mems`."
            )
        if not isinstance(value, Cache):  # a key/value cache (PEFT prefix tuning) is refused by the model itself
            warnings.warn(
                f"{model_name}: passing the memory as `{name}` is deprecated and will be refused in the next release; "
                "pass it as `mems` (the name of the argument and of the output field).",
                FutureWarning,
                stacklevel=3,
            )
        mems = value
    return mems


__all__ = [
    "CACHE_NAME",
    "GENERATION_CACHE_KEY",
    "MEMORY_NAME",
    "accepts_past_key_values",
    "memory_from_aliases",
    "state_argument_name",
]
