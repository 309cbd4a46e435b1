"""The ``"flex_attention"`` route (`tf_family.attention.flex`) against the dense twins, forward and backward, on CPU.

A forward without a gradient runs PyTorch's FlexAttention (uncompiled); with a gradient, the tiled reference (PyTorch
refuses a FlexAttention backward on CPU), which reads the same block mask. The tile tables themselves are checked
against the exact element mask: every allowed pair lies in a listed tile, and every full tile is allowed throughout,
so the compiled CUDA kernel (which skips the mask inside full tiles and everything outside the listed ones) computes
the same attention.
"""

import pytest
import torch

from tests.common.tester import build, main_output, make_inputs, without_labels
from tf_family.attention import (
    ChunkPattern,
    GlobalTokens,
    WindowPattern,
    backend,
    block_sparse_attention,
    block_sparse_attention_reference,
    build_block_sparse_counts,
    chunked_local_attention,
    chunked_local_attention_reference,
    flex,
    random_block_indices,
    sliding_window_attention,
    sliding_window_attention_reference,
)
from tf_family.attention.backend import NATIVE
from tf_family.registry import ARCHITECTURES

FLEX = "flex_attention"
BATCH, HEADS, LENGTH, HEAD_DIM = 2, 2, 300, 16  # 300: not a multiple of FlexAttention's 128-token tiles


