"""Random tiny transformers Reformer checkpoints (5.24 layout) loaded into tf_family: same eval logits, same training
loss and gradients (dropout 0, ``hash_seed`` set; tf_family reads them with ``chunk_wrap_around=True``, transformers'
chunking). The output bias: transformers 5.24 applies ``lm_head.decoder.bias`` (and keeps an unused ``lm_head.bias``);
4.x tied the two; 5.23 saved only ``lm_head.bias`` and never added it. Each layout is loaded with its bias applied."""

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, ReformerConfig

import tf_family
from tf_family.cli import main as cli_main
from tf_family.models.reformer.convert_reformer import convert_state_dict

pytestmark = pytest.mark.parity

VOCAB = 61


def _hf_config(**overrides):
    values = dict(  # noqa: C408
        vocab_size=VOCAB, hidden_size=32, num_attention_heads=2, attention_head_size=8, feed_forward_size=40,
        attn_layers=["local", "lsh", "lsh", "local"], local_attn_chunk_length=4, lsh_attn_chunk_length=4,
        num_hashes=2, num_buckets=4, axial_pos_shape=[4, 8], axial_pos_embds_dim=[12, 20], axial_norm_std=0.1,
        hash_seed=3, hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0,
        lsh_attention_probs_dropout_prob=0.0, is_decoder=True, max_position_embeddings=32, pad_token_id=0,
    )  # fmt: skip
    values.update(overrides)
    return ReformerConfig(**values)


def _build(model_class, folder, **overrides):
    torch.manual_seed(0)
    model = model_class(_hf_config(**overrides)).eval()
    with torch.no_grad():  # move every weight (the LM bias included) away from the init so that each one matters
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(folder)
    return model


def _inputs(length, batch=2, padded=True, seed=0):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, length), generator=generator)
    mask = torch.ones_like(ids)
    if padded and length > 4:
        mask[1, length - 3 :] = 0
        ids[1, length - 3 :] = 0
    return ids, mask


def _logits(model, output):
    if hasattr(output, "start_logits"):
        return torch.stack([output.start_logits, output.end_logits], -1)
    return output.logits


# (name, model overrides, lengths): below one chunk, exact chunk multiples, ragged (padded inside)
SETTINGS = [
    ("mixed-2-hashes", {}, (3, 16, 19)),
    ("lsh-only-1-hash", {"attn_layers": ["lsh", "lsh"], "num_hashes": 1}, (4, 13)),
    ("lsh-4-hashes-factorised", {"attn_layers": ["lsh", "local"], "num_hashes": 4, "num_buckets": [2, 4]}, (16, 22)),
    ("local-only", {"attn_layers": ["local", "local"]}, (3, 18)),
    ("auto-buckets-absolute", {"num_buckets": None, "axial_pos_embds": False, "lsh_attn_chunk_length": 8}, (7, 29)),
]


@pytest.mark.parametrize(("name", "overrides", "lengths"), SETTINGS, ids=[s[0] for s in SETTINGS])
@pytest.mark.parametrize("causal", [True, False])
def test_eval_logits_match_transformers(tmp_path, name, overrides, lengths, causal):
    hf_class = transformers.ReformerModelWithLMHead if causal else transformers.ReformerForMaskedLM
    ours_class = tf_family.TffReformerForCausalLM if causal else tf_family.TffReformerForMaskedLM
    extra = {} if causal else {"is_decoder": False, "lsh_num_chunks_after": 1, "local_num_chunks_after": 1}
    hf_model = _build(hf_class, tmp_path, **overrides, **extra)
    ours = ours_class.from_pretrained(tmp_path).eval()
    assert ours.config.chunk_wrap_around and ours.config.num_buckets == hf_model.config.num_buckets
    for length in lengths:
        ids, mask = _inputs(length)
        with torch.no_grad():
            expected = _logits(hf_model, hf_model(input_ids=ids, attention_mask=mask))  # transformers reseeds: first
            got = _logits(ours, ours(input_ids=ids, attention_mask=mask))
        real = mask.bool()
        torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5, msg=f"{name}, length {length}")
    assert hf_model.config.num_buckets == ours.config.num_buckets or overrides.get("num_buckets", 1) is None


