"""Adaptive Attention Span (Sukhbaatar et al. 2019) as a Transformer-XL option (``adaptive_span=True``;
`tf_family.attention.adaptive_span`, `tf_family.layers.adaptive_span`): each rule of the paper as a test (the ramp,
the renormalisation, the penalty, the spans kept in range, the trimmed keys, the gradient to the spans), and the
common tester's checks on a model with the option."""

import dataclasses
from types import MappingProxyType

import pytest
import torch

from tests.common import tester
from tf_family.attention import attend
from tf_family.attention.adaptive_span import (
    adaptive_span_attention_reference,
    segment_distances,
    span_key_limit,
    span_log_mask,
    span_ramp,
)
from tf_family.layers.adaptive_span import AdaptiveSpanAttention
from tf_family.layers.gated_residual import GatedRelativeDecoderLayer
from tf_family.models.transfo_xl.modeling_transfo_xl import TffTransfoXLLMHeadModel
from tf_family.registry import get_arch

TRANSFO_XL = get_arch("transfo_xl")
# spans of 2 tokens (z / S = 0.25 of S = mem_len = 8) with a ramp of 2: the memory is trimmed to 4 of its 8 slots
SPAN = {"adaptive_span": True, "adaptive_span_ramp": 2, "adaptive_span_init": 0.25, "adaptive_span_round": 1}
ADAPTIVE_SPAN = dataclasses.replace(
    TRANSFO_XL,
    name="adaptive_span",
    variants=MappingProxyType({"tiny": {**TRANSFO_XL.variants["tiny"], **SPAN}}),
)


def _set_spans(model, fractions):
    """Give the heads of every layer the spans ``fractions`` (z / S, one row per layer)."""
    with torch.no_grad():
        for span, row in zip(model.transformer.adaptive_spans(), fractions, strict=True):
            span.span.copy_(torch.tensor(row))


def test_ramp_values_at_hand_computed_distances():
    """m_z(x) = clamp((R + z - x) / R, 0, 1): 1 up to z, linear to 0 at z + R, 0 beyond; future keys get 1."""
    distances = torch.tensor([[-1, 0, 2, 3, 4, 5, 9]])
    mask = span_ramp(distances, torch.tensor([2.5, 0.0]), ramp=2)
    expected_first = torch.tensor([1.0, 1.0, 1.0, 0.75, 0.25, 0.0, 0.0])  # (2 + 2.5 - x) / 2
    expected_second = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # z = 0: (2 - x) / 2
    torch.testing.assert_close(mask[0, 0], expected_first)
    torch.testing.assert_close(mask[1, 0], expected_second)
    log_mask = span_log_mask(distances, torch.tensor([2.5, 0.0]), ramp=2)
    assert torch.isinf(log_mask[0, 0, 5:]).all() and (log_mask[0, 0, 5:] < 0).all()
    torch.testing.assert_close(log_mask[0, 0, :5].exp(), expected_first[:5])
    torch.testing.assert_close(segment_distances(2, 4), torch.tensor([[2, 1, 0, -1], [3, 2, 1, 0]]))


