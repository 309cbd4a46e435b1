"""The Sparse Transformer's factorised patterns: each efficient kernel agrees with its dense twin (values and
gradients, lengths that are not multiples of the stride, with and without ALiBi), and the patterns as the model
combines them (split across heads, or interleaved across layers) reach every earlier position in two hops."""

import pytest
import torch

from tf_family.attention import factorized, native
from tf_family.attention.alibi import alibi_slopes
from tf_family.attention.factorized import (
    FactorizedPattern,
    build_factorized_mask,
    factorized_attention,
    factorized_attention_reference,
)

B, H, DH = 2, 3, 8
PATTERNS = [
    FactorizedPattern("local", 4),
    FactorizedPattern("strided", 4),
    FactorizedPattern("block", 4),
    FactorizedPattern("summary", 4, summary_start=3, summary_size=1),
    FactorizedPattern("summary", 5, summary_start=1, summary_size=2),
]


def _inputs(length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, length, DH, generator=generator, dtype=torch.float64, requires_grad=True) for _ in "qkv"]


def _assert_twins_agree(tensors, weights, pattern, slopes, value_tol, grad_tol, implementation="sdpa"):
    """The efficient kernel and its dense twin: the same outputs and the same gradients of ``(out * weights).sum()``
    (tolerances as (rtol, atol)); returns the twin's output."""
    fast = factorized_attention(*tensors, pattern, slopes, implementation=implementation)
    reference = factorized_attention_reference(*tensors, pattern, slopes)
    torch.testing.assert_close(fast, reference, rtol=value_tol[0], atol=value_tol[1])
    fast_grads = torch.autograd.grad((fast * weights).sum(), tensors)
    reference_grads = torch.autograd.grad((reference * weights).sum(), tensors)
    for got, expected in zip(fast_grads, reference_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=grad_tol[0], atol=grad_tol[1])
    return reference


@pytest.mark.parametrize("implementation", ["sdpa", "tff_native"])  # tff_native: the native kernels (float64)
@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
@pytest.mark.parametrize("length", [1, 7, 12, 13])
@pytest.mark.parametrize("pattern", PATTERNS, ids=lambda p: f"{p.kind}{p.stride}-{p.summary_start}")
def test_kernel_matches_dense_twin(pattern, length, alibi, implementation):
    tensors = _inputs(length)
    slopes = alibi_slopes(H).double() if alibi else None
    weights = torch.randn(B, H, length, DH, dtype=torch.float64)
    tolerance = (1e-10, 1e-10)
    reference = _assert_twins_agree(tensors, weights, pattern, slopes, tolerance, tolerance, implementation)
    with torch.no_grad():  # without a gradient `attend` takes PyTorch's fused attention
        torch.testing.assert_close(factorized_attention(*tensors, pattern, slopes), reference, rtol=1e-6, atol=1e-6)


SUMMARIES = [p for p in PATTERNS if p.kind == "summary"]


@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
@pytest.mark.parametrize("slab_rows", [1, 8])
@pytest.mark.parametrize("length", [7, 12, 13, 23])
@pytest.mark.parametrize("pattern", SUMMARIES, ids=lambda p: f"{p.kind}{p.stride}-{p.summary_start}")
def test_summary_slabs_match_dense_twin(pattern, length, slab_rows, alibi, monkeypatch):
    """The summary kernel's query slabs (each against its causal prefix of summary keys), several per sequence: one
    block per slab (``slab_rows=1``) or two, the last one cut short by a length that is not a multiple."""
    monkeypatch.setattr(factorized, "SUMMARY_SLAB_ROWS", slab_rows)
    tensors = _inputs(length, seed=1)
    slopes = alibi_slopes(H).double() if alibi else None
    weights = torch.randn(B, H, length, DH, dtype=torch.float64)
    _assert_twins_agree(tensors, weights, pattern, slopes, (1e-10, 1e-10), (1e-10, 1e-10))


