"""BigBird block-sparse attention agrees with its dense twin (values and gradients); random blocks are seeded."""

import pytest
import torch

import tf_family.attention.block_sparse as block_sparse_module
from tf_family.attention import (
    block_sparse_attention_reference,
    build_block_sparse_counts,
    layer_seed,
    random_block_indices,
)
from tf_family.attention.backend import NATIVE
from tf_family.attention.block_sparse import block_sparse_attention as _block_sparse_attention

B, H, DH = 3, 2, 8
pytestmark = pytest.mark.usefixtures("attention_backend")  # native kernel and PyTorch path alike


def block_sparse_attention(*args, implementation=NATIVE, **kwargs):
    """The kernel under tf_family's CPU implementation (the fixture picks the native kernel or the PyTorch path)."""
    return _block_sparse_attention(*args, implementation=implementation, **kwargs)


def _inputs(length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(B, H, length, DH, generator=generator, dtype=torch.float64) for _ in range(3)]
    for tensor in tensors:
        tensor.requires_grad_(True)
    padding = torch.ones(B, length, dtype=torch.bool)
    padding[1, length - 6 :] = False  # rows of different lengths: right padding ...
    padding[2, :5] = False  # ... and left padding
    return tensors, padding


def _check_twin(tensors, padding, block, random_blocks, window_blocks, dropout_p=0.0):
    """Values and gradients against the dense twin at real query positions, run with gradients (on CPU,
    tf_family's `masked_attention`) and without (PyTorch's fused attention, unless dropout is on)."""
    weights = torch.randn(*tensors[0].shape, dtype=torch.float64) * padding[:, None, :, None]
    fast = block_sparse_attention(*tensors, block, random_blocks, window_blocks, padding, dropout_p)
    fast_grads = torch.autograd.grad((fast * weights).sum(), tensors)
    with torch.no_grad():
        fast_eval = block_sparse_attention(*tensors, block, random_blocks, window_blocks, padding, dropout_p)
    reference = block_sparse_attention_reference(*tensors, block, random_blocks, window_blocks, padding)
    reference_grads = torch.autograd.grad((reference * weights).sum(), tensors)
    select = padding[:, None, :, None].expand_as(fast)
    torch.testing.assert_close(fast[select], reference[select], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(fast_eval[select], reference[select], rtol=1e-9, atol=1e-10)
    for got, expected in zip(fast_grads, reference_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("length", [35, 64, 90])
@pytest.mark.parametrize("num_random", [0, 2])
@pytest.mark.parametrize("window_blocks", [1, 2])
@pytest.mark.parametrize("repeated", [False, True])
def test_block_sparse_matches_dense_twin(length, num_random, window_blocks, repeated):
    block = 4
    tensors, padding = _inputs(length, seed=length)
    num_blocks = -(-length // block)
    random_blocks = random_block_indices(num_blocks, H, num_random, window_blocks, layer_seed(3, 0))
    if repeated:  # transformers' eval pattern: every random slot on block 0 (repeats the global block)
        random_blocks = torch.zeros_like(random_blocks)
    _check_twin(tensors, padding, block, random_blocks, window_blocks)


@pytest.mark.parametrize("blocks_per_slab", [1, 4])
def test_slabs_of_query_blocks_match_dense_twin(monkeypatch, blocks_per_slab):
    """On CPU the middle query blocks run in slabs whose score buffers stay small; 21 middle blocks in slabs of 1
    and of 4 (the last one shorter) give the twin's values and gradients."""
    length, block, num_random = 90, 4, 2
    slots = 2 + 3 + num_random  # global, window, random key blocks per query block
    score_bytes = B * H * block * slots * block * 8  # float64
    monkeypatch.setattr(block_sparse_module, "_SLAB_BYTES", blocks_per_slab * score_bytes)
    tensors, padding = _inputs(length, seed=7)
    random_blocks = random_block_indices(-(-length // block), H, num_random, 1, layer_seed(1, 0))
    _check_twin(tensors, padding, block, random_blocks, 1)


@pytest.mark.parametrize("length", [35, 90])
@pytest.mark.parametrize("num_random", [0, 2])
def test_training_path_with_dropout_matches_dense_twin(length, num_random):
    """Under dropout every block goes through our attention function; with a rate that rounds to no dropped entry
    it must give the twin's values and gradients."""
    tensors, padding = _inputs(length, seed=length + 1)
    random_blocks = random_block_indices(-(-length // 4), H, num_random, 1, layer_seed(5, 1))
    _check_twin(tensors, padding, 4, random_blocks, 1, dropout_p=1e-7)


def test_dropout_is_unbiased():
    """Dropout on the attention probabilities keeps the expected output: the mean over many independent rows
    approaches the output without dropout (middle blocks and global blocks alike)."""
    rows, length, block = 3000, 40, 4
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 1, length, 4, generator=generator).expand(rows, -1, -1, -1).contiguous()
                         for _ in range(3))  # fmt: skip
    random_blocks = random_block_indices(length // block, 1, 1, 1, layer_seed(2, 0))
    torch.manual_seed(1)
    dropped = block_sparse_attention(query, key, value, block, random_blocks, dropout_p=0.3)
    exact = block_sparse_attention(query[:1], key[:1], value[:1], block, random_blocks)
    assert not torch.allclose(dropped[0], exact[0])
    torch.testing.assert_close(dropped.mean(0, keepdim=True), exact, atol=0.05, rtol=0)


def test_covering_window_without_random_blocks_is_full_attention():
    tensors, padding = _inputs(30)
    full = torch.nn.functional.scaled_dot_product_attention(*tensors, attn_mask=padding[:, None, None, :])
    sparse = block_sparse_attention(*tensors, 4, None, window_blocks=8, key_padding_mask=padding)
    select = padding[:, None, :, None].expand_as(full)
    torch.testing.assert_close(sparse[select], full[select])


def test_random_blocks_are_seeded_distinct_and_outside_the_window():
    first = random_block_indices(20, 3, 3, 1, layer_seed(7, 2))
    again = random_block_indices(20, 3, 3, 1, layer_seed(7, 2))
    other = random_block_indices(20, 3, 3, 1, layer_seed(7, 3))
    assert torch.equal(first, again) and not torch.equal(first, other)
    state = torch.random.get_rng_state()
    random_block_indices(20, 3, 3, 1, layer_seed(0, 0))
    assert torch.equal(state, torch.random.get_rng_state())
    for head in range(3):
        for query in range(1, 19):
            chosen = first[head, query].tolist()
            assert len(set(chosen)) == 3
            assert all(abs(block - query) > 1 and 0 < block < 19 for block in chosen)
    with pytest.raises(ValueError, match="num_random_blocks=3"):
        random_block_indices(7, 1, 3, 1, layer_seed(0, 0))


def test_counts_follow_the_itc_pattern():
    counts = build_block_sparse_counts(6, torch.tensor([[[0], [4], [0], [1], [0], [0]]]), 1)[0]
    assert counts.tolist() == [
        [1, 1, 1, 1, 1, 1],
        [1, 1, 1, 0, 1, 1],  # window 0-2 (0 is global), last block, random block 4
        [2, 1, 1, 1, 0, 1],  # random slot repeats block 0
        [1, 1, 1, 1, 1, 1],  # random block 1
        [2, 0, 0, 1, 1, 1],
        [1, 1, 1, 1, 1, 1],
    ]


def test_fast_path_memory_is_linear_in_length():
    saved = {}
    for length in (512, 2048):
        query = torch.randn(1, 2, length, 4, requires_grad=True)
        sizes = []

        def pack(tensor, sizes=sizes):
            sizes.append(tensor.numel())
            return tensor

        blocks = random_block_indices(length // 16, 2, 2, 1, layer_seed(0, 0))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            block_sparse_attention(query, query, query, 16, blocks).sum()
        saved[length] = sum(sizes)
    assert saved[2048] <= 4 * saved[512] * 1.1, saved


def _spy_sdpa(monkeypatch) -> list[tuple[int, bool]]:
    """Record ``(query rows, masked)`` of every call of PyTorch's `scaled_dot_product_attention`."""
    calls, original = [], torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, attn_mask=None, **kwargs):
        calls.append((query.shape[0], attn_mask is not None))
        return original(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return calls


@pytest.mark.parametrize("window_blocks", [1, 2])
def test_interior_blocks_without_padding_carry_no_mask(monkeypatch, window_blocks):
    """Without a padding mask and with whole blocks, the global rows and the middle blocks whose window lies inside
    the sequence reach PyTorch's SDPA with ``attn_mask=None`` (flash-eligible on a GPU); only the ``w`` edge blocks
    at each end carry a mask. Values and gradients stay the dense twin's; with a padding mask every call is
    masked."""
    length, block, num_random = 64, 4, 2
    num_blocks = length // block
    tensors, _ = _inputs(length, seed=11)
    random_blocks = random_block_indices(num_blocks, H, num_random, window_blocks, layer_seed(4, 0))
    calls = _spy_sdpa(monkeypatch)
    fast = _block_sparse_attention(*tensors, block, random_blocks, window_blocks, None, implementation="sdpa")
    fast_grads = torch.autograd.grad(fast.square().sum(), tensors)
    reference = block_sparse_attention_reference(*tensors, block, random_blocks, window_blocks, None)
    reference_grads = torch.autograd.grad(reference.square().sum(), tensors)
    torch.testing.assert_close(fast, reference, rtol=1e-9, atol=1e-10)
    for got, expected in zip(fast_grads, reference_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)
    unmasked_blocks = sum(rows // B for rows, masked in calls if not masked and rows % B == 0 and rows != B)
    masked_blocks = sum(rows // B for rows, masked in calls if masked)
    assert (B, False) in calls  # the global rows
    assert unmasked_blocks == num_blocks - 2 - 2 * window_blocks
    assert masked_blocks == 2 * window_blocks

    calls.clear()
    padding = torch.ones(B, length, dtype=torch.bool)
    _block_sparse_attention(*tensors, block, random_blocks, window_blocks, padding, implementation="sdpa")
    assert calls and all(masked for _, masked in calls)
    calls.clear()  # a tail block: its padding is a mask too
    _block_sparse_attention(
        *(t[:, :, :-1] for t in tensors), block, random_blocks, window_blocks, None, implementation="sdpa"
    )
    assert calls and all(masked for _, masked in calls)


def test_big_bird_without_attention_mask_calls_sdpa_without_a_mask(monkeypatch):
    """The model side of the rule: a BigBird forward without ``attention_mask`` hands the kernel no padding mask, so
    its global rows and interior blocks reach SDPA unmasked (and a short input's dense attention too); the outputs
    equal those of an all-ones ``attention_mask``, whose calls all carry a mask."""
    from tests.common.tester import build, make_inputs, without_labels
    from tf_family.registry import ARCHITECTURES

    spec = ARCHITECTURES["big_bird"]
    model = build(spec, "base").eval()
    model.set_attn_implementation("sdpa")
    calls = _spy_sdpa(monkeypatch)
    for length in (40, 8):  # block-sparse, then dense (too short for blocks)
        inputs = without_labels(make_inputs(spec, model.config, "base", batch=2, length=length))
        inputs.pop("attention_mask", None)
        calls.clear()
        with torch.no_grad():
            free = model(**inputs).last_hidden_state
        assert any(not masked for _, masked in calls)
        calls.clear()
        with torch.no_grad():
            ones = model(**inputs, attention_mask=torch.ones_like(inputs["input_ids"])).last_hidden_state
        assert calls and all(masked for _, masked in calls)
        torch.testing.assert_close(free, ones)