def test_key_limit_counts_the_slots_a_span_reaches():
    assert span_key_limit(2.0, ramp=2, multiple=1) == 4  # slots 1..3 have distance < z + R = 4
    assert span_key_limit(2.5, ramp=2, multiple=1) == 5
    assert span_key_limit(2.5, ramp=2, multiple=64) == 64
    assert span_key_limit(70.0, ramp=32, multiple=64) == 128
    with pytest.raises(ValueError, match="multiple"):
        span_key_limit(1.0, ramp=2, multiple=0)


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_log_bias_equals_masking_the_softmax_and_renormalising(implementation):
    """The model adds log m to the scores; the dense twin masks the softmax weights and renormalises, as the paper
    writes it: same output and same gradients (queries, keys, values, spans), and the weights are renormalised.
    (Spans off the integers: where ``z + R`` is exactly a key's distance, the mask is at its kink and the two forms
    take different one-sided derivatives there; a span at 0 still gets a gradient from distances 1 .. R - 1.)"""
    generator = torch.Generator().manual_seed(0)
    batch, heads, queries, keys, width = 2, 3, 5, 9, 4

    def leaf(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64).requires_grad_()

    query, key, value = (
        leaf(batch, heads, queries, width),
        leaf(batch, heads, keys, width),
        leaf(batch, heads, keys, width),
    )
    bias = torch.randn(batch, heads, queries, keys, generator=generator, dtype=torch.float64)
    bias = bias.masked_fill(segment_distances(queries, keys) < 0, torch.finfo(torch.float64).min)  # causal
    spans = torch.tensor([0.25, 1.5, 5.7], dtype=torch.float64, requires_grad=True)
    fast, _ = attend(
        query, key, value, None, bias + span_log_mask(segment_distances(queries, keys), spans, 2), 0.0, implementation
    )
    slow, weights = adaptive_span_attention_reference(query, key, value, bias, spans, 2)
    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-10)
    grad = torch.randn(fast.shape, generator=generator, dtype=torch.float64)
    fast_grads = torch.autograd.grad(fast, (query, key, value, spans), grad)
    slow_grads = torch.autograd.grad(slow, (query, key, value, spans), grad)
    for a, b in zip(fast_grads, slow_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    assert fast_grads[3].abs().min() > 0
    at_zero = torch.zeros(3, dtype=torch.float64, requires_grad=True)  # the boundary z = 0: the ramp covers distance 1
    out, _ = attend(query, key, value, None, bias + span_log_mask(segment_distances(queries, keys), at_zero, 2))
    assert (torch.autograd.grad(out, at_zero, grad)[0] != 0).all()
    # renormalised: each row sums to 1, and is m * softmax / sum(m * softmax)
    torch.testing.assert_close(weights.sum(-1), torch.ones(batch, heads, queries, dtype=torch.float64))
    plain = (query @ key.transpose(-1, -2) * width**-0.5 + bias).softmax(-1)
    mask = span_ramp(segment_distances(queries, keys), spans, 2)
    torch.testing.assert_close(weights, plain * mask / (plain * mask).sum(-1, keepdim=True))


def test_attention_maps_are_zero_beyond_the_span_and_sum_to_one():
    model = tester.build(ADAPTIVE_SPAN, "causal_lm")
    _set_spans(model, [[0.25, 0.5], [0.0, 1.0]])  # z = 2, 4, 0, 8 tokens
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first = model(ids)
        maps = model(ids, mems=first.mems, output_attentions=True).attentions  # L x (1, H, 6, M + 6)
    key_length = first.mems.length + 6
    distances = segment_distances(6, key_length)
    for layer_maps, spans in zip(maps, ([2, 4], [0, 8]), strict=True):
        assert layer_maps.shape[-1] == key_length
        torch.testing.assert_close(layer_maps.sum(-1), torch.ones(1, 2, 6))
        for head, z in enumerate(spans):
            assert (layer_maps[0, head][distances >= z + 2] == 0).all()


def test_span_penalty_is_added_to_every_predicted_token():
    """span_loss = adaptive_span_loss * mean(z) over all heads of all layers, in tokens; loss = NLL + span_loss, and
    with num_items_in_batch (Trainer's accumulation) each micro-batch adds its share, so the accumulated loss counts
    it once."""
    model = tester.build(ADAPTIVE_SPAN, "causal_lm", adaptive_span_loss=0.01)
    _set_spans(model, [[0.25, 0.5], [0.0, 1.0]])
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[0, 4:] = -100
    out = model(ids, labels=labels)
    expected = 0.01 * torch.tensor([2.0, 4.0, 0.0, 8.0]).mean()
    torch.testing.assert_close(out.span_loss, expected)
    counted = labels[:, 1:] != -100
    nll = out.losses[counted].mean()
    torch.testing.assert_close(out.loss, nll + expected)
    halves = [model(ids[i : i + 1], labels=labels[i : i + 1], num_items_in_batch=int(counted.sum())) for i in (0, 1)]
    torch.testing.assert_close(halves[0].loss + halves[1].loss, nll + expected)
    assert model(ids).loss is None and model(ids).span_loss is not None
    plain = tester.build(TRANSFO_XL, "causal_lm")
    assert plain(ids, labels=ids).span_loss is None


@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_spans_stay_in_range_after_large_optimiser_steps(direction):
    """A real SGD step with a huge learning rate throws the parameter out of [0, 1]; the spans the model uses stay in
    range at once, a saved state dict holds the clamped value, and the next training forward clamps the parameter:
    no call after optimizer.step() is needed."""
    model = tester.build(ADAPTIVE_SPAN, "causal_lm", adaptive_span_loss=1.0)
    model.train()
    spans = model.transformer.adaptive_spans()
    optimizer = torch.optim.SGD([span.span for span in spans], lr=1000.0)
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        out = model(ids, labels=ids)
        for span in spans:
            assert (
                float(span.span.detach().min()) >= 0.0 and float(span.span.detach().max()) <= 1.0
            )  # clamped by the forward
        (direction * out.span_loss).backward()  # +1: shorter spans (the penalty), -1: longer
        optimizer.step()
        optimizer.zero_grad()
        raw = torch.cat([span.span.detach() for span in spans])
        assert (raw < 0).all() if direction > 0 else (raw > 1).all()  # thrown out of range by the step
        used = torch.cat([span.fractions().detach() for span in spans])
        torch.testing.assert_close(used, torch.full_like(used, 0.0 if direction > 0 else 1.0))
        saved = [value for key, value in model.state_dict().items() if key.endswith("adaptive_span.span")]
        assert len(saved) == 2 and all(((v >= 0) & (v <= 1)).all() for v in saved)


@pytest.mark.parametrize("multiple", [1, 3, 64])
def test_trimmed_memory_gives_the_untrimmed_output(multiple):
    """Trimming each layer's memory to the slots its spans reach gives exactly what the soft mask gives over the
    whole memory (the trimmed slots weigh 0), over four segments; the trimmed model reads and keeps fewer slots."""
    torch.manual_seed(0)
    trimmed = tester.build(ADAPTIVE_SPAN, "causal_lm", mem_len=16, adaptive_span_round=multiple)
    full = tester.build(ADAPTIVE_SPAN, "causal_lm", mem_len=16, adaptive_span_trim=False)
    full.load_state_dict(trimmed.state_dict())
    for model in (trimmed, full):
        _set_spans(model, [[0.1, 0.3], [0.05, 0.0]])  # z = 1.6, 4.8, 0.8, 0 tokens of S = 16
        model.double()
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    mems = {"trimmed": None, "full": None}
    with torch.no_grad():
        for start in (0, 5, 10, 15):
            segment = ids[:, start : start + 5]
            a = trimmed(segment, mems=mems["trimmed"], output_attentions=True)
            b = full(segment, mems=mems["full"], output_attentions=True)
            torch.testing.assert_close(a.logits, b.logits, rtol=1e-12, atol=1e-12)  # eager (attention maps)
            for kept, whole in zip(a.attentions, b.attentions, strict=True):  # the trimmed model keeps fewer slots
                keys = kept.shape[-1]
                torch.testing.assert_close(kept, whole[..., -keys:], rtol=1e-12, atol=1e-12)
                assert (whole[..., :-keys] == 0).all()
            sdpa = trimmed(segment, mems=mems["trimmed"]).logits  # the configured implementation
            torch.testing.assert_close(sdpa, full(segment, mems=mems["full"]).logits, rtol=1e-12, atol=1e-12)
            mems = {"trimmed": a.mems, "full": b.mems}
    assert mems["full"].length == 16
    assert mems["trimmed"].length == min(16, span_key_limit(4.8, 2, multiple))
    if multiple == 1:
        assert mems["trimmed"].length == 7


def test_trimming_reads_fewer_keys():
    """Each layer's attention gets only the memory slots its own spans reach (the saving is real: the keys are not
    computed for the rest)."""
    model = tester.build(ADAPTIVE_SPAN, "causal_lm", mem_len=16)
    _set_spans(model, [[0.25, 0.0], [0.0, 0.0]])  # layer 0 reaches 4 + 2 = 6 slots, layer 1 reaches 2
    seen = []  # the memory length each layer's attention projects keys for
    originals = [layer.attention.project for layer in model.transformer.layers]
    for layer, original in zip(model.transformer.layers, originals, strict=True):
        layer.attention.project = lambda hidden, memory, original=original: (
            seen.append(0 if memory is None else memory.shape[1]) or original(hidden, memory)
        )
    ids = torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        first = model(ids)
        seen.clear()
        model(ids[:, :3], mems=first.mems)
    assert first.mems.length == 6
    assert seen == [6, 2]


def _band(model, banded, multiple=4):
    for layer in model.transformer.layers:
        layer.attention.banded, layer.attention.band_multiple = banded, multiple
    return model


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_banded_attention_equals_its_dense_twin(implementation):
    """Queries in chunks, each reading only the keys within the widest span (rounded up) behind it, give the dense
    twin's output and gradients (inputs, every weight, the spans), float64, over a segment longer than the band and
    a trimmed memory (a previous segment's); and by default the model takes the banded path on such a segment."""
    torch.manual_seed(0)
    models = {}
    for banded in (True, False):
        model = tester.build(ADAPTIVE_SPAN, "causal_lm", mem_len=16, attn_implementation=implementation)
        _set_spans(model, [[0.1, 0.3], [0.05, 0.2]])  # z = 1.6, 4.8, 0.8, 3.2 tokens: reach 8 with multiple 4
        models[banded] = _band(model.double(), banded)
    ids = torch.randint(0, 128, (2, 30), generator=torch.Generator().manual_seed(1))
    outputs, grads = {}, {}
    for banded, model in models.items():
        with torch.no_grad():
            mems = model(ids[:, :10]).mems
        embeddings = model.get_input_embeddings()(ids[:, 10:]).detach().requires_grad_()
        out = model(inputs_embeds=embeddings, mems=mems, labels=ids[:, 10:])
        out.loss.backward()
        outputs[banded] = out.logits
        grads[banded] = [embeddings.grad] + [p.grad for p in model.parameters()]
    torch.testing.assert_close(outputs[True], outputs[False], rtol=1e-10, atol=1e-10)
    for a, b in zip(grads[True], grads[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    spans = [span.span.grad for span in models[True].transformer.adaptive_spans()]
    assert all((grad != 0).all() for grad in spans)

    model, keys_read = _band(models[True], None), []  # the default: banded where it reads fewer keys
    for layer in model.transformer.layers:
        original = layer.attention.banded_attention
        layer.attention.banded_attention = lambda q, k, v, inputs, reach, original=original: (
            keys_read.append((q.shape[-2], k.shape[-2], reach)) or original(q, k, v, inputs, reach)
        )
    with torch.no_grad():
        model(ids[:, 10:], mems=mems)
    assert [reach for *_, reach in keys_read] == [8, 8]  # each layer: the band, not the 20 + memory keys


def test_banded_attention_reads_only_the_band():
    """Each chunk of queries reads ``chunk + reach`` keys at most (the saving in time and memory is real): the
    score matrices the banded path hands to the attention are narrower than the dense twin's."""
    model = _band(tester.build(ADAPTIVE_SPAN, "causal_lm", mem_len=16), True)
    _set_spans(model, [[0.1, 0.1], [0.1, 0.1]])  # z = 1.6: reach ceil(3.6) -> 4
    widths = []
    import tf_family.layers.adaptive_span as layer_module

    original = layer_module.attend

    def counting(query, key, *args, **kwargs):
        widths.append(key.shape[-2])
        return original(query, key, *args, **kwargs)

    layer_module.attend = counting
    try:
        with torch.no_grad():
            model(torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(0)))
    finally:
        layer_module.attend = original
    assert widths and max(widths) <= 8 and len(widths) == 2 * 6  # 2 layers x 24 / 4 chunks of 4 + 4 keys


def test_gradients_reach_the_span_parameters_from_the_language_model_loss():
    """Without the penalty, the LM loss alone gives every span a finite non-zero gradient, also at z = 0 (the
    boundary: the ramp still covers distances 1 .. R - 1)."""
    model = tester.build(
        ADAPTIVE_SPAN, "causal_lm", adaptive_span_loss=0.0, adaptive_span_init=0.0, adaptive_span_ramp=4
    )
    model.train()
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    out = model(ids[:, :4])
    model(ids[:, 4:], mems=out.mems, labels=ids[:, 4:]).loss.backward()
    for span in model.transformer.adaptive_spans():
        assert span.span.grad is not None and torch.isfinite(span.span.grad).all()
        assert (span.span.grad != 0).all()


def test_save_load_keeps_the_spans(tmp_path):
    model = tester.build(ADAPTIVE_SPAN, "causal_lm")
    _set_spans(model, [[0.125, 0.75], [1.5, -0.5]])  # out of range: saved clamped
    model.save_pretrained(tmp_path)
    loaded = TffTransfoXLLMHeadModel.from_pretrained(tmp_path)
    assert loaded.config.adaptive_span and loaded.config.adaptive_span_max == 8
    kept = loaded.state_dict(keep_vars=True)  # in range: the hook leaves the parameters themselves
    for index, span in enumerate(loaded.transformer.adaptive_spans()):
        assert kept[f"transformer.layers.{index}.attention.adaptive_span.span"] is span.span
    got = [span.span.detach() for span in loaded.transformer.adaptive_spans()]
    torch.testing.assert_close(got, [torch.tensor([0.125, 0.75]), torch.tensor([1.0, 0.0])])
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model(ids).logits)


def test_a_fresh_model_starts_at_the_configured_span():
    model = TffTransfoXLLMHeadModel(ADAPTIVE_SPAN.tiny_config(adaptive_span_init=0.625))
    for span in model.transformer.adaptive_spans():
        torch.testing.assert_close(span.spans(), torch.full((2,), 5.0))  # 0.625 * S = 8
    assert isinstance(model.transformer.layers[0].attention, AdaptiveSpanAttention)


def test_combines_with_gtrxl():
    model = tester.build(ADAPTIVE_SPAN, "causal_lm", gating="gru", pre_lnorm=True)
    assert isinstance(model.transformer.layers[0], GatedRelativeDecoderLayer)
    assert isinstance(model.transformer.layers[0].attention, AdaptiveSpanAttention)
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(0))
    out = model(ids, labels=ids)
    out.loss.backward()
    assert model.transformer.layers[0].attention.adaptive_span.span.grad is not None


