"""Sparse Transformer: the efficient path equals the dense masked twin (values and gradients, both patterns and
layouts, every position type, left and right padding, lengths that are not multiples of the stride); the efficient
path builds no ``T x T`` tensor; cached generation equals uncached; config errors name the field."""

import pytest
import torch

import tf_family.attention.blockwise as blockwise_module
import tf_family.attention.distance_aware as distance_aware_module
import tf_family.attention.factorized as factorized_module
import tf_family.attention.image_local as image_local_module
import tf_family.models.sparse_transformer.modeling_sparse_transformer as modeling
from tf_family import create_model
from tf_family.attention import native

SETTINGS = [
    {"sparsity_pattern": "strided", "pattern_layout": "heads", "position_embedding_type": "absolute"},
    {"sparsity_pattern": "strided", "pattern_layout": "layers", "position_embedding_type": "rotary"},
    {"sparsity_pattern": "fixed", "pattern_layout": "heads", "position_embedding_type": "alibi", "summary_size": 2},
    {"sparsity_pattern": "fixed", "pattern_layout": "layers", "position_embedding_type": "rotary"},
    {"sparsity_pattern": "strided", "pattern_layout": "heads", "position_embedding_type": "alibi", "stride": 5},
    {"sparsity_pattern": "local_1d", "stride": 4, "memory_length": 3, "position_embedding_type": "rotary"},
    {
        "sparsity_pattern": "local_2d",
        "image_width": 6,
        "block_height": 2,
        "block_width": 3,
        "memory_height": 1,
        "memory_width": 1,
    },
    {"sparsity_pattern": "blockwise", "stride": 3, "position_embedding_type": "absolute"},
    {"sparsity_pattern": "blockwise", "stride": 4, "block_shifts": [0, 2, 0, 1], "position_embedding_type": "alibi"},
    {"sparsity_pattern": "blockwise", "stride": 2, "block_shifts": [1, 0, 3, 3], "position_embedding_type": "rotary"},
    {"sparsity_pattern": "strided", "pattern_layout": "heads", "position_embedding_type": "distance_aware"},
    {"sparsity_pattern": "fixed", "pattern_layout": "heads", "position_embedding_type": "distance_aware", "stride": 4},
    {"sparsity_pattern": "fixed", "pattern_layout": "layers", "position_embedding_type": "distance_aware"},
    {"sparsity_pattern": "blockwise", "stride": 3, "position_embedding_type": "distance_aware"},
]


def _model(seed=0, **overrides):
    torch.manual_seed(seed)
    model = create_model("sparse_transformer", "causal_lm", "tiny", **overrides).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


