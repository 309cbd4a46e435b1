"""Longformer-specific behaviour: degenerate settings, the sparse/dense paths, rules for global tokens, errors."""

import pytest
import torch
from transformers import DynamicCache, RobertaConfig, RobertaModel

from tf_family import TffLongformerConfig, TffLongformerForCausalLM, TffLongformerModel, create_model
from tf_family.models.longformer.convert_longformer import convert_state_dict
from tf_family.models.longformer.modeling_longformer import separator_global_attention_mask


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


def test_covering_window_without_global_tokens_is_roberta():
    """A window that covers the input turns Longformer into RoBERTa (full attention) with the same weights."""
    torch.manual_seed(0)
    roberta = _perturbed(
        RobertaModel(
            RobertaConfig(
                vocab_size=61,
                hidden_size=24,
                num_hidden_layers=2,
                num_attention_heads=3,
                intermediate_size=40,
                max_position_embeddings=80,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                layer_norm_eps=1e-5,
                type_vocab_size=1,
            ),  # fmt: skip
            add_pooling_layer=False,
        )
    )
    ids = torch.randint(3, 61, (2, 29))
    mask = torch.ones_like(ids)
    ids[1, 20:], mask[1, 20:] = 1, 0
    for mode in ("sparse", "dense"):
        model = TffLongformerModel(_config(attention_window=64, attention_mode=mode), add_pooling_layer=False)
        weights = {f"longformer.{k}": v for k, v in roberta.state_dict().items()}
        weights = {k.removeprefix("longformer."): v for k, v in convert_state_dict(weights).items()}
        for name, tensor in model.state_dict().items():  # global projections: unused without global tokens
            weights.setdefault(name, tensor)
        model.load_state_dict(weights, strict=True)
        with torch.no_grad():
            got = model(ids, attention_mask=mask).last_hidden_state
            expected = roberta(ids, attention_mask=mask).last_hidden_state
        torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_sparse_and_dense_paths_agree_with_gradients(causal):
    """Dilated, per-layer windows, padding and global tokens: the chunked kernel equals the dense mask."""
    ids = torch.randint(3, 61, (3, 37), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 30:], mask[2, :4] = 0, 0
    global_mask = torch.zeros_like(ids)
    global_mask[0, [0, 17]], global_mask[2, 36] = 1, 1
    results = []
    for mode in ("sparse", "dense"):
        torch.manual_seed(0)
        model = _perturbed(
            TffLongformerModel(
                _config(attention_window=[4, 6], attention_dilation=[3, 1], causal=causal, attention_mode=mode)
            )  # fmt: skip
        )
        hidden = model(ids, attention_mask=mask, global_attention_mask=global_mask).last_hidden_state
        (hidden * mask[..., None]).pow(2).sum().backward()
        results.append((hidden[mask.bool()], {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-5)
    for name, grad in results[0][1].items():
        torch.testing.assert_close(grad, results[1][1][name], rtol=1e-4, atol=1e-5, msg=name)


def test_auto_mode_picks_a_path_per_call_and_mutates_nothing():
    model = _perturbed(TffLongformerModel(_config(attention_window=8)))
    config_before = model.config.to_dict()
    state_before = {k: v.clone() for k, v in model.state_dict().items()}
    layer = model.layers[0].attention
    assert layer.use_dense(5, False) and not layer.use_dense(50, False) and layer.use_dense(50, True)
    long_ids = torch.randint(3, 61, (1, 50))
    with torch.no_grad():
        before = model(long_ids).last_hidden_state
        model(long_ids[:, :5])  # a short batch must not change how the next long one is computed
        after = model(long_ids).last_hidden_state
    assert torch.equal(before, after)
    assert model.config.to_dict() == config_before
    assert all(torch.equal(v, state_before[k]) for k, v in model.state_dict().items())


def test_output_attentions_are_full_probabilities():
    model = _perturbed(TffLongformerModel(_config(attention_window=4)))
    ids = torch.randint(3, 61, (1, 11))
    global_mask = torch.zeros_like(ids)
    global_mask[0, 6] = 1
    out = model(ids, global_attention_mask=global_mask, output_attentions=True)
    probs = out.attentions[0]
    assert probs.shape == (1, 3, 11, 11)
    torch.testing.assert_close(probs.sum(-1), torch.ones(1, 3, 11))
    assert (probs[0, :, 0, 3:6] == 0).all() and (probs[0, :, 0, 6] > 0).all()  # window 2 per side + the global
    assert (probs[0, :, 6] > 0).all()  # the global token sees everything
    torch.testing.assert_close(out.last_hidden_state, model(ids, global_attention_mask=global_mask).last_hidden_state)


def test_causal_lm_with_dilation_generates_and_ignores_the_future():
    model = _perturbed(TffLongformerForCausalLM(_config(attention_window=[2, 4], attention_dilation=[2, 1])))
    assert model.config.causal and model.longformer.layers[0].attention.pattern.causal
    ids = torch.randint(3, 61, (2, 30))
    changed = ids.clone()
    changed[:, 20:] = 5
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits[:, :20], model(changed).logits[:, :20], rtol=0, atol=1e-6)
        generated = model.generate(ids[:, :6], attention_mask=torch.ones(2, 6), max_new_tokens=3, do_sample=False)
    assert generated.shape == (2, 9)
    loss = model(ids, labels=ids).loss
    assert torch.isfinite(loss)


def _causal_lm_and_prompt():
    """Windows much shorter than the prompt (so the cached path reads a slice), one dilated layer, left padding in
    row 1 and two global tokens in the prompt of row 0."""
    model = _perturbed(TffLongformerForCausalLM(_config(attention_window=[4, 6], attention_dilation=[2, 1])))
    ids = torch.randint(3, 61, (2, 14))
    mask = torch.ones_like(ids)
    ids[1, :3], mask[1, :3] = 1, 0
    global_mask = torch.zeros_like(ids)
    global_mask[0, [2, 12]] = 1  # 12 lies inside the windows of the first new tokens
    return model, ids, mask, global_mask


def test_key_value_cache_gives_the_full_forward_logits():
    model, ids, mask, global_mask = _causal_lm_and_prompt()
    more = torch.randint(3, 61, (2, 9))
    full_ids = torch.cat([ids, more], 1)
    full_mask = torch.cat([mask, torch.ones_like(more)], 1)
    full_global = torch.cat([global_mask, torch.zeros_like(more)], 1)
    with torch.no_grad():
        expected = model(full_ids, attention_mask=full_mask, global_attention_mask=full_global).logits
        out = model(ids, attention_mask=mask, global_attention_mask=global_mask, use_cache=True)
        assert isinstance(out.cache, DynamicCache) and out.cache.get_seq_length() == 14
        pieces, cache = [out.logits], out.cache
        for start, stop in ((14, 15), (15, 18), (18, 23)):  # one token, then several at a time
            step = model(
                full_ids[:, start:stop], attention_mask=full_mask[:, :stop], global_attention_mask=full_global[:, :stop],
                cache=cache, use_cache=True, output_attentions=stop == 23,  # the last through the dense path
            )  # fmt: skip
            pieces.append(step.logits)
            cache = step.cache
    got = torch.cat(pieces, 1)
    select = full_mask.bool()
    torch.testing.assert_close(got[select], expected[select], rtol=1e-5, atol=1e-5)
    probs = step.attentions[0]  # (B, H, new tokens, every position)
    assert probs.shape == (2, 3, 5, 23)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3, 5))
    assert (probs[0, :, :, 2] > 0).all() and (probs[0, :, :, 3:12] == 0).all()  # the global token; outside windows


