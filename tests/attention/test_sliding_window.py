"""The sliding-window and global attention kernels agree with their dense twins (values and gradients)."""

import pytest
import torch

from tf_family.attention import (
    GlobalTokens,
    WindowPattern,
    build_sliding_window_mask,
    global_attention,
    global_attention_reference,
    sliding_window_attention_reference,
)
from tf_family.attention.backend import NATIVE
from tf_family.attention.sliding_window import sliding_window_attention as _sliding_window_attention

B, H, DH = 3, 2, 8
pytestmark = pytest.mark.usefixtures("attention_backend")  # native kernel and PyTorch path alike


def sliding_window_attention(*args, implementation=NATIVE, **kwargs):
    """The kernel under tf_family's CPU implementation (the fixture picks the native kernel or the PyTorch path)."""
    return _sliding_window_attention(*args, implementation=implementation, **kwargs)


def _inputs(length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(B, H, length, DH, generator=generator, dtype=torch.float64) for _ in range(3)]
    for tensor in tensors:
        tensor.requires_grad_(True)
    # rows of different lengths: full, right-padded, left-padded
    padding = torch.ones(B, length, dtype=torch.bool)
    padding[1, length - 5 :] = False
    padding[2, :3] = False
    return tensors, padding


def _global(length, padding, positions):
    mask = torch.zeros(B, length, dtype=torch.bool)
    for row, cols in enumerate(positions):
        mask[row, cols] = True
    return GlobalTokens.from_mask(mask, padding)


