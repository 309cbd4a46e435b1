"""Fuzzing every architecture's config class: each field drawn from wrong types, NaN / inf, negatives, zero, huge
values and inconsistent combinations (one to three fields at a time, on top of the tiny variant).

An input ends either in a clear ``ValueError`` / ``TypeError`` naming one of the fields it set, or in a config
whose model builds and runs: a forward pass (with labels) of a randomly drawn task with finite outputs of the right
shape. Configs too big to run here (more than `PARAMETER_BUDGET` parameters, a drawn size above `RUN_SIZE_LIMIT`,
or more than `RUN_LAYER_LIMIT` layers) are built on the meta device only (every parameter shape consistent).
"""

from __future__ import annotations

import inspect
import math
import typing

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.outcomes import expect_clear_error_or_ok
from tests.fuzz.tasks import check_outputs, valid_inputs
from tf_family.registry import ARCHITECTURES

PARAMETER_BUDGET = 2_000_000
RUN_SIZE_LIMIT = 4096
RUN_LAYER_LIMIT = 16
BATCH, LENGTH = 2, 12

INTS = [-(2**63), -(10**6), -1, 0, 1, 2, 3, 4, 5, 8, 16, 33, 64, 4097, 2**20, 2**31 - 1, 2**31, 2**63, 10**30]
FLOATS = [
    math.nan, math.inf, -math.inf, -1.0, -1e-3, 0.0, 1e-12, 1e-3, 0.5, 0.999, 1.0, 2.0, 10.0, 1e4, -1e4, 1e39,
    1e300, -1e300, 1e-300,
]  # fmt: skip
WRONG_KINDS = [None, True, False, "x", "", "relu", "lsh", "llama", [], [1, 2], [0.5, 0.5], ["a"], {}, {"a": 1}, (1, 2)]


def _fields(config_class) -> dict[str, typing.Any]:
    """The fields a tf_family config declares (name -> annotation), its parents' included."""
    fields = {}
    for cls in reversed(config_class.__mro__):
        if cls.__module__.startswith("tf_family"):
            for name, annotation in inspect.get_annotations(cls, eval_str=True).items():
                if not name.startswith("_") and typing.get_origin(annotation) is not typing.ClassVar:
                    fields[name] = annotation
    return fields


def _literals(annotation) -> list:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [value for arg in typing.get_args(annotation) for value in _literals(arg)]


def _values(annotation, tiny_value) -> st.SearchStrategy:
    """A field's fuzz values: any kind, with the kinds near its own weighted in."""
    plausible = [tiny_value, *_literals(annotation)]
    return st.one_of(
        st.sampled_from(plausible),
        st.sampled_from(INTS),
        st.integers(-5, 100),
        st.sampled_from(FLOATS),
        st.floats(-1e4, 1e4),
        st.sampled_from(WRONG_KINDS),
        st.lists(st.one_of(st.sampled_from(INTS[:12]), st.sampled_from(["lsh", "local", "x"])), max_size=4),
        st.lists(st.sampled_from(FLOATS), min_size=1, max_size=6),
    )


def _drawn_sizes(value) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [size for item in value for size in _drawn_sizes(item)]
    return []


def build_and_run(arch: str, task: str, overrides: dict):
    """The call under test: config, model, forward. Returns the outputs, or ``"meta"`` for a config only built on
    the meta device (too large to run here)."""
    spec = ARCHITECTURES[arch]
    config = spec.tiny_config(task=task, **overrides)
    model_class = spec.model_classes[task]
    with torch.device("meta"):
        meta_model = model_class(config)
    parameters = sum(parameter.numel() for parameter in meta_model.parameters())
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 1)
    sizes = [size for value in overrides.values() for size in _drawn_sizes(value)]
    if parameters > PARAMETER_BUDGET or layers > RUN_LAYER_LIMIT or any(size > RUN_SIZE_LIMIT for size in sizes):
        return "meta"
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        return model(**valid_inputs(arch, task, config, BATCH, LENGTH))


def _checker(task: str):
    def check(result) -> bool:
        if isinstance(result, str):
            return result == "meta"
        length = None if task in ("sequence_classification", "multiple_choice") else LENGTH
        if task == "action":
            length = None
        return check_outputs(task, result, BATCH, length)

    return check


def _budget(examples: int) -> int:
    """``examples`` in the CI profile (its budget is the cap), the profile's own budget in deeper runs."""
    return min(examples, settings.default.max_examples) if settings.default.max_examples <= 20 else None


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
@settings(max_examples=_budget(8) or settings.default.max_examples)
@given(data=st.data())
def test_config_fields(arch, data):
    spec = ARCHITECTURES[arch]
    tiny = spec.tiny_config()
    fields = _fields(spec.config_class)
    names = data.draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True), label="fields")
    overrides = {name: data.draw(_values(fields[name], getattr(tiny, name, None)), label=name) for name in names}
    task = data.draw(st.sampled_from(list(spec.tasks)), label="task")
    # a clear error names a field it set (or a field spelled through the config's attribute_map)
    aliases = [alias for alias, target in getattr(spec.config_class, "attribute_map", {}).items() if target in names]
    expect_clear_error_or_ok(
        lambda: build_and_run(arch, task, overrides),
        suite="configs",
        names=[*names, *aliases],
        check=_checker(task),
        describe=f"{arch}/{task} config {overrides!r}",
    )
