"""tf_family's native CPU attention kernel agrees with its dense twin, and its dropout is seeded and unbiased."""

import json
import warnings

import pytest
import torch

from tf_family.attention import attend, attention_backend, backend, masked_attention_reference, native

pytestmark = pytest.mark.skipif(native.extension() is None, reason="the native attention kernel could not be built")


def _inputs(shape=(3, 2, 5, 7, 4), dtype=torch.float64, seed=0):
    a, h, t, s, d = shape
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(a, h, t, d, generator=generator, dtype=dtype)
    key, value = (torch.randn(a, h, s, d, generator=generator, dtype=dtype) for _ in range(2))
    return [x.requires_grad_(True) for x in (query, key, value)]


def _masks(a, h, t, s, seed=1):
    """Masks broadcast over heads, over query rows, and full; every row keeps at least one key."""
    generator = torch.Generator().manual_seed(seed)
    over_heads = torch.rand(a, 1, t, s, generator=generator) > 0.4
    over_heads[..., -1] = True
    over_rows = torch.rand(a, h, 1, s, generator=generator) > 0.4
    over_rows[..., 0] = True
    full = torch.rand(a, h, t, s, generator=generator) > 0.7
    full[..., s // 2] = True
    return {"none": None, "over heads": over_heads, "over rows": over_rows, "full": full}


def _reference(tensors, allowed, kept, scale):
    bias = (
        None
        if allowed is None
        else torch.zeros(allowed.shape, dtype=tensors[0].dtype).masked_fill(~allowed, -torch.inf)
    )
    return masked_attention_reference(*tensors, bias, kept, scale)


@pytest.mark.parametrize("p", [0.0, 0.3])
@pytest.mark.parametrize("mask_kind", ["none", "over heads", "over rows", "full"])
@pytest.mark.parametrize("shape", [(3, 2, 5, 7, 4), (1, 2, 37, 2500, 4)], ids=["small", "row blocks"])
def test_fused_attention_matches_its_twin(p, mask_kind, shape):
    """Values and gradients against the plain-autograd twin given the kernel's own dropout mask. Rows of 2500 keys
    are taken 16 query rows at a time (16 + 16 + 5 here), their key and value gradients summed over the blocks."""
    a, h, t, s, _ = shape
    tensors = _inputs(shape)
    allowed = _masks(a, h, t, s)[mask_kind]
    seed = 1234
    kept, scale = native.fused_keep_mask((a, h, t, s), p, seed) if p else (None, 1.0)
    if p:
        assert not kept.all() and kept.any()
    weights = torch.randn(a, h, t, shape[-1], dtype=torch.float64)
    fast = native.fused_attention(*tensors, allowed, p, seed=seed)
    reference = _reference(tensors, allowed, kept, scale)
    torch.testing.assert_close(fast, reference, rtol=1e-12, atol=1e-12)
    grads = torch.autograd.grad((fast * weights).sum(), tensors)
    expected = torch.autograd.grad((reference * weights).sum(), tensors)
    for got, want in zip(grads, expected, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    if s < 100:
        torch.autograd.gradcheck(lambda q, k, v: native.fused_attention(q, k, v, allowed, p, seed=seed), tensors)


def test_float32_long_rows_match_pytorch():
    """float32 uses the kernel's own vectorised exp: rows of 1000 and of 5000 keys (in blocks of 16 query rows)
    agree with PyTorch's softmax attention."""
    for shape in ((2, 3, 64, 1000, 16), (2, 3, 40, 5000, 16)):
        _check_against_sdpa(shape)


def _check_against_sdpa(shape):
    tensors = _inputs(shape, dtype=torch.float32, seed=2)
    allowed = _masks(*shape[:4])["over heads"]
    fast = native.fused_attention(*tensors, allowed)
    sdpa = torch.nn.functional.scaled_dot_product_attention(*tensors, attn_mask=allowed)
    torch.testing.assert_close(fast, sdpa, rtol=1e-5, atol=2e-6)
    weights = torch.randn_like(fast)
    for got, want in zip(
        torch.autograd.grad((fast * weights).sum(), tensors),
        torch.autograd.grad((sdpa * weights).sum(), tensors),
        strict=True,
    ):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_dropout_rate_seed_and_threads():
    kept, scale = native.fused_keep_mask((1000, 1000), 0.1, seed=7)
    assert scale == 65536 / (65536 - 6554)  # the same rounding of p as dropout_mask
    assert abs(kept.float().mean().item() - 0.9) < 0.002  # 10^6 draws: 7 standard deviations
    assert ((kept.view(-1, 2).float().mean(0) - 0.9).abs() < 0.003).all()  # both halves of each hash are used
    assert torch.equal(kept, native.fused_keep_mask((1000, 1000), 0.1, seed=7)[0])
    assert not torch.equal(kept, native.fused_keep_mask((1000, 1000), 0.1, seed=8)[0])
    # a seed drawn from PyTorch's generator: torch.manual_seed reproduces the call, on any number of threads
    tensors = _inputs((4, 2, 33, 70, 8), dtype=torch.float32)
    torch.manual_seed(5)
    first = native.fused_attention(*tensors, None, 0.2)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        torch.manual_seed(5)
        again = native.fused_attention(*tensors, None, 0.2)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first, again)
    assert not torch.equal(first, native.fused_attention(*tensors, None, 0.2))


def test_dropout_is_unbiased():
    rows = 4000
    query, key, value = (x.detach()[:1, :1].expand(rows, 1, -1, -1).contiguous() for x in _inputs((1, 1, 6, 9, 4)))
    exact = native.fused_attention(query[:1], key[:1], value[:1])
    dropped = native.fused_attention(query, key, value, None, 0.3)
    assert not torch.allclose(dropped[0], exact[0])
    torch.testing.assert_close(dropped.mean(0, keepdim=True), exact, atol=0.05, rtol=0)


def test_gradient_checkpointing_replays_the_dropout_mask():
    tensors = _inputs((2, 2, 9, 11, 4))
    torch.manual_seed(0)
    plain = torch.autograd.grad(native.fused_attention(*tensors, None, 0.5).sum(), tensors)
    torch.manual_seed(0)
    out = torch.utils.checkpoint.checkpoint(
        lambda q, k, v: native.fused_attention(q, k, v, None, 0.5), *tensors, use_reentrant=False
    )
    for got, want in zip(torch.autograd.grad(out.sum(), tensors), plain, strict=True):
        torch.testing.assert_close(got, want)


def test_attend_uses_the_kernel_unless_turned_off(monkeypatch):
    monkeypatch.setattr(backend, "NATIVE_MIN_ROWS", 1)  # the kernel on tiles of any size
    tensors = _inputs()
    allowed = _masks(3, 2, 5, 7)["full"]
    calls = []
    real = native.fused_attention
    monkeypatch.setattr(native, "fused_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    on = attend(*tensors, allowed, None, 0.0, "tff_native")[0]
    assert calls == [1]
    attend(*tensors, allowed, None, 0.0, "sdpa")  # "sdpa" is PyTorch's, always
    assert calls == [1]
    monkeypatch.setenv("TF_FAMILY_NATIVE", "0")
    off = attend(*tensors, allowed, None, 0.0, "tff_native")[0]
    assert calls == [1]
    torch.testing.assert_close(on, off)


def test_bad_inputs_are_named():
    query, key, value = _inputs()
    with pytest.raises(ValueError, match="fused_attention takes query"):
        native.fused_attention(query, key[:, :1], value)
    with pytest.raises(ValueError, match="float32/float64"):
        native.fused_attention(query.half(), key.half(), value.half())


def test_a_failed_build_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(native, "_state", {})
    monkeypatch.setattr(native, "_build", lambda: (_ for _ in ()).throw(OSError("no compiler\ng++: not found")))
    with pytest.warns(RuntimeWarning, match="could not be built .*g\\+\\+: not found.*TF_FAMILY_NATIVE=0"):
        assert native.extension() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert native.extension() is None  # no second warning
        tensors = _inputs()
        assert attend(*tensors, torch.ones(3, 2, 5, 7, dtype=torch.bool), None, 0.0, "tff_native")[0].shape == (
            3,
            2,
            5,
            4,
        )


def test_the_kernel_needs_a_clear_margin():
    assert native.prefer_native(0.90, 1.0) and native.prefer_native(0.949, 1.0)
    assert not native.prefer_native(0.951, 1.0)  # a gain within the margin keeps the PyTorch path
    assert not native.prefer_native(1.0, 1.0) and not native.prefer_native(1.1, 1.0)
    assert native.prefer_native(0.97, 1.0, margin=0.0) and not native.prefer_native(0.97, 1.0, margin=0.05)
    with pytest.raises(ValueError, match="native_s=0"):
        native.prefer_native(0.0, 1.0)


def test_calibrate_is_an_explicit_step_that_writes_a_file(tmp_path):
    """`native.calibrate` measures the shapes it is given (contiguous and transposed keys apart: the kernel copies
    strided ones), writes the times and the verdict to the file named, and leaves the random state alone; nothing
    else measures, and no call of the attention reads the file."""
    contiguous = _inputs((1, 2, 6, 9, 4))
    strided = [t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in contiguous]
    assert not strided[1].is_contiguous()
    for tensors in (contiguous, strided):
        made = native._calibration_tensors(tensors, torch.Generator().manual_seed(0))
        assert [t.stride() for t in made] == [t.stride() for t in tensors]
        assert all(t.requires_grad and t.dtype == torch.float64 for t in made)
    state = torch.get_rng_state()
    path = tmp_path / "calibration.json"
    table = native.calibrate([(*contiguous, None, 0.0), (*strided, None, 0.1)], path)
    assert torch.equal(state, torch.get_rng_state())
    assert json.loads(path.read_text()) == table
    keys = sorted(table)
    assert len(keys) == 2 and any("layout=ccc" in k for k in keys) and any("layout=sss" in k for k in keys)
    for record in table.values():
        assert record["native_s"] > 0 and record["pytorch_s"] > 0
        assert record["native_faster"] == native.prefer_native(record["native_s"], record["pytorch_s"])
    path.unlink()  # the user may delete it: the attention never needed it
    assert attend(*contiguous, None, None, 0.0, "tff_native")[0].shape == contiguous[0].shape


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_reduced_precision_calls_match_the_twin_in_float32(monkeypatch, dtype):
    """Under autocast the attention gets bfloat16: the kernel computes it in float32 (forward and backward) and
    agrees with the float32 dense twin on the same inputs and dropout mask, to the dtype's rounding."""
    monkeypatch.setattr(backend, "NATIVE_MIN_ROWS", 1)
    tensors = [t.detach().to(dtype).requires_grad_() for t in _inputs((2, 2, 9, 13, 8))]
    allowed = _masks(2, 2, 9, 13)["over heads"]
    assert attention_backend(*tensors, 0.2) == "native"
    torch.manual_seed(3)
    seed = int(torch.randint(0, 2**62, ()))
    torch.manual_seed(3)
    out = attend(*tensors, allowed, None, 0.2, "tff_native")[0]
    assert out.dtype == dtype
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    grads = torch.autograd.grad((out.float() * weights).sum(), tensors)
    assert all(g.dtype == dtype for g in grads)
    upcast = [t.detach().float().requires_grad_() for t in tensors]
    kept, scale = native.fused_keep_mask((2, 2, 9, 13), 0.2, seed)
    want = _reference(upcast, allowed, kept, scale)
    want_grads = torch.autograd.grad((want * weights).sum(), upcast)
    tolerance = {"atol": 3e-2, "rtol": 3e-2}
    torch.testing.assert_close(out.float(), want, **tolerance)
    for got, expected in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(got.float(), expected, **tolerance)


def test_calibration_times_both_paths_and_leaves_the_random_state_alone():
    query, key, value = _inputs((2, 2, 8, 12, 4))
    allowed = torch.rand(2, 2, 8, 12, generator=torch.Generator().manual_seed(0)) > 0.3
    allowed[..., 0] = True
    state = torch.get_rng_state()
    times = native._time_paths(query, key, value, allowed, 0.1)
    assert torch.equal(state, torch.get_rng_state())
    assert set(times) == {"native", "pytorch"} and all(t > 0 for t in times.values())
