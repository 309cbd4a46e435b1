"""The one dispatch: its eager, sdpa, native and masked paths agree, and every model gives the same outputs with
``attn_implementation="eager"`` and ``"sdpa"`` (the test behind each model's ``_supports_sdpa``)."""

import pytest
import torch

from tests.common.tester import build, main_output, make_inputs, without_labels
from tf_family.attention import attend, backend, preferred_chunk
from tf_family.registry import ARCHITECTURES


def _inputs(dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(2, 3, 5, 4, generator=generator, dtype=dtype)
    key, value = (torch.randn(2, 3, 7, 4, generator=generator, dtype=dtype) for _ in range(2))
    allowed = torch.rand(2, 1, 5, 7, generator=generator) > 0.5
    allowed[..., 2] = True  # every row keeps a key (PyTorch's SDPA and our CPU functions need one)
    weights = torch.randn(2, 3, 5, 4, generator=generator, dtype=dtype)
    return [t.requires_grad_(True) for t in (query, key, value)], allowed, weights


def _values_and_grads(inputs, weights, **kwargs):
    out, _ = attend(*inputs, **kwargs)
    return out, torch.autograd.grad((out * weights).sum(), inputs)


def _assert_same(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=1e-10, atol=1e-12)
    for got_grad, want_grad in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("masked", [True, False], ids=["mask", "no mask"])
def test_every_path_gives_the_same_values_and_gradients(attention_backend, masked):
    """float64, a gradient needed: ``"tff_native"`` takes our CPU function (the native kernel, or with the kernel
    turned off `masked_attention`); ``"sdpa"`` is PyTorch's SDPA; ``"eager"`` is the dense twin."""
    tensors, allowed, weights = _inputs()
    allowed = allowed if masked else None
    assert backend.attention_backend(*tensors, 0.0) == ("native" if attention_backend == "native" else "masked")
    assert backend.attention_backend(*tensors, 0.0, "sdpa") == "sdpa"
    ours = _values_and_grads(tensors, weights, allowed=allowed, implementation=backend.NATIVE)
    torch_sdpa = _values_and_grads(tensors, weights, allowed=allowed)
    eager = _values_and_grads(tensors, weights, allowed=allowed, implementation="eager")
    _assert_same(ours, torch_sdpa)
    _assert_same(eager, torch_sdpa)
    with torch.no_grad():  # eval: PyTorch's SDPA under every implementation but eager
        assert backend.attention_backend(*tensors, 0.0) == "sdpa"
        got = attend(*tensors, allowed, implementation=backend.NATIVE)[0]
        torch.testing.assert_close(got, torch_sdpa[0], rtol=1e-10, atol=1e-12)


def test_the_default_is_a_rule_by_device_and_dtype(monkeypatch):
    monkeypatch.delenv("TF_FAMILY_NATIVE", raising=False)
    native_here = backend.native.can_build()
    assert backend.default_implementation("cpu", torch.float32) == ("tff_native" if native_here else "sdpa")
    assert backend.default_implementation("cpu", torch.bfloat16) == backend.default_implementation("cpu")
    assert backend.default_implementation("cpu", torch.float64) == "sdpa"
    assert backend.default_implementation("cuda", torch.bfloat16) == "sdpa"
    assert backend.default_implementation("meta", torch.float32) == "sdpa"
    monkeypatch.setenv("TF_FAMILY_NATIVE", "0")  # the documented override: no kernel, so no native default
    assert backend.default_implementation("cpu", torch.float32) == "sdpa"


def test_an_additive_bias_with_fully_masked_rows():
    """Transformer-XL's way in: a float bias (with a gradient) masked by ``finfo.min``; a row with no allowed key
    then attends uniformly on every path. A bias stays on PyTorch's SDPA (our CPU functions pass it no gradient)."""
    tensors, allowed, weights = _inputs()
    allowed[0, 0, 1] = False  # a fully masked row
    bias = torch.randn(5, 7, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    bias.requires_grad_(True)
    leaves = [*tensors, bias]

    def run(implementation):
        out, probs = attend(*tensors, None, bias, 0.0, implementation)
        return out, probs, torch.autograd.grad((out * weights).sum(), leaves)

    sdpa_out, sdpa_probs, sdpa_grads = run("sdpa")
    eager_out, eager_probs, eager_grads = run("eager")
    assert sdpa_probs is None
    torch.testing.assert_close(eager_probs[0, :, 1], torch.full((3, 7), 1 / 7, dtype=torch.float64))
    torch.testing.assert_close(eager_out, sdpa_out, rtol=1e-10, atol=1e-12)
    for got, want in zip(eager_grads, sdpa_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_bias_and_mask_together():
    (query, key, value), allowed, _ = _inputs()
    bias = torch.randn(5, 7, dtype=torch.float64)
    with torch.no_grad():
        eager = attend(query, key, value, allowed, bias, 0.0, "eager")[0]
        torch.testing.assert_close(attend(query, key, value, allowed, bias)[0], eager, rtol=1e-10, atol=1e-12)


def test_eager_returns_probabilities_and_keeps_pytorch_dropout():
    (query, key, value), allowed, _ = _inputs(torch.float32)
    out, probs = attend(query, key, value, allowed, implementation="eager")
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, 5))
    assert not probs.masked_select(~allowed.expand_as(probs)).any()
    torch.manual_seed(0)
    dropped = attend(query, key, value, allowed, None, 0.5, "eager")[1]
    assert (dropped == 0).sum() > (probs == 0).sum()  # torch.nn.functional.dropout on the probabilities


def test_unknown_implementation_is_named():
    (query, key, value), allowed, _ = _inputs()
    with pytest.raises(ValueError, match="attention implementation must be one of .*'flash_attention_2'"):
        attend(query, key, value, allowed, implementation="flash_attention_2")


def test_flex_attention_computes_dense_calls_with_pytorch_sdpa():
    """A dense call of the ``"flex_attention"`` route (the sparse kernels take FlexAttention themselves,
    tests/attention/test_flex.py) is PyTorch's SDPA, never our CPU functions."""
    tensors, allowed, weights = _inputs()
    assert backend.attention_backend(*tensors, 0.0, "flex_attention") == "sdpa"
    _assert_same(
        _values_and_grads(tensors, weights, allowed=allowed, implementation="flex_attention"),
        _values_and_grads(tensors, weights, allowed=allowed, implementation="sdpa"),
    )


def test_preferred_chunk_follows_the_path():
    (query, key, value), _, _ = _inputs(torch.float32)
    with torch.no_grad():
        assert preferred_chunk(256, query, key, value, 0.0) == 256  # PyTorch's SDPA: one window
        assert preferred_chunk(256, query, key, value, 0.0, "eager") == 128  # the dense twin: half a window
        assert preferred_chunk(40, query, key, value, 0.0) == 64  # never below 64
    assert preferred_chunk(256, query, key, value, 0.1) == 256  # PyTorch's SDPA under dropout too
    expected = 256 if backend.native.extension() is not None else 128  # the kernel, else `masked_attention`
    assert preferred_chunk(256, query, key, value, 0.1, backend.NATIVE) == expected


# ---------------------------------------------------------------------------------- models: eager against sdpa
# Long enough for the sparse paths of the tiny configs: Longformer's sliding window (one-sided 2 and 3) and BigBird's
# block-sparse attention (blocks of 2, needing 8 blocks).
_LENGTH = {"longformer": 20, "big_bird": 20}


def _padded_inputs(spec, model, task):
    length = _LENGTH.get(spec.name, 12)
    inputs = without_labels(make_inputs(spec, model.config, task, batch=2, length=length))
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, :3] = 0  # left padding in the second row
    inputs["attention_mask"] = mask
    return inputs


