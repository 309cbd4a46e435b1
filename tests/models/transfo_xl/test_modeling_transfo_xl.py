"""Transformer-XL behaviour beyond the common tester."""

import pytest
import torch

from tf_family import SegmentMemory, TffTransfoXLConfig, TffTransfoXLForSequenceClassification, TffTransfoXLLMHeadModel
from tf_family.attention import build_causal_memory_mask
from tf_family.registry import get_arch

VOCAB = 128


def make_model(seed=0, **overrides):
    torch.manual_seed(seed)
    model = TffTransfoXLLMHeadModel(get_arch("transfo_xl").tiny_config(**overrides)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def tokens(batch, length, seed=0):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("mem_len", [3, 5])
def test_segments_with_memory_equal_long_forward_with_memory_window(mem_len):
    """Segment 2 sees only the last mem_len positions of segment 1: a long forward whose mask hides the rest of
    segment 1 from segment 2 gives the same outputs."""
    model = make_model(mem_len=mem_len)
    length = 6
    ids = tokens(2, 2 * length)
    with torch.no_grad():
        first = model(ids[:, :length])
        second = model(ids[:, length:], mems=first.mems)
        allowed = build_causal_memory_mask(2 * length, 0).clone()
        allowed[length:, : length - mem_len] = False  # what the memory does not cover
        whole = model(ids, attention_mask=allowed[None, None].expand(2, 1, -1, -1))
    assert first.mems.length == mem_len
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), whole.logits, rtol=1e-4, atol=1e-5)


def test_same_length_segments_equal_long_forward():
    model = make_model(mem_len=6, same_length=True)
    ids = tokens(2, 12)
    with torch.no_grad():
        first = model(ids[:, :6])
        second = model(ids[:, 6:], mems=first.mems)
        whole = model(ids)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), whole.logits, rtol=1e-4, atol=1e-5)


def test_three_segments_carry_memory_of_many_segments():
    model = make_model(mem_len=16)
    ids = tokens(2, 15)
    with torch.no_grad():
        mems, pieces = None, []
        for start in range(0, 15, 5):
            out = model(ids[:, start : start + 5], mems=mems)
            mems, pieces = out.mems, [*pieces, out.logits]
        whole = model(ids).logits
    assert mems.length == 15
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-4, atol=1e-5)


def test_mem_len_zero_means_no_recurrence():
    model = make_model(mem_len=0)
    ids = tokens(2, 10)
    with torch.no_grad():
        first = model(ids[:, :5])
        second = model(ids[:, 5:], mems=first.mems)
        alone = model(ids[:, 5:])
    assert first.mems is None and second.mems is None
    torch.testing.assert_close(second.logits, alone.logits, rtol=0, atol=0)
    with pytest.raises(ValueError, match="same_length=True"):
        get_arch("transfo_xl").tiny_config(mem_len=0, same_length=True)


def test_reset_mems_starts_a_new_document_in_one_row():
    model = make_model(mem_len=8)
    ids = tokens(2, 10)
    with torch.no_grad():
        first = model(ids[:, :5])
        carried = model(ids[:, 5:], mems=first.mems)
        reset = model(ids[:, 5:], mems=first.mems, reset_mems=torch.tensor([False, True]))
        fresh = model(ids[1:, 5:])
        # the reset row's stale slots stay masked in the memory it returns
        after = model(ids[:, :5], mems=reset.mems)
        reference = model(ids[1:, :5], mems=fresh.mems)
    torch.testing.assert_close(reset.logits[0], carried.logits[0], rtol=0, atol=0)
    torch.testing.assert_close(reset.logits[1], fresh.logits[0], rtol=1e-5, atol=1e-5)
    assert not reset.mems.mask[1, :3].any() and reset.mems.mask[1, 3:].all()
    torch.testing.assert_close(after.logits[1], reference.logits[0], rtol=1e-5, atol=1e-5)


def test_eager_and_sdpa_agree_with_memory_and_padding():
    models = {}
    for implementation in ("eager", "sdpa"):
        config = get_arch("transfo_xl").tiny_config(same_length=True, mem_len=6, attn_implementation=implementation)
        models[implementation] = TffTransfoXLLMHeadModel(config).eval()
    models["sdpa"].load_state_dict(models["eager"].state_dict())
    ids = tokens(2, 10)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    results = {}
    for name, model in models.items():
        assert model.config._attn_implementation == name
        with torch.no_grad():
            first = model(ids[:, :5], attention_mask=mask[:, :5])
            results[name] = model(ids[:, 5:], mems=first.mems, attention_mask=mask).logits
    torch.testing.assert_close(results["sdpa"], results["eager"], rtol=1e-5, atol=1e-5)
    models["sdpa"].set_attn_implementation("eager")
    assert models["sdpa"].config._attn_implementation == "eager"  # the layers read it at every call
    probs = models["sdpa"](ids[:, :5], output_attentions=True).attentions
    assert len(probs) == 2 and probs[0].shape == (2, 2, 5, 5)
    torch.testing.assert_close(probs[0].sum(-1), torch.ones(2, 2, 5))