def _batch(length=13):
    ids = torch.randint(0, 128, (3, length), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    mask[2, -5:] = 0  # right padding
    return ids, mask


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_efficient_path_equals_dense_twin(settings):
    _assert_efficient_path_equals_dense_twin(settings, "sdpa")


NATIVE_SETTINGS = [SETTINGS[2], SETTINGS[3], {**SETTINGS[2], "stride": 5}, SETTINGS[0], SETTINGS[1], SETTINGS[4]]
NATIVE_IDS = ["fixed-heads-alibi", "fixed-layers-rotary", "fixed-heads-alibi-stride5"]
NATIVE_IDS += ["strided-heads", "strided-layers-rotary", "strided-heads-alibi-stride5"]
needs_native = pytest.mark.skipif(native.extension() is None, reason="the native attention kernel could not be built")


@needs_native
@pytest.mark.parametrize("settings", NATIVE_SETTINGS, ids=NATIVE_IDS)
def test_native_kernels_equal_dense_twin(settings):
    """``tff_native``: the fixed pattern's summary heads through the native summary kernel, one call per layer (with
    stride 5 and 2 summary columns, the 2 summary heads of a layer read different columns); the local, strided and
    block factors through the native factor kernel."""
    if settings.get("stride") == 5 and settings["sparsity_pattern"] == "fixed":
        model = _model(**settings)
        summary_groups = [g for layer in model.model.layers for g in layer.self_attn.groups if isinstance(g[2], tuple)]
        assert [end - first for first, end, _ in summary_groups] == [2] * model.config.num_hidden_layers
        assert all(g[2][0].summary_start != g[2][1].summary_start for g in summary_groups)
    _assert_efficient_path_equals_dense_twin(settings, "tff_native")


@needs_native
@pytest.mark.parametrize(
    "settings", [SETTINGS[0], SETTINGS[4], SETTINGS[2]], ids=NATIVE_IDS[3:4] + NATIVE_IDS[5:6] + NATIVE_IDS[:1]
)
def test_native_kernels_read_the_heads_in_place(settings, monkeypatch):
    """Without left padding the heads reach the native factor kernel as the projections' (B, H, T, Dh) views (rows
    ``H Dh`` apart, no copy): the same values and gradients as the dense twin, and no contiguous copy made for it."""
    copied = []
    readable = factorized_module._rows_readable
    monkeypatch.setattr(factorized_module, "_rows_readable", lambda t: copied.append(t.is_contiguous()) or readable(t))
    model = _model(**settings)
    ids, _ = _batch()
    mask = torch.ones_like(ids)
    _assert_paths_agree(model, ids, mask, ids, "tff_native")
    assert copied and not any(copied)  # every tensor handed over (heads and incoming gradients) was a strided view


def _assert_paths_agree(model, ids, mask, labels, implementation):
    """``implementation``'s path and the dense eager twin: the same logits at real positions, the same parameter
    gradients of the loss."""
    real = mask.bool()
    model.config._attn_implementation = implementation
    fast = model(input_ids=ids, attention_mask=mask, labels=labels)
    model.config._attn_implementation = "eager"
    dense = model(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(fast.logits[real], dense.logits[real], rtol=1e-9, atol=1e-9)
    fast_grads = torch.autograd.grad(fast.loss, list(model.parameters()), allow_unused=True)
    dense_grads = torch.autograd.grad(dense.loss, list(model.parameters()), allow_unused=True)
    for (name, _), got, expected in zip(model.named_parameters(), fast_grads, dense_grads, strict=True):
        if expected is None:
            assert got is None, name
            continue
        torch.testing.assert_close(got, expected, rtol=1e-8, atol=1e-10, msg=name)


def _assert_efficient_path_equals_dense_twin(settings, implementation):
    model = _model(**settings)
    ids, mask = _batch()
    real = mask.bool()
    labels = ids.masked_fill(~real, -100)
    labels[1, 4] = -100  # the first real token of the left-padded row: a padded position would predict it
    _assert_paths_agree(model, ids, mask, labels, implementation)


def test_padding_in_the_middle_takes_the_dense_path():
    model = _model()
    ids, mask = _batch()
    mask[0, 5] = 0  # a hole: real tokens not one run
    with torch.no_grad():
        fast = model(input_ids=ids, attention_mask=mask).logits
        model.config._attn_implementation = "eager"
        dense = model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(fast[mask.bool()], dense[mask.bool()], rtol=1e-9, atol=1e-9)


def test_efficient_path_builds_no_dense_mask(monkeypatch):
    """The sparse path never evaluates a pattern over T x T positions, nor calls the dense twin."""

    def refuse(*args, **kwargs):
        raise AssertionError("the efficient path built a dense T x T mask")

    monkeypatch.setattr(modeling, "_pattern_mask", refuse)
    monkeypatch.setattr(factorized_module, "reference_attention", refuse)
    monkeypatch.setattr(blockwise_module, "reference_attention", refuse)
    monkeypatch.setattr(distance_aware_module, "dense_attention", refuse)
    monkeypatch.setattr(image_local_module, "dense_attention", refuse)
    for settings in SETTINGS:
        model = _model(**settings)
        ids, mask = _batch(length=40)
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)


@pytest.mark.parametrize("settings", SETTINGS[1:3], ids=["strided-rotary", "fixed-alibi"])
def test_cached_generation_equals_uncached(settings):
    model = _model(**settings).float()
    prompt, mask = _batch(length=9)
    kwargs = {"max_new_tokens": 7, "do_sample": False, "attention_mask": mask, "pad_token_id": 0}
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **kwargs)
        full = model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached, full)


