"""The generation cache is ``cache`` (transformers 5.24's name); ``past_key_values`` (the name before) still works."""

import copy

import pytest
import torch

from tf_family.modeling.utils import accepts_past_key_values
from tf_family.registry import ARCHITECTURES

from .common.tester import build, make_inputs

CAUSAL = [name for name, spec in ARCHITECTURES.items() if "causal_lm" in spec.model_classes]


def _carried(output):
    """The state a causal LM returns for the next call: its cache, or (Transformer-XL family) its memory."""
    return output.cache if output.get("cache") is not None else output.mems


@pytest.mark.parametrize("arch", CAUSAL)
def test_the_old_cache_name_gives_the_same_step(arch):
    spec = ARCHITECTURES[arch]
    model = build(spec, "causal_lm")
    ids = make_inputs(spec, model.config, "causal_lm", batch=2, length=5)["input_ids"]
    with torch.no_grad():
        state = _carried(model(input_ids=ids[:, :4], use_cache=True))
        assert state is not None
        new = model(input_ids=ids[:, 4:], cache=copy.deepcopy(state), use_cache=True)
        old = model(input_ids=ids[:, 4:], past_key_values=copy.deepcopy(state), use_cache=True)
        fresh = model(input_ids=ids[:, 4:], use_cache=True)
    torch.testing.assert_close(old.logits, new.logits, rtol=0, atol=0)
    assert not torch.allclose(new.logits, fresh.logits), "the step did not read the state"
    with pytest.raises(ValueError, match="Pass the cache once, as `cache`"):
        model(input_ids=ids[:, 4:], cache=copy.deepcopy(state), past_key_values=copy.deepcopy(state))


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