def _tensors(length=LENGTH, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shape = (BATCH, HEADS, length, HEAD_DIM)
    tensors = [torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_() for _ in range(3)]
    valid = torch.ones(BATCH, length, dtype=torch.bool)
    valid[1, length - 50 :] = False  # right padding in the second row
    weights = torch.randn(*shape, generator=generator, dtype=torch.float64) * valid[:, None, :, None]
    return tensors, valid, weights


def _assert_same_values_and_grads(run_ours, run_twin, inputs, weights):
    """Values (with and without a gradient) and gradients of ``(out * weights).sum()``, padded rows left out."""
    ours, twin = run_ours(*inputs), run_twin(*inputs)
    real = weights != 0
    torch.testing.assert_close(ours * real, twin * real, rtol=1e-9, atol=1e-11)
    with torch.no_grad():  # PyTorch's FlexAttention itself
        torch.testing.assert_close(run_ours(*inputs) * real, twin * real, rtol=1e-9, atol=1e-11)
    grads_ours = torch.autograd.grad((ours * weights).sum(), inputs)
    grads_twin = torch.autograd.grad((twin * weights).sum(), inputs)
    for got, want in zip(grads_ours, grads_twin, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


def _assert_tiles_cover(block_mask):
    """reach contains every allowed pair; full tiles are allowed throughout (the kernel's reading of the mask)."""
    query_tile, key_tile = block_mask.BLOCK_SIZE
    query_length, key_length = block_mask.seq_lengths
    num_key_tiles = key_length // key_tile
    partial = flex._tiles(block_mask.kv_num_blocks, block_mask.kv_indices, num_key_tiles)
    full = flex._tiles(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, num_key_tiles)
    batch, heads = partial.shape[:2]
    b, h = torch.arange(batch)[:, None, None, None], torch.arange(heads)[None, :, None, None]
    q_idx, kv_idx = torch.arange(query_length)[None, None, :, None], torch.arange(key_length)[None, None, None, :]
    exact = block_mask.mask_mod(b, h, q_idx, kv_idx).expand(batch, heads, query_length, key_length)
    tiles = exact.reshape(batch, heads, query_length // query_tile, query_tile, num_key_tiles, key_tile)
    assert not (tiles.any(5).any(3) & ~(partial | full)).any(), "an allowed pair outside every listed tile"
    assert tiles.all(5).all(3)[full].all(), "a full tile with a masked pair"
    assert not (partial & full).any()
    assert exact.any(-1).all(), "a query with nothing to attend to"


@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_sliding_window_with_global_tokens(dilation, causal):
    tensors, valid, weights = _tensors()
    global_mask = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    global_mask[:, [0, 7]] = True
    global_mask[1, 130] = True
    global_tokens = GlobalTokens.from_mask(global_mask, valid)
    pattern = WindowPattern(40, dilation, causal)
    _assert_same_values_and_grads(
        lambda q, k, v: sliding_window_attention(q, k, v, pattern, valid, global_tokens, 0.0, FLEX),
        lambda q, k, v: sliding_window_attention_reference(q, k, v, pattern, valid, global_tokens),
        tensors,
        weights,
    )
    _assert_tiles_cover(flex.sliding_window_block_mask(384, 128, pattern, "cpu"))
    _assert_tiles_cover(flex.sliding_window_block_mask(384, 0, pattern, "cpu"))


@pytest.mark.parametrize("block_size", [16, 48], ids=["blocks in a tile", "blocks across tiles"])
@pytest.mark.parametrize("repeats", [False, True], ids=["random blocks", "repeated blocks"])
def test_block_sparse(block_size, repeats):
    length = 600 if block_size == 48 else LENGTH
    tensors, valid, weights = _tensors(length)
    num_blocks = -(-length // block_size)
    random_blocks = random_block_indices(num_blocks, HEADS, 2, 1, 0)
    if repeats:  # transformers' eval pattern: every random slot on block 0 (counted twice)
        random_blocks = torch.zeros_like(random_blocks)
    _assert_same_values_and_grads(
        lambda q, k, v: block_sparse_attention(q, k, v, block_size, random_blocks, 1, valid, 0.0, FLEX),
        lambda q, k, v: block_sparse_attention_reference(q, k, v, block_size, random_blocks, 1, valid),
        tensors,
        weights,
    )
    counts = build_block_sparse_counts(num_blocks, random_blocks, 1, HEADS)
    block_mask, log_counts = flex.block_sparse_block_mask(block_size, counts, -(-length // 128) * 128)
    assert bool((log_counts > 0).any()) == repeats
    assert ((128, 16) if block_size == 16 else (128, 128)) == block_mask.BLOCK_SIZE  # key tiles of one block
    _assert_tiles_cover(block_mask)


@pytest.mark.parametrize("wrap_around", [False, True], ids=["apart", "wrap-around"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_chunked_local(wrap_around, causal):
    tensors, valid, weights = _tensors()
    pattern = ChunkPattern(32, 1, 0 if causal else 1, causal, wrap_around)
    _assert_same_values_and_grads(
        lambda q, k, v: chunked_local_attention(q, k, v, pattern, valid, 0.0, FLEX),
        lambda q, k, v: chunked_local_attention_reference(q, k, v, pattern, valid)[0],
        tensors,
        weights,
    )
    _assert_tiles_cover(flex.chunked_local_block_mask(LENGTH, pattern, "cpu"))


def test_dropout_takes_the_sdpa_path():
    """FlexAttention has no dropout: under dropout a sparse kernel computes what its ``"sdpa"`` path does."""
    tensors, valid, _ = _tensors()
    outputs = []
    for implementation in (FLEX, "sdpa"):
        torch.manual_seed(0)
        outputs.append(sliding_window_attention(*tensors, WindowPattern(8), valid, None, 0.1, implementation))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)


def test_block_masks_are_built_once_per_shape_and_pattern():
    """Every call of the same shape and pattern reuses the cached mask (the layers of a forward, later calls);
    padding and global tokens are data (score_mod), so a call with other padding reuses it too."""
    tensors, valid, weights = _tensors()
    cache = flex.BlockMaskCache()
    pattern = WindowPattern(40)
    global_mask = torch.zeros(BATCH, LENGTH, dtype=torch.bool)
    global_mask[:, 0] = True
    first = sliding_window_attention(
        *tensors, pattern, valid, GlobalTokens.from_mask(global_mask, valid), 0.0, FLEX, cache
    )
    assert len(cache) == 1
    other_valid = torch.ones_like(valid)
    other_globals = GlobalTokens.from_mask(global_mask, other_valid)
    second = sliding_window_attention(*tensors, pattern, other_valid, other_globals, 0.0, FLEX, cache)
    assert len(cache) == 1  # same shape and pattern: no new mask
    want = sliding_window_attention_reference(*tensors, pattern, other_valid, other_globals)
    torch.testing.assert_close(second, want, rtol=1e-9, atol=1e-11)
    assert not torch.equal(first, second)
    sliding_window_attention(*tensors, WindowPattern(20), valid, None, 0.0, FLEX, cache)
    assert len(cache) == 2  # a new pattern: a new mask


def test_bigbird_random_plans_are_drawn_on_the_device_once_per_seed():
    model = build(ARCHITECTURES["big_bird"], "base")
    inputs = without_labels(make_inputs(ARCHITECTURES["big_bird"], model.config, "base", batch=1, length=40))
    model.train()
    model(**inputs)
    plans = len(model.block_masks)
    assert plans == model.config.num_hidden_layers  # one plan per layer
    model(**inputs)
    assert len(model.block_masks) == plans  # the same seed: reused
    model(**inputs, random_seed=1)
    assert len(model.block_masks) == 2 * plans  # a new seed: new plans


# ------------------------------------------------------------------------------------------------------- models
_MODELS = {"longformer": 40, "big_bird": 40, "reformer": 48}  # lengths that take each sparse path


@pytest.mark.parametrize("implementation", ["sdpa", NATIVE, FLEX])
@pytest.mark.parametrize("name", list(_MODELS))
def test_models_train_the_same_under_every_implementation(name, implementation, monkeypatch):
    """The tiny model's outputs and parameter gradients under ``attn_implementation="sdpa"``, ``"tff_native"`` (the
    native kernel on every tile, where it is built) and ``"flex_attention"`` equal those under ``"eager"`` (the
    dense twin per chunk; attention dropout off: FlexAttention has none), padding included; the config names what
    runs, from `from_pretrained` as from `set_attn_implementation`."""
    monkeypatch.setattr(backend, "NATIVE_MIN_ROWS", 1)
    spec = ARCHITECTURES[name]
    task = "causal_lm" if "causal_lm" in spec.model_classes else next(iter(spec.model_classes))
    overrides = {"lsh_attention_probs_dropout_prob": 0.0, "local_attention_probs_dropout_prob": 0.0}
    model = build(spec, task, **(overrides if name == "reformer" else {})).double()
    assert type(model)._supports_flex_attn and type(model)._supports_sdpa
    inputs = without_labels(make_inputs(spec, model.config, task, batch=2, length=_MODELS[name]))
    mask = torch.ones_like(inputs["input_ids"])
    mask[1, -5:] = 0
    inputs["attention_mask"] = mask

    def outputs_and_grads():
        model.zero_grad()
        out = main_output(task, model(**inputs))
        (out * mask[..., None]).square().sum().backward()
        return [out * mask[..., None]] + [p.grad.clone() for p in model.parameters() if p.grad is not None]

    model.train()
    model.set_attn_implementation("eager")
    eager = outputs_and_grads()
    model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == implementation
    got = outputs_and_grads()
    for got_tensor, want in zip(got, eager, strict=True):
        torch.testing.assert_close(got_tensor, want, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("implementation", ["eager", "sdpa", NATIVE, FLEX])
def test_from_pretrained_takes_every_implementation(implementation, tmp_path):
    spec = ARCHITECTURES["big_bird"]
    build(spec, "masked_lm").save_pretrained(tmp_path)
    model = spec.model_classes["masked_lm"].from_pretrained(tmp_path, attn_implementation=implementation)
    assert model.config._attn_implementation == implementation


def test_models_without_a_flex_route_are_refused_by_transformers():
    model = build(ARCHITECTURES["transfo_xl"], "causal_lm")
    with pytest.raises(ValueError, match="flex_attention"):
        model.set_attn_implementation(FLEX)


def test_two_reformers_with_both_self_scores_run_flex_attention_in_one_process():
    """The self-only score differs between LSH patterns (finfo.min / 2 without wrap-around, -1e5 with it). Two
    Reformers under attn_implementation="flex_attention", wrap-around off then on, run in one process and agree with
    their eager twins (the second used to raise on newer torch: a float closed over by the compiled LSH score
    function became a SymFloat that flex_attention refused). The LSH rounds no longer go through FlexAttention; the
    local layers' block masks still specialise on the padded length, which differs between the two patterns."""
    spec = ARCHITECTURES["reformer"]
    outputs = []
    for wrap_around in (False, True):
        model = build(spec, "causal_lm", chunk_wrap_around=wrap_around)
        model.set_attn_implementation(FLEX)
        inputs = without_labels(make_inputs(spec, model.config, "causal_lm"))
        with torch.no_grad():
            outputs.append(model(**inputs).logits)
        model.set_attn_implementation("eager")
        with torch.no_grad():
            torch.testing.assert_close(outputs[-1], model(**inputs).logits, rtol=1e-5, atol=1e-5)


def _python_numbers_closed_over(function, seen=None) -> list:
    """The Python floats ``function`` reads from its closure, following the functions it closes over."""
    seen = set() if seen is None else seen
    if function is None or id(function) in seen:
        return []
    seen.add(id(function))
    found = []
    for cell in getattr(function, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, float):
            found.append(value)
        elif callable(value):
            found.extend(_python_numbers_closed_over(value, seen))
    return found


@pytest.mark.parametrize("name", ["longformer", "big_bird", "reformer"])
def test_no_compiled_attention_function_closes_over_a_python_float(name, monkeypatch):
    """A Python float read by a compiled score or mask function is specialised on: another value recompiles, and
    newer torch makes it a SymFloat that flex_attention refuses (Reformer's LSH score once closed over its self-score,
    ``finfo.min / 2`` or ``-1e5``). Every FlexAttention call of the three sparse models, Reformer in both chunking
    modes, passes score and mask functions that read no Python float."""
    from tf_family.attention import flex

    calls, run = [], flex._run

    def spy(query, key, value, block_mask, score_mod=None, *args, **kwargs):
        calls.append((score_mod, getattr(block_mask, "mask_mod", None)))
        return run(query, key, value, block_mask, score_mod, *args, **kwargs)

    monkeypatch.setattr(flex, "_run", spy)
    spec = ARCHITECTURES[name]
    task = "causal_lm" if "causal_lm" in spec.model_classes else "base"
    for overrides in ({"chunk_wrap_around": False}, {"chunk_wrap_around": True}) if name == "reformer" else ({},):
        model = build(spec, task, **overrides)
        model.set_attn_implementation(FLEX)
        with torch.no_grad():
            # BigBird's tiny model attends densely below 40 tokens
            model(**without_labels(make_inputs(spec, model.config, task, batch=2, length=40)))
    assert calls, "no FlexAttention call: the test cannot tell"
    for score_mod, mask_mod in calls:
        assert _python_numbers_closed_over(score_mod) == [], score_mod
        assert _python_numbers_closed_over(mask_mod) == [], mask_mod