def _outputs(spec, model, task, inputs):
    if not spec.memory_model:
        return [main_output(task, model(**inputs))]
    first = model(input_ids=inputs["input_ids"][:, :6], attention_mask=inputs["attention_mask"][:, :6])
    second = model(input_ids=inputs["input_ids"][:, 6:], mems=first.mems)  # attends to the padded memory
    return [first.logits, second.logits]


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_models_give_the_same_outputs_with_eager_and_sdpa(name):
    spec = ARCHITECTURES[name]
    if name == "knn_lm":
        pytest.skip("kNN-LM wraps a transformers model, whose attention transformers dispatches")
    task = "causal_lm" if "causal_lm" in spec.model_classes else next(iter(spec.model_classes))
    model = build(spec, task)
    if not type(model)._supports_sdpa:
        # kernelised attention (Performer, Linear Transformer, RFA) has no softmax kernel for attn_implementation to
        # choose
        pytest.skip(f"{name} declares no SDPA attention (_supports_sdpa = False)")
    assert model.config._attn_implementation == backend.default_implementation(dtype=torch.float32)  # the rule
    inputs = _padded_inputs(spec, model, task)
    with torch.no_grad():
        outputs = {}
        for implementation in ("sdpa", backend.NATIVE, "eager"):
            model.set_attn_implementation(implementation)
            assert model.config._attn_implementation == implementation
            outputs[implementation] = _outputs(spec, model, task, inputs)
    # padded query positions carry no promise (transformers' Llama differs there between eager and sdpa too): the
    # comparison covers the real tokens
    mask = inputs["attention_mask"].bool()

    def real(tensor):
        return tensor[mask] if tensor.shape[:2] == mask.shape else tensor

    for other in (backend.NATIVE, "eager"):
        for got, want in zip(outputs[other], outputs["sdpa"], strict=True):
            torch.testing.assert_close(real(got), real(want), rtol=1e-5, atol=1e-5)