@pytest.mark.parametrize("do_sample", [False, True])
def test_incremental_generation_equals_full_recompute(do_sample):
    model = make_model(mem_len=32)
    prompt = tokens(2, 6)
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0  # left padding
    outputs = []
    for use_cache in (True, False):
        torch.manual_seed(1234)
        outputs.append(
            model.generate(
                prompt, attention_mask=mask, max_new_tokens=12, do_sample=do_sample, use_cache=use_cache,
                output_scores=True, return_dict_in_generate=True, pad_token_id=0,
            )
        )  # fmt: skip
    assert torch.equal(outputs[0].sequences, outputs[1].sequences)
    for cached, full in zip(outputs[0].scores, outputs[1].scores, strict=True):
        torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-4)


def test_generation_beyond_memory_keeps_working():
    model = make_model(mem_len=4)
    out = model.generate(tokens(1, 3), max_new_tokens=10, do_sample=False)
    assert out.shape == (1, 13)


def test_tied_weights_and_variants():
    model = TffTransfoXLLMHeadModel(get_arch("transfo_xl").tiny_config())
    for index, layer in enumerate(model.lm_head.out_layers):
        assert layer.weight is model.transformer.word_embeddings.layers[index].weight
    assert model.lm_head.projections[1] is model.transformer.word_embeddings.projections[1]
    assert model.lm_head.projections[0] is not model.transformer.word_embeddings.projections[0]
    shared = make_model(untie_r=False, pre_lnorm=True, cutoffs=[], div_val=1, d_embed=16)
    assert shared.transformer.content_bias.shape == (2, 16)
    assert not hasattr(shared.transformer.layers[0].attention, "content_bias")
    out = shared(tokens(2, 6), labels=tokens(2, 6))
    out.loss.backward()
    assert shared.transformer.content_bias.grad is not None


def test_labels_loss_matches_logits_and_ignores_minus_100():
    model = make_model()
    ids = tokens(2, 9)
    labels = ids.clone()
    labels[0, 4:] = -100
    out = model(ids, labels=labels)
    assert out.logits is None  # adaptive softmax: only the losses are computed
    logprobs = model(ids).logits
    targets = labels[:, 1:]
    expected = -logprobs[:, :-1].gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1) * (targets != -100)
    torch.testing.assert_close(out.losses, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, expected.sum() / (targets != -100).sum())


def test_sequence_classification_with_memory():
    torch.manual_seed(0)
    model = TffTransfoXLForSequenceClassification(get_arch("transfo_xl").tiny_config(num_labels=3)).eval()
    ids = tokens(2, 10)
    first = model(ids[:, :5])
    out = model(ids[:, 5:], mems=first.mems, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and out.mems.length == 8 and torch.isfinite(out.loss)


def test_bad_inputs_give_clear_errors():
    model = make_model()
    ids = tokens(2, 5)
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        model(ids, inputs_embeds=torch.randn(2, 5, 32))
    with pytest.raises(ValueError, match="mems holds 2 batch rows but the input has 1"):
        model(ids[:1], mems=model(ids).mems)
    with pytest.raises(ValueError, match="n_layer=2"):
        model(ids, mems=[torch.zeros(2, 3, 32)])
    with pytest.raises(TypeError, match="mems must be"):
        model(ids, mems="nope")
    with pytest.raises(ValueError, match="labels must have shape"):
        model(ids, labels=ids[:, :3])
    with pytest.raises(ValueError, match="A 4D attention_mask"):
        model(ids, attention_mask=torch.ones(2, 1, 5, 4, dtype=torch.bool))


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="cutoffs must be strictly increasing"):
        TffTransfoXLConfig(vocab_size=100, cutoffs=[50, 20])
    with pytest.raises(ValueError, match="div_val=8"):
        TffTransfoXLConfig(vocab_size=100, cutoffs=[20, 50], d_embed=32, d_model=32, div_val=8)
    with pytest.raises(TypeError, match="mem_len"):
        TffTransfoXLConfig(mem_len="long")
    with pytest.raises(ValueError, match="mem_length"):
        TffTransfoXLConfig(mem_length=10)
    with pytest.raises(ValueError, match="mem_len must be >= 0"):
        TffTransfoXLConfig(mem_len=-1)


def test_memory_object_round_trip_through_plain_tensors():
    model = make_model()
    ids = tokens(2, 10)
    with torch.no_grad():
        first = model(ids[:, :5])
        from_object = model(ids[:, 5:], mems=first.mems).logits
        from_tensors = model(ids[:, 5:], mems=list(first.mems.states)).logits
    assert isinstance(first.mems, SegmentMemory)
    torch.testing.assert_close(from_object, from_tensors)


def test_beam_search_reorders_the_memory():
    model = make_model(mem_len=32)
    prompt = tokens(2, 5)
    cached = model.generate(prompt, max_new_tokens=6, num_beams=3, do_sample=False, use_cache=True)
    full = model.generate(prompt, max_new_tokens=6, num_beams=3, do_sample=False, use_cache=False)
    assert torch.equal(cached, full)