def test_summary_float32_long():
    """Float32 at a length with many slabs of the default size (each head its own sub-block of summary columns)."""
    generator = torch.Generator().manual_seed(2)
    tensors = [torch.randn(1, 2, 700, 16, generator=generator, requires_grad=True) for _ in "qkv"]
    weights = torch.randn(1, 2, 700, 16, generator=generator)
    for start in (0, 24):
        pattern = FactorizedPattern("summary", 32, summary_start=start, summary_size=8)
        _assert_twins_agree(tensors, weights, pattern, None, (1e-5, 1e-5), (1e-4, 1e-5))


# one call for several summary heads, each with its own summary columns (the fixed pattern's per-head sub-blocks)
PER_HEAD = [
    tuple(FactorizedPattern("summary", 4, summary_start=start, summary_size=1) for start in (3, 2, 3)),
    tuple(FactorizedPattern("summary", 6, summary_start=start, summary_size=2) for start in (4, 2, 0)),
]
needs_native = pytest.mark.skipif(native.extension() is None, reason="the native attention kernel could not be built")


@pytest.mark.parametrize("implementation", ["sdpa", "tff_native"])  # the slab kernel in Python, or the native one
@pytest.mark.parametrize("alibi", [False, True], ids=["plain", "alibi"])
@pytest.mark.parametrize("length", [1, 7, 13, 23])
@pytest.mark.parametrize("patterns", PER_HEAD, ids=["stride4", "stride6"])
def test_per_head_summary_columns_match_dense_twin(patterns, length, alibi, implementation, monkeypatch):
    """Summary heads with different summary columns in one call (the kernels' per-head ``starts``), query slabs or
    blocks of rows smaller than, and not a multiple of, the stride."""
    monkeypatch.setattr(factorized, "SUMMARY_SLAB_ROWS", 1)
    monkeypatch.setattr(factorized, "NATIVE_SUMMARY_ROWS", 5)
    tensors = _inputs(length, seed=3)
    slopes = alibi_slopes(H).double() if alibi else None
    weights = torch.randn(B, H, length, DH, dtype=torch.float64)
    _assert_twins_agree(tensors, weights, patterns, slopes, (1e-10, 1e-10), (1e-10, 1e-10), implementation)


def test_per_head_summary_columns_with_distance_aware_weights():
    """DA-Transformer's weights take the plain-autograd summary path: per-head columns there too."""
    from tf_family.layers.distance_aware import DistanceAwareScaling

    scaling = DistanceAwareScaling(H).double()
    with torch.no_grad():
        scaling.weight.copy_(torch.tensor([0.3, -0.2, 0.5]))
    tensors = _inputs(13, seed=4)
    weights = torch.randn(B, H, 13, DH, dtype=torch.float64)
    _assert_twins_agree(tensors, weights, PER_HEAD[1], scaling.heads(), (1e-10, 1e-10), (1e-10, 1e-10))


@needs_native
@pytest.mark.parametrize("rows", [1, 64, 128, 1000])
def test_native_summary_kernel_float32_long(rows, monkeypatch):
    """The native summary kernel in float32 at a length with many blocks of rows (one row, fewer rows than the
    stride, more, the whole sequence), two heads with their own columns, against the dense twin."""
    monkeypatch.setattr(factorized, "NATIVE_SUMMARY_ROWS", rows)
    generator = torch.Generator().manual_seed(5)
    tensors = [torch.randn(1, 2, 700, 16, generator=generator, requires_grad=True) for _ in "qkv"]
    weights = torch.randn(1, 2, 700, 16, generator=generator)
    patterns = tuple(FactorizedPattern("summary", 32, summary_start=start, summary_size=8) for start in (24, 16))
    _assert_twins_agree(tensors, weights, patterns, None, (1e-5, 1e-5), (1e-4, 1e-5), "tff_native")


