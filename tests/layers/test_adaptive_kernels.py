"""The adaptive softmax's output product through oneDNN (tf_family.layers.adaptive_kernels) against its dense twin,
F.linear: the same values up to rounding, F.linear kept wherever oneDNN may not run, one fixed rule and no measuring unless asked."""

import json

import pytest
import torch
import torch.nn.functional as F

from tf_family.layers import ProjectedAdaptiveLogSoftmax, adaptive_kernels
from tf_family.registry import get_arch

needs_onednn = pytest.mark.skipif(not adaptive_kernels.onednn_available(), reason="this PyTorch has no oneDNN")


def _tensors(rows=24, inner=32, out=300, seed=0):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, inner, generator=generator)
    weight = torch.randn(out + 40, inner, generator=generator)[40:]  # a slice: rows after a storage offset
    bias = torch.randn(out, generator=generator)
    return hidden, weight, bias


@needs_onednn
@pytest.mark.parametrize("with_bias", [True, False])
def test_onednn_product_matches_its_dense_twin(with_bias):
    hidden, weight, bias = _tensors()
    bias = bias if with_bias else None
    torch.testing.assert_close(
        adaptive_kernels.onednn_linear(hidden, weight, bias), F.linear(hidden, weight, bias), rtol=1e-5, atol=1e-5
    )


@needs_onednn
@pytest.mark.parametrize("shape", [(60, 16, 16, [10, 20], 2), (60, 16, 8, [10, 20], 1), (60, 8, 8, [], 1)])
def test_adaptive_softmax_through_onednn_matches_f_linear(shape, monkeypatch):
    head = ProjectedAdaptiveLogSoftmax(*shape)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    hidden = torch.randn(9, shape[2], generator=generator)
    labels = torch.tensor([0, 9, 10, 19, 20, 59, 3, 33, -100])
    with torch.no_grad():
        monkeypatch.setenv(adaptive_kernels.ENV_VAR, "0")
        expected = head(hidden), head(hidden, labels)
        monkeypatch.setenv(adaptive_kernels.ENV_VAR, "force")
        got = head(hidden), head(hidden, labels)
    for value, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-5)


def test_products_that_need_a_gradient_stay_on_f_linear(monkeypatch):
    monkeypatch.setenv(adaptive_kernels.ENV_VAR, "force")
    hidden, weight, bias = _tensors()
    weight.requires_grad_()
    out = adaptive_kernels.output_linear(hidden, weight, bias)
    assert torch.equal(out, F.linear(hidden, weight, bias))
    out.sum().backward()
    assert weight.grad is not None
    with torch.no_grad():  # not float32: F.linear as well
        half = hidden.bfloat16(), weight.bfloat16(), bias.bfloat16()
        assert torch.equal(adaptive_kernels.output_linear(*half), F.linear(*half))


@needs_onednn
def test_the_rule_takes_onednn_for_large_products_only_and_measures_nothing(monkeypatch):
    monkeypatch.delenv(adaptive_kernels.ENV_VAR, raising=False)
    small = _tensors()
    hidden, weight, bias = _tensors(rows=64, inner=128, out=600)
    monkeypatch.setattr(adaptive_kernels, "MIN_MACS", hidden.shape[0] * hidden.shape[1] * weight.shape[0])
    calls, onednn_linear = [], adaptive_kernels.onednn_linear
    monkeypatch.setattr(adaptive_kernels, "onednn_linear", lambda *args: calls.append(1) or onednn_linear(*args))
    monkeypatch.setattr(adaptive_kernels, "interleaved_times", lambda *args, **kwargs: pytest.fail("timed a call"))
    with torch.no_grad():
        assert torch.equal(adaptive_kernels.output_linear(*small), F.linear(*small))  # under MIN_MACS
        assert not calls and not adaptive_kernels.uses_onednn(*small)
        first = adaptive_kernels.output_linear(hidden, weight, bias)
        second = adaptive_kernels.output_linear(hidden, weight, bias)
        assert len(calls) == 2 and adaptive_kernels.uses_onednn(hidden, weight, bias)
        monkeypatch.setenv(adaptive_kernels.ENV_VAR, "0")
        assert torch.equal(adaptive_kernels.output_linear(hidden, weight, bias), F.linear(hidden, weight, bias))
        assert len(calls) == 2
    torch.testing.assert_close(first, F.linear(hidden, weight, bias), rtol=1e-5, atol=1e-5)
    assert torch.equal(first, second)


@needs_onednn
def test_measure_is_explicit_and_writes_a_file_the_user_can_read(tmp_path):
    products = [_tensors(rows=16, inner=32, out=64), (_tensors()[0], _tensors()[1], None)]
    target = tmp_path / "sub" / "onednn.json"
    records = adaptive_kernels.measure(products, target)
    assert json.loads(target.read_text()) == records
    assert [record["shape"] for record in records] == [[16, 32, 64], [24, 32, 300]]
    assert [record["bias"] for record in records] == [True, False]
    for record in records:
        assert record["aten_s"] > 0 and record["onednn_s"] > 0
        assert record["onednn_faster"] == (record["onednn_s"] < record["aten_s"])
    assert [path.name for path in target.parent.iterdir()] == ["onednn.json"]  # nothing left beside it


def test_an_unknown_setting_is_refused_with_the_variable_named(monkeypatch):
    monkeypatch.setenv(adaptive_kernels.ENV_VAR, "fast")
    with pytest.raises(ValueError, match="TF_FAMILY_ONEDNN_LINEAR='fast'"):
        adaptive_kernels.output_linear(*_tensors())


@needs_onednn
def test_transfo_xl_evaluation_through_onednn_matches_f_linear(monkeypatch):
    from tf_family import TffTransfoXLLMHeadModel

    torch.manual_seed(0)
    model = TffTransfoXLLMHeadModel(get_arch("transfo_xl").tiny_config()).eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 12))
    calls, onednn_linear = [], adaptive_kernels.onednn_linear
    monkeypatch.setattr(adaptive_kernels, "onednn_linear", lambda *args: calls.append(1) or onednn_linear(*args))
    outputs = {}
    for setting in ("0", "force"):
        monkeypatch.setenv(adaptive_kernels.ENV_VAR, setting)
        with torch.no_grad():
            first = model(input_ids=ids[:, :6], labels=ids[:, :6])
            second = model(input_ids=ids[:, 6:], labels=ids[:, 6:], mems=first.mems)
        outputs[setting] = (first.logits, first.losses, second.logits, second.losses, len(calls))
    assert outputs["0"][-1] == 0 and outputs["force"][-1] > 0  # only the forced run went through oneDNN
    for got, expected in zip(outputs["force"][:-1], outputs["0"][:-1], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