@pytest.mark.parametrize("head", ["sequence_classification", "question_answering"])
def test_heads_match_transformers(tmp_path, head):
    hf_class = {
        "sequence_classification": transformers.ReformerForSequenceClassification,
        "question_answering": transformers.ReformerForQuestionAnswering,
    }[head]
    hf_model = _build(hf_class, tmp_path, is_decoder=False, num_labels=3 if head != "question_answering" else 2)
    ours = tf_family.ARCHITECTURES["reformer"].model_classes[head].from_pretrained(tmp_path).eval()
    ids, _ = _inputs(16, padded=False)
    with torch.no_grad():
        expected = _logits(hf_model, hf_model(input_ids=ids))
        got = _logits(ours, ours(input_ids=ids))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"attn_layers": ["lsh", "lsh"], "num_hashes": 4, "num_buckets": [2, 4]}])
def test_training_loss_and_gradients_match_transformers(tmp_path, overrides):
    """Reversible training (dropout 0): the loss and the gradient of every weight transformers uses (all but its
    unused ``lm_head.bias``) agree within 1e-5. transformers trains only at prod(axial_pos_shape) tokens."""
    hf_model = _build(transformers.ReformerModelWithLMHead, tmp_path, **overrides).train()
    ours = tf_family.TffReformerForCausalLM.from_pretrained(tmp_path).train()
    ids, _ = _inputs(32, padded=False)
    hf_loss = hf_model(input_ids=ids, labels=ids).loss
    hf_loss.backward()
    state = torch.random.get_rng_state()
    loss = ours(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.equal(torch.random.get_rng_state(), state), "the reversible backward changed the global RNG"
    torch.testing.assert_close(loss, hf_loss, rtol=0, atol=1e-5)
    hf_grads = {name: p.grad for name, p in hf_model.named_parameters() if name != "lm_head.bias"}
    mapped = convert_state_dict(hf_grads)
    ours_grads = dict(ours.named_parameters())
    assert set(mapped) == set(ours_grads)
    for name, grad in mapped.items():
        torch.testing.assert_close(ours_grads[name].grad, grad, rtol=0, atol=1e-5, msg=name)


@pytest.mark.parametrize("layout", ["4.x", "5.23"])
def test_lm_bias_of_older_layouts_is_applied(tmp_path, layout):
    """A transformers 4.x folder stores the tied bias twice (lm_head.bias and lm_head.decoder.bias); a 5.23 folder
    only as lm_head.bias (its decoder had no bias, so 5.23 never added it). Both load, with that bias in the
    logits."""
    hf_model = _build(transformers.ReformerModelWithLMHead, tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    bias = weights["lm_head.bias"].clone()
    assert not torch.equal(bias, weights["lm_head.decoder.bias"])  # the 5.24 layout's two biases differ here
    if layout == "4.x":
        weights["lm_head.decoder.bias"] = bias.clone()
    else:
        del weights["lm_head.decoder.bias"]
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    ours = tf_family.TffReformerForCausalLM.from_pretrained(tmp_path / "hf").eval()
    torch.testing.assert_close(ours.lm_head.decoder.bias, bias, rtol=0, atol=0)
    ids, mask = _inputs(12)
    with torch.no_grad():
        without_bias = hf_model(input_ids=ids, attention_mask=mask).logits - hf_model.lm_head.decoder.bias
        got = ours(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(got[real], (without_bias + bias)[real], rtol=0, atol=1e-5)
    assert (got - without_bias)[real].abs().max() > 1e-2


def test_the_bias_transformers_applies_is_kept(tmp_path):
    """transformers 5.24 saves both biases with different values and applies ``lm_head.decoder.bias``: that one is
    loaded (the unused ``lm_head.bias`` is dropped)."""
    hf_model = _build(transformers.ReformerModelWithLMHead, tmp_path)
    ours = tf_family.TffReformerForCausalLM.from_pretrained(tmp_path).eval()
    assert not torch.equal(hf_model.lm_head.bias, hf_model.lm_head.decoder.bias)
    torch.testing.assert_close(ours.lm_head.decoder.bias, hf_model.lm_head.decoder.bias, rtol=0, atol=0)


def test_convert_command_and_auto_loading(tmp_path):
    hf_model = _build(transformers.ReformerModelWithLMHead, tmp_path / "hf")
    assert cli_main(["convert", "reformer", str(tmp_path / "hf"), str(tmp_path / "tff")]) == 0
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "tff").eval()
    assert type(converted) is tf_family.TffReformerForCausalLM
    assert converted.config.model_type == "tff_reformer"
    ids, mask = _inputs(19)
    with torch.no_grad():
        expected = _logits(hf_model, hf_model(input_ids=ids, attention_mask=mask))
        got = converted(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], rtol=0, atol=1e-5)