@needs_native
def test_native_summary_kernel_does_not_depend_on_the_thread_count():
    """The work is dealt out by thread count (parts of a tile, each with its own summary-key gradients): one thread
    and two give the same values and gradients, up to the order of the partial sums."""
    tensors = _inputs(50, seed=6)
    pattern = FactorizedPattern("summary", 8, summary_start=6, summary_size=2)
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            out = factorized_attention(*tensors, pattern, implementation="tff_native")
            results.append((out, *torch.autograd.grad(out.square().sum(), tensors)))
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results, strict=True):
        torch.testing.assert_close(one, two, rtol=1e-12, atol=1e-12)


FACTORS = [FactorizedPattern(kind, 32) for kind in ("local", "strided", "block")]


@needs_native
@pytest.mark.parametrize("rows", [1, 5, 32, 1000])
@pytest.mark.parametrize("pattern", FACTORS, ids=lambda p: p.kind)
def test_native_factor_kernel_float32_long(pattern, rows, monkeypatch):
    """The native local / strided / block kernel in float32 at a length that is not a multiple of the stride, with
    chunks of one row, of rows that do not divide the stride, of the default size and of more rows than any group
    has; the heads handed over as views of a (B, T, 3 H Dh) projection (rows ``3 H Dh`` apart, read in place), the
    incoming gradient a transposed view too; against the dense twin, and through the native kernel."""
    monkeypatch.setattr(factorized, "NATIVE_FACTOR_ROWS", rows)
    generator = torch.Generator().manual_seed(7)
    fused = torch.randn(2, 700, 3, 3, 16, generator=generator)  # (B, T, q/k/v, H, Dh)
    tensors = [fused[:, :, i].transpose(1, 2).requires_grad_() for i in range(3)]  # (B, H, T, Dh) views
    weights = torch.randn(2, 700, 3, 16, generator=generator).transpose(1, 2)
    out = factorized_attention(*tensors, pattern, implementation="tff_native")
    assert type(out.grad_fn).__name__ == "_NativeFactorAttentionBackward"
    _assert_twins_agree(tensors, weights, pattern, None, (1e-5, 1e-5), (1e-4, 1e-5), "tff_native")