@pytest.mark.parametrize(
    ("overrides", "error", "match"),
    [
        ({"adaptive_span_ramp": 0}, ValueError, "adaptive_span_ramp"),
        ({"adaptive_span_init": 1.5}, ValueError, "adaptive_span_init"),
        ({"adaptive_span_loss": -1.0}, ValueError, "adaptive_span_loss"),
        ({"adaptive_span_round": 0}, ValueError, "adaptive_span_round"),
        ({"adaptive_span_max": 0}, ValueError, "adaptive_span_max"),
        ({"adaptive_span_max": 9}, ValueError, "exceeds mem_len=8"),
        ({"mem_len": 0}, ValueError, "adaptive_span_max is unset and mem_len=0"),
        ({"adaptive_span": "yes"}, TypeError, "adaptive_span"),
    ],
)
def test_config_errors_name_the_field(overrides, error, match):
    with pytest.raises(error, match=match):
        ADAPTIVE_SPAN.tiny_config(**overrides)


def test_config_defaults_and_span_within_a_segment():
    config = ADAPTIVE_SPAN.tiny_config()
    assert config.adaptive_span_max == config.mem_len == 8
    assert TRANSFO_XL.tiny_config().adaptive_span_max is None  # the option off: nothing derived
    no_memory = ADAPTIVE_SPAN.tiny_config(mem_len=0, adaptive_span_max=4)
    model = TffTransfoXLLMHeadModel(no_memory)
    ids = torch.randint(0, 128, (2, 6))
    assert model(ids).mems is None and model(ids, labels=ids).loss is not None