def test_output_attentions_follow_the_pattern():
    model = _model(pattern_layout="layers")
    ids = torch.arange(10)[None]
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions
    local, strided = (attention[0, 0] > 0 for attention in attentions)  # stride 3
    assert local[7].nonzero().flatten().tolist() == [5, 6, 7]
    assert strided[7].nonzero().flatten().tolist() == [1, 4, 7]


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"sparsity_pattern": "dilated"}, "sparsity_pattern"),
        ({"pattern_layout": "heads", "num_attention_heads": 1, "hidden_size": 32}, "num_attention_heads"),
        ({"pattern_layout": "layers", "num_hidden_layers": 1}, "num_hidden_layers"),
        ({"sparsity_pattern": "fixed", "stride": 4, "summary_size": 5}, "summary_size"),
        ({"position_embedding_type": "rotary", "hidden_size": 12, "num_attention_heads": 4}, "rotary"),
        ({"stride": 0}, "stride"),
        ({"position_embedding_type": "sinusoid"}, "position_embedding_type"),
        ({"sparsity_pattern": "blockwise", "block_shifts": [0, 1, 2]}, "block_shifts"),
        ({"sparsity_pattern": "blockwise", "block_shifts": [0, 0, 0, 0]}, "block_shifts"),
        ({"sparsity_pattern": "blockwise", "block_shifts": [1, 1, 2, 3]}, "block_shifts"),
        ({"sparsity_pattern": "blockwise", "block_shifts": [0, -1, 2, 3]}, "block_shifts"),
        ({"sparsity_pattern": "blockwise", "block_shifts": "0123"}, "block_shifts"),
        ({"sparsity_pattern": "blockwise", "num_attention_heads": 1}, "num_attention_heads"),
        ({"sparsity_pattern": "local_1d", "position_embedding_type": "distance_aware"}, "position_embedding_type"),
        ({"position_embedding_type": "distance-aware"}, "position_embedding_type"),
    ],
)
def test_config_errors_name_the_field(overrides, field):
    with pytest.raises((ValueError, TypeError), match=field):
        create_model("sparse_transformer", "causal_lm", "tiny", **overrides)


def test_absolute_positions_refuse_long_inputs_and_alibi_does_not():
    model = _model(max_position_embeddings=16)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model(input_ids=torch.zeros(1, 20, dtype=torch.long))
    alibi = _model(max_position_embeddings=16, position_embedding_type="alibi")
    with torch.no_grad():
        assert alibi(input_ids=torch.zeros(1, 20, dtype=torch.long)).logits.shape == (1, 20, 128)


def test_blockwise_heads_take_different_block_permutations():
    """Every head of a blockwise layer has its own shift (default ``0 .. H - 1``), so the heads' masks differ, and
    each is causal with no empty row."""
    model = _model(sparsity_pattern="blockwise", stride=3)
    patterns = model.model.layers[0].self_attn.patterns
    assert [p.shift for p in patterns] == [0, 1, 2, 3]
    positions = torch.arange(12)
    masks = [modeling._pattern_mask(p, positions, positions) for p in patterns]
    for first in range(len(masks)):
        assert not masks[first].triu(1).any() and masks[first].any(-1).all()
        for second in range(first):
            assert not torch.equal(masks[first], masks[second])
    ids = torch.arange(12)[None]
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions[0][0]  # (H, T, T)
    assert attentions[0, 7].nonzero().flatten().tolist() == [6, 7]  # shift 0: own block up to the query
    assert attentions[1, 7].nonzero().flatten().tolist() == [3, 4, 5]  # shift 1: the block before
    assert attentions[2, 7].nonzero().flatten().tolist() == [0, 1, 2]  # shift 2: two blocks back
    assert attentions[3, 7].nonzero().flatten().tolist() == [7]  # shift 3: no block 3 back, the query itself


