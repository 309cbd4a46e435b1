"""Random tiny transformers-5 BigBird checkpoints, saved and loaded into tf_family: same outputs in eval mode
(where transformers points every random slot at the first block; the import selects the same)."""

import pytest
import torch
import transformers
from transformers import AutoModelForMaskedLM, BigBirdConfig

import tf_family
from tf_family.cli import main as cli_main

pytestmark = pytest.mark.parity

VOCAB = 99
TASKS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]


def _hf_config(num_random_blocks, **extra):
    return BigBirdConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        block_size=4, num_random_blocks=num_random_blocks, max_position_embeddings=128, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, sep_token_id=66, **extra,
    )  # fmt: skip


def _inputs(length, batch=3, seed=0):
    """Right padding in row 1 (transformers' positions ignore the mask), a separator for the QA rule."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (batch, length), generator=generator)
    ids[ids == 66] = 67
    ids[:, 5] = 66
    mask = torch.ones_like(ids)
    ids[1, length - 9 :], mask[1, length - 9 :] = 0, 0
    return ids, mask


def _save(model, folder):
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    model.save_pretrained(folder)


def _main(output):
    if hasattr(output, "start_logits"):
        return torch.stack([output.start_logits, output.end_logits], -1)
    return output.logits if getattr(output, "logits", None) is not None else output.last_hidden_state


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize(
    "length, num_random_blocks", [(61, 1), (78, 2), (20, 2)], ids=["sparse-r1", "sparse-r2", "short-full"]
)
def test_outputs_match_transformers(tmp_path, task, length, num_random_blocks):
    torch.manual_seed(0)
    hf_model = getattr(transformers, f"BigBird{task}")(_hf_config(num_random_blocks, num_labels=2)).eval()
    _save(hf_model, tmp_path)
    ours = getattr(tf_family, f"TffBigBird{task}").from_pretrained(tmp_path)
    assert ours.config.eval_random_blocks == "first_block" and not ours.training
    body = getattr(ours, "bert", ours)
    assert body.layers[0].attention.uses_sparse(length) == (length > 20)
    ids, mask = _inputs(length)
    with torch.no_grad():
        expected, got = _main(hf_model(ids, attention_mask=mask)), _main(ours(ids, attention_mask=mask))
    if got.shape[:2] == ids.shape:
        got, expected = got[mask.bool()], expected[mask.bool()]
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_multiple_choice_matches_transformers(tmp_path):
    torch.manual_seed(0)
    hf_model = transformers.BigBirdForMultipleChoice(_hf_config(1)).eval()
    _save(hf_model, tmp_path)
    ours = tf_family.TffBigBirdForMultipleChoice.from_pretrained(tmp_path)
    ids, mask = _inputs(61)
    choices, choice_mask = torch.stack([ids[:2], ids[1:]], 1), torch.stack([mask[:2], mask[1:]], 1)
    with torch.no_grad():
        torch.testing.assert_close(
            ours(choices, attention_mask=choice_mask).logits,
            hf_model(choices, attention_mask=choice_mask).logits,
            rtol=1e-4,
            atol=1e-4,
        )


def test_convert_command_and_auto_loading(tmp_path):
    torch.manual_seed(0)
    hf_model = transformers.BigBirdForMaskedLM(_hf_config(1)).eval()
    _save(hf_model, tmp_path / "hf")
    assert cli_main(["convert", "big-bird", str(tmp_path / "hf"), str(tmp_path / "tff")]) == 0
    converted = AutoModelForMaskedLM.from_pretrained(tmp_path / "tff").eval()
    assert type(converted) is tf_family.TffBigBirdForMaskedLM and converted.config.model_type == "tff_big_bird"
    ids, mask = _inputs(61)
    with torch.no_grad():
        expected = hf_model(ids, attention_mask=mask).logits
        got = converted(ids, attention_mask=mask).logits
    torch.testing.assert_close(got[mask.bool()], expected[mask.bool()], rtol=1e-4, atol=1e-4)


def test_decoder_checkpoints_are_refused(tmp_path):
    transformers.BigBirdModel(_hf_config(1, is_decoder=True)).save_pretrained(tmp_path)
    with pytest.raises(NotImplementedError, match="decoder"):
        tf_family.TffBigBirdModel.from_pretrained(tmp_path)