def test_generate_with_the_cache_equals_generate_without():
    model, ids, mask, global_mask = _causal_lm_and_prompt()
    with torch.no_grad():
        kwargs = dict(attention_mask=mask, global_attention_mask=global_mask, max_new_tokens=12, do_sample=False)  # noqa: C408
        cached = model.generate(ids, **kwargs)
        uncached = model.generate(ids, use_cache=False, **kwargs)
    assert cached.shape == (2, 26)
    assert torch.equal(cached, uncached)


def test_cache_errors_name_the_argument():
    model, ids, mask, global_mask = _causal_lm_and_prompt()
    with torch.no_grad():
        cache = model(ids, attention_mask=mask, use_cache=True).cache
        with pytest.raises(ValueError, match="attention_mask must have shape .* plus the 14 cached positions"):
            model(ids[:, :1], attention_mask=mask[:, :1], cache=cache)
        late_global = torch.cat([global_mask, torch.ones(2, 1, dtype=torch.long)], 1)
        with pytest.raises(ValueError, match="global_attention_mask marks a new token as global"):
            model(ids[:, :1], attention_mask=torch.ones(2, 15), global_attention_mask=late_global, cache=cache)
    encoder = TffLongformerModel(_config(attention_window=4))
    with pytest.raises(ValueError, match="need a causal model"):
        encoder(ids, use_cache=True)


def test_gradient_checkpointing_turns_the_cache_off_in_training():
    model, ids, mask, _ = _causal_lm_and_prompt()
    model.activation_checkpointing_enable()
    model.train()
    out = model(ids, attention_mask=mask, labels=ids, use_cache=True)
    assert out.cache is None
    out.loss.backward()
    with pytest.raises(ValueError, match="cache cannot be used with gradient checkpointing"):
        model(ids, attention_mask=mask, cache=DynamicCache())


def test_question_rule_marks_tokens_before_the_first_separator():
    ids = torch.tensor([[0, 7, 8, 2, 2, 9, 9, 2], [0, 7, 2, 2, 9, 9, 2, 1], [0, 7, 7, 7, 9, 9, 9, 1]])
    assert separator_global_attention_mask(ids, 2).tolist() == [
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],  # no separator: no global token
    ]
    assert separator_global_attention_mask(ids, 2, before_separator=False)[0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]


def test_config_and_input_errors_name_the_field():
    with pytest.raises(ValueError, match="attention_window values must be even"):
        _config(attention_window=5)
    with pytest.raises(ValueError, match="attention_window has 3 entries but num_hidden_layers=2"):
        _config(attention_window=[2, 2, 2])
    with pytest.raises(ValueError, match="attention_dilation"):
        _config(attention_dilation=0)
    with pytest.raises(TypeError, match="attention_mode"):
        _config(attention_mode="fast")
    model = create_model("longformer", "base")
    with pytest.raises(ValueError, match="global_attention_mask must have shape"):
        model(torch.ones(2, 5, dtype=torch.long), global_attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(torch.full((1, 70), 5))
