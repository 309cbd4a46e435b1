"""The state a causal LM carries has one name (`tf_family.modeling.state_names`): ``cache`` for a key/value cache
(``past_key_values``, the name before transformers 5.24, still works), ``mems`` for the Transformer-XL family's
memory (``cache`` and ``past_key_values``, its names until this release, work with a FutureWarning)."""

import copy
import inspect
import warnings

import pytest
import torch

from tf_family.modeling.state_names import accepts_past_key_values, memory_from_aliases, state_argument_name
from tf_family.registry import ARCHITECTURES

from .common.tester import build, make_inputs

CAUSAL = [name for name, spec in ARCHITECTURES.items() if "causal_lm" in spec.model_classes]
MEMORY = [
    name
    for name in CAUSAL
    if "mems" in inspect.signature(ARCHITECTURES[name].model_classes["causal_lm"].forward).parameters
]


@pytest.mark.parametrize("arch", CAUSAL)
def test_the_old_state_names_give_the_same_step(arch):
    spec = ARCHITECTURES[arch]
    model = build(spec, "causal_lm")
    name = state_argument_name(model)
    ids = make_inputs(spec, model.config, "causal_lm", batch=2, length=5)["input_ids"]
    with torch.no_grad():
        state = model(input_ids=ids[:, :4], use_cache=True)[name]
        assert state is not None
        new = model(input_ids=ids[:, 4:], use_cache=True, **{name: copy.deepcopy(state)})
        fresh = model(input_ids=ids[:, 4:], use_cache=True)
        if name == "cache":  # the key/value cache's older name, accepted silently (PEFT passes it)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                olds = [model(input_ids=ids[:, 4:], past_key_values=copy.deepcopy(state), use_cache=True)]
        else:  # the memory's former names, deprecated
            olds = []
            for old_name in ("cache", "past_key_values"):
                with pytest.warns(FutureWarning, match=f"passing the memory as `{old_name}` is deprecated"):
                    olds.append(model(input_ids=ids[:, 4:], use_cache=True, **{old_name: copy.deepcopy(state)}))
    for old in olds:
        torch.testing.assert_close(old.logits, new.logits, rtol=0, atol=0)
    assert not torch.allclose(new.logits, fresh.logits), "the step did not read the state"
    other = "past_key_values" if name == "cache" else "cache"
    with pytest.raises(ValueError, match="same argument"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        model(input_ids=ids[:, 4:], **{name: copy.deepcopy(state), other: copy.deepcopy(state)})


def test_the_renaming_decorator():
    @accepts_past_key_values
    def forward(input_ids=None, cache=None):
        return cache

    marker = object()
    assert forward(cache=marker) is marker
    assert forward(past_key_values=marker) is marker
    assert forward(cache=marker, past_key_values=marker) is marker  # the same object twice is harmless
    assert forward(cache=None, past_key_values=marker) is marker
    assert forward() is None
    with pytest.raises(ValueError, match="same argument"):
        forward(cache=marker, past_key_values=object())


def test_the_memory_aliases():
    marker = object()
    assert memory_from_aliases(marker, {}, "M") is marker
    kwargs = {"cache": None, "other": 1}
    assert memory_from_aliases(None, kwargs, "M") is None
    assert kwargs == {"other": 1}, "the aliases are popped from the forward's kwargs"
    for name in ("cache", "past_key_values"):
        with pytest.warns(FutureWarning, match=f"M: passing the memory as `{name}`"):
            assert memory_from_aliases(None, {name: marker}, "M") is marker
        with pytest.warns(FutureWarning):
            assert memory_from_aliases(marker, {name: marker}, "M") is marker  # the same object twice is harmless
        with pytest.raises(ValueError, match=f"M got both `mems` and `{name}`"):
            memory_from_aliases(marker, {name: object()}, "M")


@pytest.mark.parametrize("arch", MEMORY)
def test_generate_refuses_a_memory_under_an_old_name(arch):
    spec = ARCHITECTURES[arch]
    model = build(spec, "causal_lm").eval()
    ids = make_inputs(spec, model.config, "causal_lm", batch=2, length=6)["input_ids"]
    with torch.no_grad():
        memory = model(input_ids=ids[:, :4], use_cache=True).mems
    settings = {"max_new_tokens": 1, "do_sample": False, "pad_token_id": 0}
    assert model.generate(ids[:, 4:], mems=copy.deepcopy(memory), **settings).shape == (2, 3)
    with pytest.raises(ValueError, match="cache"):  # transformers' check of generate's arguments: loud, not dropped
        model.generate(ids[:, 4:], cache=copy.deepcopy(memory), **settings)
