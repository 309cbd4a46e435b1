"""Longformer's rotary and ALiBi positions (issue 39, item 5): the chunked window kernel equals its dense twin with
each option (values and gradients, float64, padding, global tokens, dilation), the cached decoder equals the full
forward, config errors, and a save/load round trip."""

import pytest
import torch

from tf_family import TffLongformerConfig, TffLongformerForCausalLM, TffLongformerModel
from tf_family.attention import GlobalTokens, WindowPattern
from tf_family.attention.alibi import alibi_slopes
from tf_family.attention.sliding_window import (
    sliding_window_alibi_bias,
    sliding_window_attention,
    sliding_window_attention_reference,
)
from tf_family.models.longformer.convert_longformer import translate_config


def _config(**overrides):
    values = dict(  # noqa: C408
        vocab_size=61, hidden_size=24, num_hidden_layers=2, num_attention_heads=3, intermediate_size=40,
        max_position_embeddings=80, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return TffLongformerConfig(**{**values, **overrides})


def _perturbed(model):
    torch.manual_seed(3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    return model.eval()


def _inputs(length=37):
    ids = torch.randint(3, 61, (3, length), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 30:], mask[2, :4] = 0, 0  # right and left padding
    global_mask = torch.zeros_like(ids)
    global_mask[0, [0, 17]], global_mask[2, 36] = 1, 1
    return ids, mask, global_mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dilation", [1, 2])
def test_alibi_window_kernel_equals_its_dense_twin_in_float64(causal, dilation):
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, 3, 29, 4, dtype=torch.float64, generator=generator) for _ in range(3))
    for tensor in (query, key, value):
        tensor.requires_grad_(True)
    valid = torch.ones(2, 29, dtype=torch.bool)
    valid[1, :5] = False
    global_mask = torch.zeros(2, 29, dtype=torch.long)
    global_mask[0, [3, 20]] = 1
    global_tokens = GlobalTokens.from_mask(global_mask, valid)
    pattern, slopes = WindowPattern(3, dilation, causal), alibi_slopes(3).double() * 4  # steep: distance matters
    got = sliding_window_attention(query, key, value, pattern, valid, global_tokens, slopes=slopes)
    expected = sliding_window_attention_reference(query, key, value, pattern, valid, global_tokens, slopes=slopes)
    without = sliding_window_attention_reference(query, key, value, pattern, valid, global_tokens)
    rows = valid[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[rows], expected[rows], rtol=1e-10, atol=1e-10)
    assert (expected - without)[rows].abs().max() > 1e-2  # the bias changes the result
    grads = torch.autograd.grad((got * rows).pow(2).sum(), (query, key, value))
    expected_grads = torch.autograd.grad((expected * rows).pow(2).sum(), (query, key, value))
    for name, grad, reference in zip("qkv", grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, reference, rtol=1e-10, atol=1e-10, msg=name)


def test_alibi_bias_convention_distance_and_no_bias_on_global_keys():
    slopes = alibi_slopes(2)
    global_mask = torch.zeros(1, 6, dtype=torch.long)
    global_mask[0, 4] = 1
    global_tokens = GlobalTokens.from_mask(global_mask, torch.ones(1, 6, dtype=torch.bool))
    bias = sliding_window_alibi_bias(slopes, 6, global_tokens)
    assert bias.shape == (1, 2, 6, 6)
    assert bias[0, 0, 1, 3] == bias[0, 0, 3, 1] == -2 * slopes[0]  # -m |i - j|, both directions
    assert (bias[..., 4] == 0).all() and bias[0, 1, 0, 5] == -5 * slopes[1]


@pytest.mark.parametrize("option", ["rotary", "alibi"])
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_and_dense_models_agree_with_each_position_option(option, causal):
    """Per-layer dilated windows, padding on both sides, global tokens, float64: values and every gradient."""
    ids, mask, global_mask = _inputs()
    if causal:
        global_mask[2, 36] = 0  # (a causal global token late in a row is legal; kept for the bidirectional case)
    results = []
    for mode in ("sparse", "dense"):
        torch.manual_seed(0)
        config = _config(
            attention_window=[4, 6], attention_dilation=[3, 1], causal=causal, attention_mode=mode,
            position_embedding_type=option,
        )  # fmt: skip
        model = _perturbed(TffLongformerModel(config)).double()
        hidden = model(ids, attention_mask=mask, global_attention_mask=global_mask).last_hidden_state
        (hidden * mask[..., None]).pow(2).sum().backward()
        results.append((hidden[mask.bool()], {n: p.grad for n, p in model.named_parameters()}))
    assert model.embeddings.position_embeddings is None
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-10, atol=1e-10)
    for name, grad in results[0][1].items():
        if grad is not None:
            torch.testing.assert_close(grad, results[1][1][name], rtol=1e-9, atol=1e-10, msg=name)