@pytest.mark.parametrize(
    "check",
    [
        tester.check_forward_shapes,
        tester.check_save_load,
        tester.check_gradients,
        tester.check_overfit,
        tester.check_padding_equivalence,
        tester.check_causality,
        tester.check_memory_equivalence,
        tester.check_generation_cache,
        tester.check_gradient_checkpointing,
        tester.check_determinism_and_rng,
        tester.check_bf16_autocast,
        tester.check_generation_from_inputs_embeds,
        tester.check_config_round_trip,
        tester.check_auto_from_config,
    ],
    ids=lambda check: check.__name__.removeprefix("check_"),
)
def test_adaptive_span_passes_the_common_checks(check):
    check(ADAPTIVE_SPAN)


def test_remote_code_export_loads_without_tf_family(tmp_path):
    """A model with the option saved with its code (`save_pretrained(remote_code=True)`) loads in a process that
    cannot import tf_family and gives the same outputs (span_loss included)."""
    from tests.test_remote_code import _export_and_expect, _load_without_tf_family

    folder, tensors = tmp_path / "causal_lm" / "model", tmp_path / "causal_lm.safetensors"
    _load_without_tf_family(
        {"causal_lm": _export_and_expect(ADAPTIVE_SPAN, "causal_lm", folder, tensors, tmp_path)}, tmp_path
    )