def _check(fast_fn, reference_fn, tensors, padding, rows):
    """Compare outputs and gradients at real query positions (padded queries carry no meaning). The kernel runs
    twice: with gradients (on CPU, tf_family's `masked_attention`) and without (PyTorch's fused attention)."""
    weights = torch.randn(B, H, padding.shape[1], DH, dtype=torch.float64) * padding[:, None, :, None] * rows
    fast = fast_fn(*tensors)
    fast_grads = torch.autograd.grad((fast * weights).sum(), tensors)
    with torch.no_grad():
        fast_eval = fast_fn(*tensors)
    reference = reference_fn(*tensors)
    reference_grads = torch.autograd.grad((reference * weights).sum(), tensors)
    select = (padding[:, None, :, None] & rows).expand_as(fast)
    torch.testing.assert_close(fast[select], reference[select], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(fast_eval[select], reference[select], rtol=1e-9, atol=1e-10)
    for got, expected in zip(fast_grads, reference_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("length", [1, 13, 37])
@pytest.mark.parametrize("window", [0, 2, 5])
@pytest.mark.parametrize("dilation", [1, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_global", [False, True])
def test_sliding_window_matches_dense_twin(length, window, dilation, causal, with_global):
    tensors, padding = _inputs(length, seed=length + window)
    if length == 1:
        padding[:] = True
    pattern = WindowPattern(window, dilation, causal)
    global_tokens = None
    if with_global and length > 1:
        global_tokens = _global(
            length, padding, [[0, length - 1], [length // 2], [5 % length, 7 % length, 11 % length]]
        )
    _check(
        lambda q, k, v: sliding_window_attention(q, k, v, pattern, padding, global_tokens),
        lambda q, k, v: sliding_window_attention_reference(q, k, v, pattern, padding, global_tokens),
        tensors,
        padding,
        torch.tensor(True),
    )


@pytest.mark.parametrize("window", [2, 5, 150])
@pytest.mark.parametrize("dilation", [1, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_training_path_with_dropout_matches_dense_twin(window, dilation, causal):
    """Under dropout the kernel takes its own attention function (not PyTorch's): the native kernel with chunks of
    one window, or masked_attention with chunks of half a window. With a rate that rounds to no dropped entry it must
    give the twin's values and gradients."""
    length = 37 if window < 64 else 301  # 301 at window 150: chunks of 150 (native) or 75 queries
    tensors, padding = _inputs(length, seed=window)
    pattern = WindowPattern(window, dilation, causal)
    global_tokens = _global(length, padding, [[0, length - 1], [length // 2], [5, 7, 11]])
    _check(
        lambda q, k, v: sliding_window_attention(q, k, v, pattern, padding, global_tokens, dropout_p=1e-7),
        lambda q, k, v: sliding_window_attention_reference(q, k, v, pattern, padding, global_tokens),
        tensors,
        padding,
        torch.tensor(True),
    )


def test_dropout_is_unbiased():
    """Dropout on the attention probabilities keeps the expected output: the mean over many independent rows
    approaches the output without dropout."""
    rows, length = 4000, 13
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 1, length, 4, generator=generator).expand(rows, -1, -1, -1).contiguous()
                         for _ in range(3))  # fmt: skip
    pattern = WindowPattern(3)
    global_mask = torch.zeros(rows, length).index_fill(1, torch.tensor([6]), 1)
    torch.manual_seed(1)
    dropped = sliding_window_attention(
        query, key, value, pattern, None, GlobalTokens.from_mask(global_mask), dropout_p=0.3
    )
    exact = sliding_window_attention(
        query[:1], key[:1], value[:1], pattern, None, GlobalTokens.from_mask(global_mask[:1])
    )
    assert not torch.allclose(dropped[0], exact[0])
    torch.testing.assert_close(dropped.mean(0, keepdim=True), exact, atol=0.05, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_global_attention_matches_dense_twin(causal):
    length = 21
    tensors, padding = _inputs(length, seed=3)
    global_tokens = _global(length, padding, [[0, 4, 20], [3], [2, 3, 9, 15]])  # row 2: position 2 is padding
    assert global_tokens.valid.tolist() == [[True] * 3, [True, False, False], [True, True, True]]

    def fast(q, k, v):
        out = torch.zeros_like(q)
        result = global_attention(global_tokens.gather(q, dim=2), k, v, global_tokens, padding, causal)
        return global_tokens.scatter(out, result)

    rows = global_tokens.mask[:, None, :, None]
    _check(fast, lambda q, k, v: global_attention_reference(q, k, v, global_tokens, padding, causal), tensors,
           padding, rows)  # fmt: skip


def test_window_covering_the_sequence_is_full_attention():
    length = 11
    tensors, padding = _inputs(length)
    full = torch.nn.functional.scaled_dot_product_attention(*tensors, attn_mask=padding[:, None, None, :])
    windowed = sliding_window_attention(*tensors, WindowPattern(length), padding)
    select = padding[:, None, :, None].expand_as(full)
    torch.testing.assert_close(windowed[select], full[select])
    causal = torch.nn.functional.scaled_dot_product_attention(*tensors, is_causal=True)
    torch.testing.assert_close(sliding_window_attention(*tensors, WindowPattern(length, causal=True)), causal)


def test_mask_shape_and_rules():
    padding = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    globals_ = GlobalTokens.from_mask(torch.tensor([[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 1]]), padding)
    assert globals_.valid.tolist() == [[True], [False]]  # a padded token is never global
    mask = build_sliding_window_mask(WindowPattern(1, dilation=2), padding, globals_)
    assert mask.shape == (2, 6, 6)
    assert mask[0, 2].tolist() == [True, False, True, False, True, True]  # i-2, i, i+2 and the global token 5
    assert mask[1, 5].tolist() == [False, False, False, True, False, True]  # padded query: 3 (i-2) and itself
    assert GlobalTokens.from_mask(torch.zeros(2, 6), padding) is None
    with pytest.raises(ValueError, match="dilation"):
        WindowPattern(2, dilation=0)
    with pytest.raises(ValueError, match="window"):
        WindowPattern(-1)


@pytest.mark.parametrize("dropout_p", [0.0, 0.1])
def test_fast_path_memory_is_linear_in_length(dropout_p):
    """The fast path never builds a (T, T) tensor: what autograd saves grows linearly with T."""
    saved = {}
    for length in (512, 2048):
        query = torch.randn(1, 1, length, 4, requires_grad=True)
        sizes = []

        def pack(tensor, sizes=sizes):
            sizes.append(tensor.numel())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            globals_ = GlobalTokens.from_mask(torch.isin(torch.arange(length)[None], torch.tensor([0, 7, 300])))
            sliding_window_attention(query, query, query, WindowPattern(16), None, globals_, dropout_p).sum()
        saved[length] = sum(sizes)
    assert saved[2048] <= 4 * saved[512] * 1.1, saved
