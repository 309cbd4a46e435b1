"""`GrowingCache` holds what `transformers.DynamicCache` holds after every operation (updates of any length,
growth past its room, crop, batch selection, beam reordering, gradients), writes decoding steps in place, and
`generate` makes one for CALM with the same tokens as a plain `DynamicCache`."""

import pytest
import torch
from transformers import DynamicCache

from tf_family.modeling.cache import GrowingCache, GrowingLayer
from tf_family.registry import get_arch


def _step(batch=2, length=1, seed=0, heads=3, dim=4):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, heads, length, dim, generator=generator), torch.randn(
        batch, heads, length, dim, generator=generator
    )


def _assert_same(grown: GrowingCache, plain: DynamicCache):
    assert len(grown.layers) == len(plain.layers)
    for ours, theirs in zip(grown.layers, plain.layers, strict=True):
        assert ours.get_seq_length() == theirs.get_seq_length()
        if theirs.get_seq_length():
            torch.testing.assert_close(ours.keys, theirs.keys, rtol=0, atol=0)
            torch.testing.assert_close(ours.values, theirs.values, rtol=0, atol=0)


def test_updates_equal_dynamic_cache_and_steps_write_in_place():
    grown, plain = GrowingCache(reserve=8), DynamicCache()
    lengths = [5, 1, 1, 1, 3, 1, 1, 7, 1]  # 8 positions of room, then growth past it
    pointers = []
    for seed, length in enumerate(lengths):
        for layer in (0, 1):
            key, value = _step(length=length, seed=10 * seed + layer)
            got = grown.update(key, value, layer)
            want = plain.update(key, value, layer)
            torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
            torch.testing.assert_close(got[1], want[1], rtol=0, atol=0)
        pointers.append(grown.layers[0].keys.data_ptr())
        _assert_same(grown, plain)
    assert all(isinstance(layer, GrowingLayer) for layer in grown.layers)
    # while the room lasts (5 + 1 + 1 + 1 = 8 positions) every update writes into the same buffer
    assert len(set(pointers[:4])) == 1
    assert pointers[4] != pointers[0]  # 11 positions: a larger buffer


def test_views_handed_out_earlier_keep_their_values():
    cache = GrowingCache(reserve=16)
    keys, _ = cache.update(*_step(length=3), 0)
    before = keys.clone()
    for seed in range(1, 6):
        cache.update(*_step(seed=seed), 0)
    torch.testing.assert_close(keys, before, rtol=0, atol=0)


def test_crop_select_reorder_then_update_equal_dynamic_cache():
    config = get_arch("calm").tiny_config()
    grown, plain = GrowingCache(config, reserve=12), DynamicCache(config=config)
    heads, dim = config.num_key_value_heads, config.head_dim

    def update(seed, batch, length=1):
        for layer in range(config.num_hidden_layers):
            step = _step(batch, length, 100 * seed + layer, heads, dim)
            grown.update(*step, layer)
            plain.update(*step, layer)

    update(0, 4, 5)
    update(1, 4)
    for cache in (grown, plain):
        cache.crop(-2)
    update(2, 4)
    _assert_same(grown, plain)
    order = torch.tensor([3, 0, 0, 2])
    for cache in (grown, plain):
        cache.reorder_cache(order)
    update(3, 4)
    _assert_same(grown, plain)
    for cache in (grown, plain):
        cache.batch_select_indices(torch.tensor([1, 2]))
    update(4, 2)
    update(5, 2, 2)
    _assert_same(grown, plain)


def test_gradients_flow_as_through_dynamic_cache():
    key, value = (tensor.requires_grad_() for tensor in _step(length=2))
    grown, plain = GrowingCache(), DynamicCache()
    grown.update(*_step(length=3, seed=1), 0)
    plain.update(*_step(length=3, seed=1), 0)
    got = grown.update(key, value, 0)
    want = plain.update(key, value, 0)
    grads = torch.autograd.grad((got[0] * got[1]).sum(), (key, value))
    expected = torch.autograd.grad((want[0] * want[1]).sum(), (key, value))
    for ours, theirs in zip(grads, expected, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


@pytest.mark.parametrize("reserve", [-1, 1.5, True, "8"])
def test_reserve_must_be_a_count(reserve):
    with pytest.raises(ValueError, match="reserve"):
        GrowingCache(reserve=reserve)


@pytest.mark.parametrize("beams", [1, 3])
def test_calm_generate_makes_a_growing_cache_with_the_same_tokens(beams):
    torch.manual_seed(0)
    spec = get_arch("calm")
    model = spec.model_classes["causal_lm"](spec.tiny_config()).eval()
    ids = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(0))
    settings = {"max_new_tokens": 6, "do_sample": False, "num_beams": beams, "return_dict_in_generate": True}
    with torch.no_grad():
        made = model.generate(ids, attention_mask=torch.ones_like(ids), **settings)
        given = model.generate(
            ids, attention_mask=torch.ones_like(ids), cache=DynamicCache(config=model.config), **settings
        )
    assert type(made.cache) is GrowingCache
    assert type(given.cache) is DynamicCache  # a cache the caller passes is used as given
    assert torch.equal(made.sequences, given.sequences)
    _assert_same(made.cache, given.cache)
