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
    block_sparse_attention,
    block_sparse_attention_reference,
    build_block_sparse_counts,
    chunked_local_attention,
    chunked_local_attention_reference,
    flex,
    hash_vectors,
    lsh_attention,
    lsh_rotations,
    normalize_shared_keys,
    random_block_indices,
    sliding_window_attention,
    sliding_window_attention_reference,
)
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


def _assert_tiles_cover(block_mask, score_mod=None):
    """reach contains every allowed pair; full tiles are allowed throughout (the kernel's reading of the mask)."""
    num_key_tiles = block_mask.kv_indices.shape[-1]
    partial = flex._tiles(block_mask.kv_num_blocks, block_mask.kv_indices, num_key_tiles)
    full = flex._tiles(block_mask.full_kv_num_blocks, block_mask.full_kv_indices, num_key_tiles)
    length = block_mask.seq_lengths[0]
    batch, heads = partial.shape[:2]
    b, h = torch.arange(batch)[:, None, None, None], torch.arange(heads)[None, :, None, None]
    q_idx, kv_idx = torch.arange(length)[None, None, :, None], torch.arange(length)[None, None, None, :]
    exact = block_mask.mask_mod(b, h, q_idx, kv_idx).expand(batch, heads, length, length)
    tiles = exact.reshape(batch, heads, length // 128, 128, length // 128, 128)
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
    _assert_tiles_cover(flex.sliding_window_block_mask(tensors[0], 40, dilation, causal, valid, global_mask))


@pytest.mark.parametrize("block_size", [16, 48], ids=["blocks in a tile", "blocks across tiles"])
@pytest.mark.parametrize("repeats", [False, True], ids=["random blocks", "repeated blocks"])
def test_block_sparse(block_size, repeats):
    length = 600 if block_size == 48 else LENGTH
    tensors, valid, weights = _tensors(length)
    num_blocks = -(-length // block_size)
    random_blocks = random_block_indices(num_blocks, HEADS, 2, 1, torch.Generator().manual_seed(0))
    if repeats:  # transformers' eval pattern: every random slot on block 0 (counted twice)
        random_blocks = torch.zeros_like(random_blocks)
    _assert_same_values_and_grads(
        lambda q, k, v: block_sparse_attention(q, k, v, block_size, random_blocks, 1, valid, 0.0, FLEX),
        lambda q, k, v: block_sparse_attention_reference(q, k, v, block_size, random_blocks, 1, valid),
        tensors,
        weights,
    )
    counts = build_block_sparse_counts(num_blocks, random_blocks, 1, HEADS)
    block_mask, score_mod = flex.block_sparse_block_mask(tensors[0], block_size, counts, valid)
    assert (score_mod is not None) == repeats
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
    _assert_tiles_cover(flex.chunked_local_block_mask(tensors[0], pattern, valid))


@pytest.mark.parametrize(
    "wrap_around, causal, correct_duplicates",
    [(False, False, False), (False, True, True), (True, False, False), (True, True, False)],
)
def test_lsh(wrap_around, causal, correct_duplicates):
    """Against the chunked path (itself tested against its dense twin in test_lsh.py), with the same buckets."""
    tensors, valid, weights = _tensors()
    rotations = lsh_rotations(3, HEADS, HEAD_DIM, 2, 8, dtype=torch.float64)
    buckets = hash_vectors(tensors[0].detach(), rotations, 8)
    pattern = ChunkPattern(32, 1, 0, causal, wrap_around)

    def run(implementation):
        def attention(shared, value):
            key = normalize_shared_keys(shared)
            return lsh_attention(
                shared,
                key,
                value,
                buckets,
                pattern,
                valid,
                correct_duplicates=correct_duplicates,
                implementation=implementation,
            )

        return attention

    shared, _, value = tensors
    _assert_same_values_and_grads(run(FLEX), run("sdpa"), [shared, value], weights)


def test_dropout_is_refused_with_the_fix():
    tensors, valid, _ = _tensors()
    with pytest.raises(ValueError, match="dropout_p=0.1.*attn_implementation='sdpa'"):
        sliding_window_attention(*tensors, WindowPattern(8), valid, None, 0.1, FLEX)


# ------------------------------------------------------------------------------------------------------- models
_MODELS = {"longformer": 40, "big_bird": 40, "reformer": 48}  # lengths that take each sparse path


@pytest.mark.parametrize("name", list(_MODELS))
def test_models_train_the_same_with_flex_attention(name):
    """The tiny model's outputs and parameter gradients with ``attn_implementation="flex_attention"`` equal those
    with ``"eager"`` (the dense twin per chunk; attention dropout off: FlexAttention has none), padding included."""
    spec = ARCHITECTURES[name]
    task = "causal_lm" if "causal_lm" in spec.model_classes else next(iter(spec.model_classes))
    overrides = {"lsh_attention_probs_dropout_prob": 0.0, "local_attention_probs_dropout_prob": 0.0}
    model = build(spec, task, **(overrides if name == "reformer" else {})).double()
    assert type(model)._supports_flex_attn
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
    model.set_attn_implementation(FLEX)
    assert model.config._attn_implementation == FLEX
    flexed = outputs_and_grads()
    for got, want in zip(flexed, eager, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-9)


def test_models_without_a_flex_route_are_refused_by_transformers():
    model = build(ARCHITECTURES["transfo_xl"], "causal_lm")
    with pytest.raises(ValueError, match="flex_attention"):
        model.set_attn_implementation(FLEX)


def test_lsh_self_scores_of_both_patterns_share_one_compiled_graph():
    """The self-only score differs between LSH patterns (finfo.min / 2 without wrap-around, -1e5 with it): it enters
    FlexAttention as a tensor, so a second value in the same process compiles nothing again (a float closed over by
    score_mod was a graph constant: a recompile here, a SymFloat that flex_attention refuses on newer torch)."""
    torch.manual_seed(0)
    batch, rows, length = 1, 2, 64
    query, key, value = (torch.randn(batch, rows, length, HEAD_DIM) for _ in range(3))
    positions = torch.stack([torch.randperm(length) for _ in range(rows)])[None]  # (B, A, L)
    sorted_rows = flex.SortedRows(
        positions, slot_of=positions.argsort(-1)[:, None], key_valid=torch.ones(1, length).bool()
    )
    pattern = ChunkPattern(16, 1, 0, True, False)
    values = (float(torch.finfo(torch.float32).min / 2), -1e5)
    with torch.no_grad():
        outputs = [flex.flex_lsh_attention(query, key, value, sorted_rows, pattern, values[0])]
        with torch._dynamo.config.patch(error_on_recompile=True):
            outputs.append(flex.flex_lsh_attention(query, key, value, sorted_rows, pattern, values[1]))
    # the self score changes only the rows whose query has nothing else (the first sorted slot of each row here)
    torch.testing.assert_close(outputs[1][0], outputs[0][0])