def test_the_options_change_the_model_and_padding_changes_nothing():
    ids, mask, global_mask = _inputs()
    outputs = {}
    for option in ("absolute", "rotary", "alibi"):
        torch.manual_seed(0)
        model = _perturbed(TffLongformerModel(_config(attention_window=4, position_embedding_type=option)))
        with torch.no_grad():
            outputs[option] = model(ids[2:], attention_mask=mask[2:]).last_hidden_state[0, 4:]
            unpadded = model(ids[2:, 4:]).last_hidden_state[0]  # the same real tokens without the left padding
        torch.testing.assert_close(outputs[option], unpadded, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(outputs["rotary"], outputs["alibi"], atol=1e-3)


@pytest.mark.parametrize("option", ["rotary", "alibi"])
def test_key_value_cache_gives_the_full_forward_logits(option):
    config = _config(attention_window=[4, 6], attention_dilation=[2, 1], position_embedding_type=option)
    model = _perturbed(TffLongformerForCausalLM(config))
    ids = torch.randint(3, 61, (2, 23), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 1, 0
    global_mask = torch.zeros_like(ids)
    global_mask[0, [2, 12]] = 1  # 12 lies inside the windows of the first new tokens
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, global_attention_mask=global_mask).logits
        out = model(
            ids[:, :14], attention_mask=mask[:, :14], global_attention_mask=global_mask[:, :14], use_cache=True
        )
        pieces, cache = [out.logits], out.cache
        for start, stop in ((14, 15), (15, 18), (18, 23)):
            step = model(
                ids[:, start:stop], attention_mask=mask[:, :stop], global_attention_mask=global_mask[:, :stop],
                cache=cache, use_cache=True, output_attentions=stop == 23,  # the last through the dense path
            )  # fmt: skip
            pieces.append(step.logits)
            cache = step.cache
    got = torch.cat(pieces, 1)
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], rtol=1e-5, atol=1e-5)


def test_rotary_and_alibi_read_past_max_position_embeddings():
    for option in ("rotary", "alibi"):
        model = TffLongformerModel(_config(attention_window=4, position_embedding_type=option)).eval()
        with torch.no_grad():
            assert model(torch.randint(3, 61, (1, 120))).last_hidden_state.shape == (1, 120, 24)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        TffLongformerModel(_config(attention_window=4))(torch.randint(3, 61, (1, 120)))


def test_config_errors_name_the_field():
    with pytest.raises((TypeError, ValueError), match="position_embedding_type"):
        _config(position_embedding_type="learned")
    with pytest.raises(ValueError, match="rotary.*odd"):
        _config(hidden_size=15, num_attention_heads=3, position_embedding_type="rotary")
    with pytest.raises(ValueError, match="rope_base"):
        _config(position_embedding_type="rotary", rope_base=0.0)
    with pytest.raises(ValueError, match="position_embedding_type='alibi' cannot load"):
        translate_config(_config().to_dict(), position_embedding_type="alibi")
    assert translate_config(_config().to_dict()).position_embedding_type == "absolute"


@pytest.mark.parametrize("option", ["rotary", "alibi"])
def test_save_and_load_round_trip(option, tmp_path):
    model = _perturbed(TffLongformerModel(_config(attention_window=4, position_embedding_type=option)))
    model.save_pretrained(tmp_path)
    loaded = TffLongformerModel.from_pretrained(tmp_path).eval()
    assert loaded.config.position_embedding_type == option
    assert not any("position_embeddings" in name for name in loaded.state_dict())
    ids, mask, global_mask = _inputs()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, global_attention_mask=global_mask).last_hidden_state
        got = loaded(ids, attention_mask=mask, global_attention_mask=global_mask).last_hidden_state
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
