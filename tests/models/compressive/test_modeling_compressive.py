"""Compressive Transformer behaviour beyond the common tester."""

import re

import pytest
import torch

from tf_family import (
    CompressiveMemory,
    SegmentMemory,
    TffCompressiveConfig,
    TffCompressiveLMHeadModel,
    TffCompressiveModel,
    TffTransfoXLLMHeadModel,
)
from tf_family.memory import COMPRESSION_KINDS, mean_pool_compress
from tf_family.registry import get_arch

VOCAB = 128


def perturb(model, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def make_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return perturb(TffCompressiveLMHeadModel(get_arch("compressive").tiny_config(**overrides)).eval(), seed)


def tokens(batch, length, seed=0):
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------- cmem_len = 0 is Transformer-XL
# Every Transformer-XL parameter and where it goes in the Compressive Transformer. The module names happen to be
# the same (the layers are marked copies); the table is explicit so that a rename on either side fails here.
TRANSFO_XL_TO_COMPRESSIVE = [
    (r"transformer\.word_embeddings\.(layers|projections)\.(\d+)(\.weight)?", r"transformer.word_embeddings.\1.\2\3"),
    (
        r"transformer\.layers\.(\d+)\.attention\.(qkv|position_proj|out_proj)\.weight",
        r"transformer.layers.\1.attention.\2.weight",
    ),
    (r"transformer\.layers\.(\d+)\.attention\.(content_bias|position_bias)", r"transformer.layers.\1.attention.\2"),
    (
        r"transformer\.layers\.(\d+)\.attention\.layer_norm\.(weight|bias)",
        r"transformer.layers.\1.attention.layer_norm.\2",
    ),
    (
        r"transformer\.layers\.(\d+)\.feed_forward\.(fc_in|fc_out|layer_norm)\.(weight|bias)",
        r"transformer.layers.\1.feed_forward.\2.\3",
    ),
    (r"transformer\.(content_bias|position_bias)", r"transformer.\1"),
    (r"lm_head\.(cluster_weight|cluster_bias)", r"lm_head.\1"),
    (r"lm_head\.out_layers\.(\d+)\.(weight|bias)", r"lm_head.out_layers.\1.\2"),
    (r"lm_head\.projections\.(\d+)", r"lm_head.projections.\1"),
]


def map_transfo_xl_weights(state_dict: dict) -> dict:
    mapped = {}
    for key, value in state_dict.items():
        for pattern, replacement in TRANSFO_XL_TO_COMPRESSIVE:
            if re.fullmatch(pattern, key):
                mapped[re.sub(pattern, replacement, key)] = value
                break
        else:
            raise KeyError(f"no mapping for Transformer-XL parameter {key}")
    return mapped


TXL_FIELDS = {
    "vocab_size": VOCAB,
    "d_model": 32,
    "d_embed": 32,
    "n_head": 2,
    "d_head": 16,
    "d_inner": 64,
    "n_layer": 2,
    "clamp_len": 16,
    "dropout": 0.0,
}


@pytest.mark.parametrize(
    "overrides",
    [
        {"cutoffs": [32, 64], "div_val": 2, "mem_len": 8, "same_length": False},
        {"cutoffs": [], "div_val": 1, "mem_len": 6, "same_length": True, "untie_r": False, "pre_lnorm": True},
        {"cutoffs": [40], "div_val": 1, "d_embed": 16, "mem_len": 5, "same_length": False},
    ],
    ids=["adaptive", "plain_softmax_same_length", "projected"],
)
def test_no_compressed_memory_reproduces_transformer_xl(overrides):
    fields = {**TXL_FIELDS, **overrides}
    torch.manual_seed(0)
    reference = perturb(TffTransfoXLLMHeadModel(get_arch("transfo_xl").config_class(**fields)).eval())
    model = TffCompressiveLMHeadModel(TffCompressiveConfig(**fields, cmem_len=0, compression_rate=2)).eval()
    mapped = map_transfo_xl_weights(reference.state_dict())
    assert set(mapped) == set(model.state_dict()), "the mapping must cover every parameter of both models"
    model.load_state_dict(mapped)
    ids = tokens(2, 15)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding in one row
    ours = theirs = None
    with torch.no_grad():
        for start in range(0, 15, 5):  # three segments: the memory fills and then rolls over
            segment = slice(start, start + 5)
            theirs = reference(ids[:, segment], mems=theirs and theirs.mems, attention_mask=mask[:, segment])
            ours = model(ids[:, segment], mems=ours and ours.mems, attention_mask=mask[:, segment])
            torch.testing.assert_close(ours.logits, theirs.logits, rtol=0, atol=1e-6)
            for a, b in zip(ours.mems.memory.states, theirs.mems.states, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            assert torch.equal(ours.mems.memory.mask, theirs.mems.mask) and ours.mems.compressed.length == 0
        labels = ids[:, :5]
        torch.testing.assert_close(model(labels, labels=labels).loss, reference(labels, labels=labels).loss)


# --------------------------------------------------------------------------------------------- the memory update
def test_compressed_memory_holds_compressed_layer_inputs_fifo():
    """mean pooling, mem_len 4, cmem_len 3, rate 2, segments of 2: after six segments the compressed memory holds
    the means of positions (2, 3), (4, 5), (6, 7) of each layer's input, the memory positions 8..11."""
    model = make_model(mem_len=4, cmem_len=3, compression="mean_pool")
    ids = tokens(2, 12)
    inputs, mems = [], None
    with torch.no_grad():
        for start in range(0, 12, 2):
            out = model(ids[:, start : start + 2], mems=mems, output_hidden_states=True)
            mems = out.mems
            inputs.append(out.hidden_states[:-1])  # per layer, the states that entered it
            compressed_len = min(3, max(0, start // 2 - 1))
            assert mems.compressed.length == compressed_len and mems.memory.length == min(4, start + 2)
    for layer in range(2):
        stream = torch.cat([step[layer] for step in inputs], dim=1)  # (B, 12, D)
        expected = mean_pool_compress(stream[:, 2:8], torch.ones(2, 6, dtype=torch.bool), 2)[0]
        torch.testing.assert_close(mems.compressed.states[layer], expected)
        torch.testing.assert_close(mems.memory.states[layer], stream[:, 8:])


def test_attention_reads_compressed_memory():
    model = make_model(mem_len=4, cmem_len=4, compression="mean_pool")
    ids = tokens(2, 12)
    with torch.no_grad():
        first = model(ids[:, :8])
        assert first.mems.compressed.length == 2
        with_compressed = model(ids[:, 8:], mems=first.mems, output_attentions=True)
        without = model(ids[:, 8:], mems=CompressiveMemory.from_states(first.mems.memory.states))
    assert with_compressed.attentions[0].shape == (2, 2, 4, 2 + 4 + 4)  # [compressed, memory, segment]
    assert with_compressed.attentions[0][..., :2].sum() > 0
    assert not torch.allclose(with_compressed.logits, without.logits)


def test_segments_within_memory_equal_long_forward():
    model = make_model(mem_len=8)
    ids = tokens(2, 8)
    with torch.no_grad():
        first = model(ids[:, :4])
        second = model(ids[:, 4:], mems=first.mems)
        whole = model(ids)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), whole.logits, rtol=1e-5, atol=1e-5)


def test_reset_mems_forgets_both_memories_in_one_row():
    model = make_model(mem_len=4, cmem_len=4)
    ids = tokens(2, 14)
    with torch.no_grad():
        first = model(ids[:, :10])
        assert first.mems.compressed.length == 3
        carried = model(ids[:, 10:], mems=first.mems)
        reset = model(ids[:, 10:], mems=first.mems, reset_mems=torch.tensor([False, True]))
        fresh = model(ids[1:, 10:])
    torch.testing.assert_close(reset.logits[0], carried.logits[0], rtol=0, atol=0)
    torch.testing.assert_close(reset.logits[1], fresh.logits[0], rtol=1e-5, atol=1e-5)
    assert not reset.mems.compressed.mask[1].any() and reset.mems.compressed.mask[0].all()


@pytest.mark.parametrize("compression", ["conv", "most_used"])
def test_eager_and_sdpa_agree_with_both_memories_and_padding(compression):
    models = {}
    for implementation in ("eager", "sdpa"):
        config = get_arch("compressive").tiny_config(
            same_length=True, mem_len=4, compression=compression, attn_implementation=implementation
        )
        models[implementation] = TffCompressiveLMHeadModel(config).eval()
    models["sdpa"].load_state_dict(models["eager"].state_dict())
    ids = tokens(2, 14)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    results = {}
    for name, model in models.items():
        with torch.no_grad():
            first = model(ids[:, :10], attention_mask=mask[:, :10])
            results[name] = model(ids[:, 10:], mems=first.mems, attention_mask=mask).logits
        assert first.mems.compressed.length == 3
    torch.testing.assert_close(results["sdpa"], results["eager"], rtol=1e-5, atol=1e-5)
    models["sdpa"].set_attn_implementation("eager")
    assert models["sdpa"].config._attn_implementation == "eager"  # the layers read it at every call


# ---------------------------------------------------------------------------------------------- auxiliary losses
@pytest.mark.parametrize("compression", ["mean_pool", "max_pool", "conv"])
def test_reconstruction_loss_zero_for_identity_compression_positive_otherwise(compression):
    identity = make_model(mem_len=4, cmem_len=8, compression_rate=1, compression=compression).train()
    if compression == "conv":
        with torch.no_grad():
            for module in identity.transformer.compression:
                module.conv.weight.copy_(torch.eye(32)[..., None])
                module.conv.bias.zero_()
    ids = tokens(2, 10)
    out = identity(ids, labels=ids)
    assert out.attention_reconstruction_loss.item() == 0.0
    compressing = make_model(mem_len=4, cmem_len=8, compression_rate=2, compression=compression).train()
    out = compressing(ids, labels=ids)
    assert out.attention_reconstruction_loss.item() > 1e-4
    torch.testing.assert_close(out.loss, out.lm_loss + out.aux_loss)


def test_compression_network_is_trained_only_by_the_auxiliary_loss():
    model = make_model(mem_len=4, cmem_len=4, compression="conv", autoencoding_loss_weight=0.5).train()
    ids = tokens(2, 14)
    first = model(ids[:, :8], labels=ids[:, :8])
    out = model(ids[:, 8:], mems=first.mems, labels=ids[:, 8:])  # attends over a compressed memory
    assert out.mems.compressed.length == 4 and out.autoencoding_loss.item() > 0
    torch.testing.assert_close(out.aux_loss, out.attention_reconstruction_loss + 0.5 * out.autoencoding_loss)
    compression = {n for n, _ in model.named_parameters() if ".compression." in n}
    assert any(".decoder." in n for n in compression) and any(".conv." in n for n in compression)
    lm_grads = torch.autograd.grad(out.lm_loss, list(model.parameters()), allow_unused=True)
    aux_grads = torch.autograd.grad(out.aux_loss, list(model.parameters()), allow_unused=True)
    for (name, _), lm_grad, aux_grad in zip(model.named_parameters(), lm_grads, aux_grads, strict=True):
        if name in compression:
            assert lm_grad is None, f"the language-model loss reaches {name}"
            assert aux_grad is not None and aux_grad.abs().sum() > 0, f"the auxiliary loss misses {name}"
        else:
            assert aux_grad is None, f"the auxiliary loss reaches {name}"


def test_losses_reported_only_when_asked_and_zero_when_nothing_is_compressed():
    model = make_model(mem_len=8, cmem_len=4)
    ids = tokens(2, 6)
    with torch.no_grad():
        quiet = model(ids)
        short = model(ids, labels=ids)
    assert quiet.aux_loss is None and quiet.attention_reconstruction_loss is None
    assert short.attention_reconstruction_loss.item() == 0.0 and short.autoencoding_loss is None
    torch.testing.assert_close(short.loss, short.lm_loss)
    base = TffCompressiveModel(get_arch("compressive").tiny_config()).train()
    out = base(tokens(2, 12))
    assert out.aux_loss is not None and out.aux_loss.requires_grad


@pytest.mark.parametrize("compression", COMPRESSION_KINDS)
def test_every_compression_function_trains_and_fills_the_memory(compression):
    model = make_model(mem_len=4, cmem_len=4, compression=compression, compression_rate=3).train()
    ids = tokens(2, 14)
    first = model(ids[:, :9], labels=ids[:, :9])
    out = model(ids[:, 9:], mems=first.mems, labels=ids[:, 9:])
    assert first.mems.compressed.length == 1 and out.mems.compressed.length == 3  # 3 + 6 states left
    assert torch.isfinite(out.loss)
    out.loss.backward()
    grads = [p.grad for n, p in model.named_parameters() if ".compression." in n]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert bool(grads) == (compression in ("conv", "dilated_conv"))


def test_most_used_keeps_the_states_with_the_highest_average_usage_over_their_stay():
    """Segment 1 (4 tokens) fills the memory; segment 2 pushes those 4 states out. Each one's usage is the attention
    it received from both segments' queries (mean over heads) divided by the number of queries that could see it:
    4 - j in segment 1 (causal), 4 in segment 2. The two with the highest usage are kept, in order."""
    model = make_model(mem_len=4, cmem_len=4, compression="most_used", compression_rate=2)
    ids = tokens(2, 8)
    with torch.no_grad():
        first = model(ids[:, :4], output_attentions=True, output_hidden_states=True)
        second = model(ids[:, 4:], mems=first.mems, output_attentions=True)
    assert first.mems.compressed.length == 0 and second.mems.compressed.length == 2
    assert second.mems.usage[0].shape == (2, 4, 2)
    for layer in range(2):
        received = first.attentions[layer].mean(1).sum(1) + second.attentions[layer].mean(1).sum(1)[:, :4]
        usage = received / torch.tensor([4.0 + 4, 3 + 4, 2 + 4, 1 + 4])  # (B, 4)
        for row in range(2):
            kept = usage[row].topk(2).indices.sort().values
            expected = first.hidden_states[layer][row, kept]
            torch.testing.assert_close(second.mems.compressed.states[layer][row], expected)
        # the statistics of the states still in the memory: segment 2's attention over its own keys
        torch.testing.assert_close(second.mems.usage[layer][..., 0], second.attentions[layer].mean(1).sum(1)[:, 4:])
        assert second.mems.usage[layer][..., 1].tolist() == [[4.0, 3.0, 2.0, 1.0]] * 2
    beams = second.mems.index_select(torch.tensor([1, 1, 0]))
    assert torch.equal(beams.usage[1][0], second.mems.usage[1][1]) and beams.usage[1].shape[0] == 3


# ---------------------------------------------------------------------------------------------------- generation
def test_cached_generation_equals_feeding_tokens_one_by_one_with_both_memories():
    model = make_model(mem_len=4, cmem_len=4)
    prompt = tokens(2, 6)
    mask = torch.ones_like(prompt)
    mask[1, :3] = 0  # left padding: the padded states must stay invisible after compression too
    generated = model.generate(
        prompt, attention_mask=mask, max_new_tokens=10, do_sample=False, output_scores=True,
        return_dict_in_generate=True, pad_token_id=0,
    )  # fmt: skip
    with torch.no_grad():
        out = model(prompt, attention_mask=mask)
        assert out.mems.compressed.mask.tolist() == [[True], [False]]  # positions 0, 1: padding in row 1
        sequence, scores = prompt, []
        for _ in range(10):
            scores.append(out.logits[:, -1])
            next_token = out.logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, next_token], dim=1)
            mask = torch.cat([mask, torch.ones_like(next_token)], dim=1)
            out = model(next_token, mems=out.mems, attention_mask=mask)
    assert out.mems.compressed.length == 4  # the compressed memory filled and rolled over while decoding
    assert torch.equal(generated.sequences, sequence)
    for a, b in zip(generated.scores, scores, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("do_sample", [False, True])
def test_generation_within_memory_equals_full_recompute(do_sample):
    model = make_model(mem_len=16, cmem_len=4)
    prompt = tokens(2, 6)
    mask = torch.ones_like(prompt)
    mask[1, :2] = 0  # left padding
    outputs = []
    for use_cache in (True, False):
        torch.manual_seed(1234)
        outputs.append(
            model.generate(
                prompt, attention_mask=mask, max_new_tokens=8, do_sample=do_sample, use_cache=use_cache,
                output_scores=True, return_dict_in_generate=True, pad_token_id=0,
            )
        )  # fmt: skip
    assert torch.equal(outputs[0].sequences, outputs[1].sequences)
    for cached, full in zip(outputs[0].scores, outputs[1].scores, strict=True):
        torch.testing.assert_close(cached, full, rtol=1e-4, atol=1e-4)


def test_beam_search_reorders_both_memories():
    model = make_model(mem_len=16, cmem_len=4)
    prompt = tokens(2, 5)
    cached = model.generate(prompt, max_new_tokens=6, num_beams=3, do_sample=False, use_cache=True)
    full = model.generate(prompt, max_new_tokens=6, num_beams=3, do_sample=False, use_cache=False)
    assert torch.equal(cached, full)
    small = make_model(mem_len=2, cmem_len=2)
    out = small.generate(prompt, max_new_tokens=8, num_beams=3, do_sample=False)
    assert out.shape == (2, 13)
    memory = small(prompt).mems
    reordered = small._reorder_cache(memory, torch.tensor([1, 1]))
    assert torch.equal(reordered.compressed.states[0][0], memory.compressed.states[0][1])


# ---------------------------------------------------------------------------------------------------- validation
def test_memory_arguments_and_errors():
    model = make_model()
    ids = tokens(2, 5)
    with torch.no_grad():
        out = model(ids)
        from_segment = model(ids, mems=out.mems.memory).logits
        from_tensors = model(ids, mems=list(out.mems.memory.states)).logits
    torch.testing.assert_close(from_segment, from_tensors)
    assert isinstance(out.mems.memory, SegmentMemory)
    with pytest.raises(TypeError, match="mems must be a CompressiveMemory"):
        model(ids, mems="nope")
    with pytest.raises(ValueError, match="mems holds 2 batch rows but the input has 1"):
        model(ids[:1], mems=out.mems)
    with pytest.raises(ValueError, match="n_layer=2"):
        model(ids, mems=[torch.zeros(2, 3, 32)])
    with pytest.raises(ValueError, match=r"A 4D attention_mask must have shape \(B, 1, 5, 10\)"):
        model(ids, mems=out.mems, attention_mask=torch.ones(2, 1, 5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="labels must have shape"):
        model(ids, labels=ids[:, :3])


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="cmem_len=4 needs mem_len > 0"):
        TffCompressiveConfig(mem_len=0, cmem_len=4)
    with pytest.raises(ValueError, match="compression_rate must be >= 1"):
        TffCompressiveConfig(compression_rate=0)
    with pytest.raises(TypeError, match="compression"):
        TffCompressiveConfig(compression="zip")
    with pytest.raises(ValueError, match="attention_reconstruction_loss_weight must be >= 0"):
        TffCompressiveConfig(attention_reconstruction_loss_weight=-1.0)
    with pytest.raises(ValueError, match="cmem_length"):
        TffCompressiveConfig(cmem_length=3)
    config = TffCompressiveConfig(mem_len=0, cmem_len=0, same_length=False)
    assert config.model_type == "tff_compressive"


def test_no_memory_at_all():
    model = make_model(mem_len=0, cmem_len=0)
    ids = tokens(2, 6)
    with torch.no_grad():
        out = model(ids)
    assert out.mems is None
    assert model.generate(ids, max_new_tokens=3, do_sample=False).shape == (2, 9)