@needs_native
@pytest.mark.parametrize("pattern", FACTORS, ids=lambda p: p.kind)
def test_native_factor_kernel_takes_a_broadcast_gradient(pattern):
    """``out.sum()``'s gradient reaches the kernel as an expanded tensor (every stride 0), which it cannot read in place:
    it is copied first, and the gradients equal the dense twin's."""
    tensors = _inputs(40, seed=9)
    small = FactorizedPattern(pattern.kind, 6)
    fast = torch.autograd.grad(factorized_attention(*tensors, small, implementation="tff_native").sum(), tensors)
    reference = torch.autograd.grad(factorized_attention_reference(*tensors, small).sum(), tensors)
    for got, expected in zip(fast, reference, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


@needs_native
@pytest.mark.parametrize("pattern", FACTORS[:2], ids=lambda p: p.kind)
def test_native_factor_kernel_does_not_depend_on_the_thread_count(pattern):
    """The groups are spread over the threads (the local factor's in two passes, even groups then odd, since
    neighbours share keys): one thread and two give the same values and gradients, bit for bit."""
    tensors = _inputs(150, seed=8)
    slopes = alibi_slopes(H).double()
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            out = factorized_attention(
                *tensors, FactorizedPattern(pattern.kind, 7), slopes, implementation="tff_native"
            )
            results.append((out, *torch.autograd.grad(out.square().sum(), tensors)))
    finally:
        torch.set_num_threads(threads)
    for one, two in zip(*results, strict=True):
        torch.testing.assert_close(one, two, rtol=0, atol=0)


def test_per_head_patterns_must_agree_but_for_the_summary_columns():
    tensors = _inputs(8)
    with pytest.raises(ValueError, match="share kind, stride and summary_size"):
        mixed = (FactorizedPattern("summary", 4, 3, 1), FactorizedPattern("summary", 4, 2, 2), PER_HEAD[0][0])
        factorized_attention(*tensors, mixed)
    with pytest.raises(ValueError, match="one per head \\(3 heads\\)"):
        factorized_attention(*tensors, PER_HEAD[0][:2])


def test_masks_follow_the_paper():
    positions = torch.arange(10)
    local = build_factorized_mask(FactorizedPattern("local", 3), positions, positions)
    assert local[7].nonzero().flatten().tolist() == [5, 6, 7]
    strided = build_factorized_mask(FactorizedPattern("strided", 3), positions, positions)
    assert strided[7].nonzero().flatten().tolist() == [1, 4, 7]
    block = build_factorized_mask(FactorizedPattern("block", 3), positions, positions)
    assert block[7].nonzero().flatten().tolist() == [6, 7]
    summary = build_factorized_mask(FactorizedPattern("summary", 3, 2, 1), positions, positions)
    assert summary[7].nonzero().flatten().tolist() == [2, 5, 7]  # the last column of each block, and itself
    assert build_factorized_mask(FactorizedPattern("summary", 3, 2, 1), positions, positions).diagonal().all()


def _reaches_everything(first: torch.Tensor, second: torch.Tensor) -> bool:
    """Whether attention under ``first`` then ``second`` (bool ``(T, T)`` masks) carries every earlier position to
    every later one: ``(second @ first)[i, j] > 0`` for all ``j <= i``."""
    hops = (second.double() @ first.double()) > 0
    length = first.shape[0]
    return bool(torch.equal(hops, torch.ones(length, length, dtype=torch.bool).tril()))


def _layer_masks(config_kwargs, length):
    """The union over heads of every layer's mask, as the model builds its patterns."""
    from tf_family.models.sparse_transformer.configuration_sparse_transformer import TffSparseTransformerConfig
    from tf_family.models.sparse_transformer.modeling_sparse_transformer import layer_head_patterns

    config = TffSparseTransformerConfig(**config_kwargs)
    positions = torch.arange(length)
    masks = []
    for layer in range(config.num_hidden_layers):
        heads = [build_factorized_mask(p, positions, positions) for p in layer_head_patterns(config, layer)]
        masks.append(torch.stack(heads).any(0))
    return masks


@pytest.mark.parametrize("layout", ["heads", "layers"])
@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_two_hops_cover_the_past(pattern, layout):
    length = 200  # stride near sqrt(length), as in the paper
    kwargs = {
        "sparsity_pattern": pattern,
        "pattern_layout": layout,
        "stride": 14,
        "summary_size": 2,
        "num_attention_heads": 4,
        "hidden_size": 32,
        "num_hidden_layers": 2,
    }
    first, second = _layer_masks(kwargs, length)
    assert _reaches_everything(first, second)
    assert not first.all() or not second.all()  # and the patterns are sparse
    density = (first.sum() + second.sum()).item() / (2 * length * (length + 1) / 2)
    assert density < 0.45


@pytest.mark.parametrize("pattern", ["strided", "fixed"])
def test_one_factor_alone_does_not_cover(pattern):
    """The paper's point that both factors are needed: either factor's layer twice leaves positions unreached."""
    kwargs = {"sparsity_pattern": pattern, "pattern_layout": "layers", "stride": 7, "summary_size": 2}
    kwargs.update(num_attention_heads=4, hidden_size=32, num_hidden_layers=2)
    first, second = _layer_masks(kwargs, 50)
    assert not _reaches_everything(first, first)
    assert not _reaches_everything(second, second)


def test_pattern_validation():
    with pytest.raises(ValueError, match="kind"):
        FactorizedPattern("diagonal", 4)
    with pytest.raises(ValueError, match="summary_size"):
        FactorizedPattern("summary", 4, 0, 5)
    with pytest.raises(ValueError, match="summary_start"):
        FactorizedPattern("summary", 4, 3, 2)