def test_blockwise_cached_generation_equals_uncached():
    model = _model(sparsity_pattern="blockwise", stride=3, block_shifts=[0, 1, 0, 2]).float()
    prompt, mask = _batch(length=9)
    kwargs = {"max_new_tokens": 7, "do_sample": False, "attention_mask": mask, "pad_token_id": 0}
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **kwargs)
        full = model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached, full)


def _distance_aware_model(**overrides):
    model = _model(position_embedding_type="distance_aware", **overrides)
    with torch.no_grad():  # w_h, v_h away from their initial values, so that a reload that dropped them would show
        for layer in model.model.layers:
            layer.self_attn.distance_aware.weight.copy_(torch.tensor([-0.9, 0.4, 0.05, 1.3]))
            layer.self_attn.distance_aware.offset.copy_(torch.tensor([0.3, -0.7, 1.1, 0.0]))
    return model


def test_distance_aware_parameters_train_and_round_trip(tmp_path):
    model = _distance_aware_model()
    ids, mask = _batch()
    model.train()
    loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(~mask.bool(), -100)).loss
    loss.backward()
    for layer in model.model.layers:  # every head's w_h and v_h gets a gradient
        assert layer.self_attn.distance_aware.weight.grad.abs().min() > 0
        assert layer.self_attn.distance_aware.offset.grad.abs().min() > 0
    model.eval()
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).double().eval()
    assert reloaded.config.position_embedding_type == "distance_aware"
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(reloaded.get_parameter(name), parameter, rtol=0, atol=0, msg=name)
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=ids, attention_mask=mask).logits, model(input_ids=ids, attention_mask=mask).logits
        )
    fresh = create_model("sparse_transformer", "causal_lm", "tiny", position_embedding_type="distance_aware")
    assert fresh.model.layers[1].self_attn.distance_aware.weight.tolist() == pytest.approx([-1, -1 / 3, 1 / 3, 1])
    assert not fresh.model.layers[1].self_attn.distance_aware.offset.any()


def test_distance_aware_has_no_length_limit_and_is_causal():
    model = _distance_aware_model(max_position_embeddings=16)
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(3))
    changed = ids.clone()
    changed[0, 15:] = (changed[0, 15:] + 1) % 128
    with torch.no_grad():
        logits, changed_logits = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert logits.shape == (1, 24, 128)  # past max_position_embeddings: no learned positions
    torch.testing.assert_close(changed_logits[:, :15], logits[:, :15], rtol=0, atol=0)
    assert not torch.allclose(changed_logits[:, 15:], logits[:, 15:])


@pytest.mark.parametrize("sparsity_pattern", ["strided", "blockwise"])
def test_distance_aware_cached_generation_equals_uncached(sparsity_pattern):
    model = _distance_aware_model(sparsity_pattern=sparsity_pattern).float()
    prompt, mask = _batch(length=9)
    kwargs = {"max_new_tokens": 7, "do_sample": False, "attention_mask": mask, "pad_token_id": 0}
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **kwargs)
        full = model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached, full)


# ------------------------------------------------------------------------------ the encoder heads (BlockBERT)
ENCODER_SETTINGS = [
    {"stride": 3, "position_embedding_type": "absolute"},
    {"stride": 4, "block_shifts": [0, 2, 0, 1], "position_embedding_type": "rotary"},
    {"stride": 5, "block_shifts": [1, 0, 3, 3], "position_embedding_type": "absolute"},
]


def _encoder(task="masked_lm", seed=0, **overrides):
    torch.manual_seed(seed)
    model = create_model("sparse_transformer", task, "tiny-blockwise", **overrides).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    return model


