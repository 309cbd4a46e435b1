"""Random tiny transformers-5 Longformer checkpoints, saved and loaded into tf_family: same outputs (eval)."""

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForMaskedLM, LongformerConfig

import tf_family
from tf_family.cli import main as cli_main

pytestmark = pytest.mark.parity

VOCAB = 97
CONFIGS = {
    "two_windows": dict(attention_window=[4, 6], num_hidden_layers=2),  # noqa: C408
    "wide_window": dict(attention_window=10, num_hidden_layers=3),  # noqa: C408
}


def _hf_config(name, **extra):
    return LongformerConfig(
        vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, intermediate_size=37, max_position_embeddings=64,
        type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **CONFIGS[name], **extra,
    )  # fmt: skip


def _inputs(batch=3, length=23, seed=0):
    """Odd length, right padding in row 1, global tokens at arbitrary positions; separators for the QA rules."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=generator)
    ids[:, 0] = 0
    ids[:, [4, 5, length - 1]] = 2  # <s> q q q </s></s> context </s>
    mask = torch.ones_like(ids)
    ids[1, 15:] = 1
    ids[1, 14] = 2
    ids[1, length - 1] = 1
    mask[1, 15:] = 0
    global_mask = torch.zeros_like(ids)
    global_mask[0, [0, 9]] = 1
    global_mask[1, [3, 7, 11]] = 1
    global_mask[2, length - 2] = 1
    token_types = (torch.arange(length) > 5).long().expand(batch, length)
    return ids, mask, global_mask, token_types


def _save(model, folder):
    torch.manual_seed(1)
    with torch.no_grad():  # move every weight away from the init so that each one matters
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(folder)


def _outputs(output):
    if hasattr(output, "start_logits"):
        return torch.stack([output.start_logits, output.end_logits], -1)
    return output.logits if hasattr(output, "logits") and output.logits is not None else output.last_hidden_state


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize(
    "task", ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]
)
@pytest.mark.parametrize("with_global", [True, False])
def test_outputs_match_transformers(tmp_path, config_name, task, with_global):
    torch.manual_seed(0)
    num_labels = 2 if task == "ForQuestionAnswering" else 3
    hf_model = getattr(transformers, f"Longformer{task}")(_hf_config(config_name, num_labels=num_labels)).eval()
    _save(hf_model, tmp_path)
    ours = getattr(tf_family, f"TffLongformer{task}").from_pretrained(tmp_path)
    assert type(ours).__name__ == f"TffLongformer{task}" and not ours.training
    ids, mask, global_mask, token_types = _inputs()
    # without a mask, each head applies its default rule (first token / the question) on both sides
    kwargs = {"attention_mask": mask, "token_type_ids": token_types}
    if with_global:
        kwargs["global_attention_mask"] = global_mask
    with torch.no_grad():
        expected = _outputs(hf_model(ids, **kwargs))
        for mode in ("sparse", "dense"):
            model = getattr(tf_family, f"TffLongformer{task}").from_pretrained(tmp_path, attention_mode=mode)
            got = _outputs(model(ids, **kwargs))
            if got.dim() >= 2 and got.shape[:2] == ids.shape:  # token-level: compare real tokens only
                real = mask.bool()
                got, reference = got[real], expected[real]
            else:
                reference = expected
            torch.testing.assert_close(got, reference, rtol=1e-4, atol=1e-4, msg=f"{task} {mode}")


def test_multiple_choice_matches_transformers(tmp_path):
    torch.manual_seed(0)
    hf_model = transformers.LongformerForMultipleChoice(_hf_config("two_windows")).eval()
    _save(hf_model, tmp_path)
    ours = tf_family.TffLongformerForMultipleChoice.from_pretrained(tmp_path)
    ids, mask, global_mask, _ = _inputs()
    choices = torch.stack([ids[:2], ids[1:]], dim=1)  # (B, C, T), 3 separators per row
    with torch.no_grad():
        for kwargs in ({}, {"global_attention_mask": torch.stack([global_mask[:2], global_mask[1:]], 1)}):
            torch.testing.assert_close(ours(choices, **kwargs).logits, hf_model(choices, **kwargs).logits,
                                       rtol=1e-4, atol=1e-4)  # fmt: skip


def test_convert_command_and_auto_loading(tmp_path):
    torch.manual_seed(0)
    hf_model = transformers.LongformerForMaskedLM(_hf_config("two_windows")).eval()
    _save(hf_model, tmp_path / "hf")
    assert cli_main(["convert", "longformer", str(tmp_path / "hf"), str(tmp_path / "tff")]) == 0
    converted = AutoModelForMaskedLM.from_pretrained(tmp_path / "tff").eval()
    assert type(converted) is tf_family.TffLongformerForMaskedLM
    assert converted.config.model_type == "tff_longformer"
    ids, mask, global_mask, _ = _inputs()
    with torch.no_grad():
        expected = hf_model(ids, attention_mask=mask, global_attention_mask=global_mask).logits
        got = converted(ids, attention_mask=mask, global_attention_mask=global_mask).logits
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], rtol=1e-4, atol=1e-4)
    # a masked-LM checkpoint loads into a classifier: the body is kept, the new head starts fresh
    classifier = tf_family.TffLongformerForSequenceClassification.from_pretrained(tmp_path / "hf")
    torch.testing.assert_close(
        classifier.longformer.layers[1].attention.global_key.weight,
        converted.longformer.layers[1].attention.global_key.weight,
    )


def test_mismatched_checkpoint_names_the_bad_keys(tmp_path):
    torch.manual_seed(0)
    transformers.LongformerModel(_hf_config("two_windows")).save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["encoder.layer.1.attention.self.key_global.weight"] = torch.zeros(5, 32)
    weights["encoder.layer.0.surprise.weight"] = torch.zeros(2)
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"surprise.*mis-shaped.*layers\.1\.attention\.global_key\.weight"):
        tf_family.TffLongformerModel.from_pretrained(tmp_path)