@pytest.mark.parametrize("settings", ENCODER_SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_encoder_efficient_path_equals_dense_twin(settings):
    """The gathered-block kernel (per-row block counts under padding) equals the dense masked twin, values and
    gradients, with left and right padding and lengths that are not multiples of the block."""
    model = _encoder(**settings)
    ids, mask = _batch()
    real = mask.bool()
    labels = ids.masked_fill(~real, -100)
    _assert_paths_agree(model, ids, mask, labels, "sdpa")


def test_encoder_efficient_path_builds_no_dense_mask(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the efficient path built a dense T x T mask")

    monkeypatch.setattr(modeling, "_pattern_mask", refuse)
    monkeypatch.setattr(blockwise_module, "reference_attention", refuse)
    model = _encoder()
    ids, mask = _batch(length=40)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)  # padded rows: the per-row kernel
        model(input_ids=ids)


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
@pytest.mark.parametrize("task", ["masked_lm", "sequence_classification"])
def test_encoder_padding_changes_no_real_output(task, implementation):
    """A row's real tokens give the same outputs alone, left-padded and right-padded, whatever the padding holds:
    the blocks (and their count n) follow each row's real tokens."""
    model = _encoder(task, stride=3)
    model.config._attn_implementation = implementation
    tokens = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(5))  # n = 3 blocks
    garbage = torch.randint(0, 128, (1, 5), generator=torch.Generator().manual_seed(6))
    padded = torch.cat([torch.cat([garbage, tokens], 1), torch.cat([tokens, garbage], 1)])  # left, right
    mask = torch.ones_like(padded)
    mask[0, :5] = 0
    mask[1, 8:] = 0
    with torch.no_grad():
        alone = model(input_ids=tokens).logits
        both = model(input_ids=padded, attention_mask=mask).logits
    if task == "masked_lm":
        torch.testing.assert_close(both[0, 5:], alone[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(both[1, :8], alone[0], rtol=1e-10, atol=1e-10)
    else:  # the first real token's state, left and right padding alike
        torch.testing.assert_close(both, alone.expand(2, -1), rtol=1e-10, atol=1e-10)


def test_encoder_is_bidirectional_with_cyclic_shifts():
    """Head h lets block b read block (b + h) mod n: a later block's tokens reach the first block in one layer, and
    the attention probabilities follow the paper's permutation."""
    model = _encoder(stride=3)
    assert [p.shift for p in model.model.layers[0].self_attn.patterns] == [0, 1, 2, 3]
    assert all(not p.causal for p in model.model.layers[0].self_attn.patterns)
    ids = torch.arange(9)[None]  # n = 3 blocks
    with torch.no_grad():
        attentions = model(input_ids=ids, output_attentions=True).attentions[0][0]  # (H, T, T)
        changed = ids.clone()
        changed[0, 8] = 100
        logits, changed_logits = model(input_ids=ids).logits, model(input_ids=changed).logits
    assert attentions[0, 1].nonzero().flatten().tolist() == [0, 1, 2]  # shift 0: the whole own block
    assert attentions[1, 1].nonzero().flatten().tolist() == [3, 4, 5]  # shift 1: the next block
    assert attentions[2, 1].nonzero().flatten().tolist() == [6, 7, 8]  # shift 2: two blocks on
    assert attentions[3, 1].nonzero().flatten().tolist() == [0, 1, 2]  # shift 3 = 0 mod 3
    assert attentions[1, 7].nonzero().flatten().tolist() == [0, 1, 2]  # the last block wraps to the first
    assert not torch.allclose(changed_logits[0, 0], logits[0, 0])  # a later token changes an earlier output


def test_heads_set_causal_on_their_own_config():
    """The default stays the decoder; the encoder heads read causal=False, the causal LM causal=True, whatever the
    given config says (as Performer, Reformer and the Universal Transformer do), and the given config is untouched."""
    from tf_family.models.sparse_transformer import SPEC

    config = SPEC.make_config("tiny-blockwise")
    assert config.causal is True
    masked = SPEC.model_classes["masked_lm"](config)
    assert masked.config.causal is False and config.causal is True
    assert all(not p.causal for p in masked.model.layers[0].self_attn.patterns)
    decoder = SPEC.model_classes["causal_lm"](SPEC.make_config("tiny-blockwise", causal=False))
    assert decoder.config.causal is True
    assert all(p.causal for p in decoder.model.layers[0].self_attn.patterns)
    # a config saved before the field existed (no "causal" key) loads as the decoder it was
    stored = SPEC.make_config("tiny").to_dict()
    stored.pop("causal")
    assert SPEC.config_class.from_dict(stored).causal is True


@pytest.mark.parametrize(
    "task, overrides, match",
    [
        ("masked_lm", {"sparsity_pattern": "strided"}, "sparsity_pattern='strided'"),
        ("sequence_classification", {"sparsity_pattern": "fixed", "summary_size": 1}, "sparsity_pattern='fixed'"),
        ("masked_lm", {"sparsity_pattern": "local_1d"}, "sparsity_pattern='local_1d'"),
        ("masked_lm", {"position_embedding_type": "alibi"}, "position_embedding_type='alibi'"),
        ("sequence_classification", {"position_embedding_type": "distance_aware"}, "position_embedding_type"),
        ("base", {"causal": False, "sparsity_pattern": "local_2d"}, "causal=False"),
        ("base", {"causal": False, "position_embedding_type": "alibi"}, "position_embedding_type='alibi'"),
        ("base", {"causal": "no"}, "causal"),
        ("sequence_classification", {"classifier_dropout": 1.5}, "classifier_dropout"),
    ],
)
def test_encoder_config_errors_name_the_field(task, overrides, match):
    with pytest.raises((ValueError, TypeError), match=match):
        create_model("sparse_transformer", task, "tiny-blockwise", **overrides)


def test_encoder_refuses_a_cache_and_token_type_ids():
    model = _encoder()
    ids = torch.zeros(1, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="use_cache"):
        model.model(input_ids=ids, use_cache=True)
    with pytest.raises(ValueError, match="token_type_ids"):
        model(input_ids=ids, token_type_ids=torch.zeros_like(ids))
    with pytest.raises(ValueError, match="add_pooling_layer"):
        modeling.TffSparseTransformerModel(model.config, add_pooling_layer=True)
    assert model.model(input_ids=ids).cache is None  # the encoder makes no cache by default


def test_masked_lm_checkpoint_loads_into_the_classifier(tmp_path):
    """A BlockBERT masked LM saved and reloaded through the Auto classes: the same logits (the config keeps
    causal=False), and the encoder's weights reach a sequence classifier."""
    from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification

    model = _encoder()
    ids, mask = _batch()
    model.save_pretrained(tmp_path)
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path).double().eval()
    assert type(reloaded) is modeling.TffSparseTransformerForMaskedLM and reloaded.config.causal is False
    assert reloaded.lm_head.decoder.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()  # tied
    with torch.no_grad():
        torch.testing.assert_close(
            reloaded(input_ids=ids, attention_mask=mask).logits, model(input_ids=ids, attention_mask=mask).logits
        )
    classifier = AutoModelForSequenceClassification.from_pretrained(tmp_path, num_labels=3).double().eval()
    torch.testing.assert_close(classifier.model.embed_tokens.weight, model.model.embed_tokens.weight)
    labels = torch.tensor([0, 2, 1])
    output = classifier(input_ids=ids, attention_mask=mask, labels=labels)
    assert output.logits.shape == (3, 3) and torch.isfinite(output.loss)
    regression = create_model("sparse_transformer", "sequence_classification", "tiny-blockwise", num_labels=1)
    assert regression(input_ids=ids, attention_mask=mask, labels=torch.randn(3)).loss.shape == ()
