"""Parity with transformers 4.35.2 TransfoXL, through committed fixtures (see tests/fixtures/transfo_xl_4x/)."""

import itertools
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

from tf_family import SegmentMemory, TffTransfoXLForSequenceClassification, TffTransfoXLLMHeadModel, TffTransfoXLModel
from tf_family.cli import main as cli_main
from tf_family.models.transfo_xl.convert_transfo_xl import TffTransfoXLLegacyConfig

FIXTURES = Path(__file__).parents[2] / "fixtures" / "transfo_xl_4x"
CASES = ["adaptive_div2_bin", "adaptive_div1_proj_safetensors", "plain_softmax_safetensors"]

pytestmark = pytest.mark.parity


def run_segments(model, expected, memory):
    meta_length = 5
    ids = expected["input_ids"]
    logits, losses = [], []
    memory_with_labels = memory
    with torch.no_grad():
        for k in range(ids.shape[1] // meta_length):
            segment = ids[:, k * meta_length : (k + 1) * meta_length]
            out = model(segment, mems=memory)
            memory = out.mems
            labelled = model(segment, mems=memory_with_labels, labels=segment)
            memory_with_labels = labelled.mems
            logits.append(out.logits)
            losses.append(labelled.losses)
    return logits, losses


def grouped_like_4x(losses, labels, bounds):
    """4.x returned per-token losses grouped by softmax cluster (flattened over the batch); regroup ours."""
    flat, targets = losses.reshape(-1), labels[:, 1:].reshape(-1)
    return torch.cat([flat[(targets >= low) & (targets < high)] for low, high in itertools.pairwise(bounds)])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("start", ["empty", "zeros"])
def test_logits_equal_transformers_4_35_2_over_three_segments(case, start):
    folder = FIXTURES / case
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert type(model) is TffTransfoXLLMHeadModel and not model.training
    expected = load_file(folder / "expected.safetensors")
    config = model.config
    if start == "empty":  # a fresh stream: 4.x given zero-length mems
        prefix, memory = "emptymem_", None
    else:  # 4.x's default: mems=None became mem_len zero vectors per layer
        prefix = ""
        zeros = [torch.zeros(2, config.mem_len, config.d_model) for _ in range(config.n_layer)]
        memory = SegmentMemory.from_states(zeros)
    logits, losses = run_segments(model, expected, memory)
    bounds = [0, *config.cutoffs, config.vocab_size]
    for k, (ours, our_losses) in enumerate(zip(logits, losses, strict=True)):
        torch.testing.assert_close(ours, expected[f"{prefix}logits_{k}"], rtol=0, atol=1e-5)
        segment = expected["input_ids"][:, k * 5 : (k + 1) * 5]
        theirs = expected[f"{prefix}losses_{k}"].reshape(-1)
        torch.testing.assert_close(grouped_like_4x(our_losses, segment, bounds), theirs, rtol=0, atol=1e-5)


def test_legacy_config_registered_and_translated():
    config = AutoConfig.from_pretrained(FIXTURES / "adaptive_div2_bin")
    assert type(config) is TffTransfoXLLegacyConfig
    tff = config.to_tff_config()
    assert (tff.div_val, tff.cutoffs, tff.proj_share_all_but_first, tff.same_length) == (2, [40, 80], True, True)
    assert AutoConfig.from_pretrained(FIXTURES / "adaptive_div1_proj_safetensors").to_tff_config().untie_r is False


def test_direct_class_loading_and_other_heads():
    folder = FIXTURES / "adaptive_div2_bin"
    lm = TffTransfoXLLMHeadModel.from_pretrained(folder)
    base = AutoModel.from_pretrained(folder)
    assert type(base) is TffTransfoXLModel
    ids = load_file(folder / "expected.safetensors")["input_ids"][:, :5]
    with torch.no_grad():
        torch.testing.assert_close(base(ids).last_hidden_state, lm.transformer(ids).last_hidden_state)
    classifier = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3)
    assert type(classifier) is TffTransfoXLForSequenceClassification and classifier.score.out_features == 3
    from_config = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    assert type(from_config) is TffTransfoXLLMHeadModel and from_config.config.div_val == 2
    override = TffTransfoXLLMHeadModel.from_pretrained(folder, mem_len=20, same_length=False)
    assert override.config.mem_len == 20 and not override.config.same_length


def test_convert_command_writes_tf_family_checkpoint(tmp_path):
    source = FIXTURES / "adaptive_div2_bin"
    assert cli_main(["convert", "transfo-xl", str(source), str(tmp_path / "out")]) == 0
    files = set(os.listdir(tmp_path / "out"))
    assert "model.safetensors" in files and not any(name.endswith(".bin") for name in files)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == "tff_transfo_xl"
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    original = AutoModelForCausalLM.from_pretrained(source)
    ids = load_file(source / "expected.safetensors")["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, original(ids).logits, rtol=0, atol=0)


def copy_case(tmp_path, case="adaptive_div1_proj_safetensors"):
    target = tmp_path / case
    shutil.copytree(FIXTURES / case, target)
    return target, load_file(target / "model.safetensors")


def test_missing_unexpected_and_misshaped_tensors_are_named(tmp_path):
    folder, weights = copy_case(tmp_path)
    broken = dict(weights)
    del broken["transformer.layers.1.dec_attn.r_net.weight"]
    broken["transformer.layers.0.dec_attn.extra"] = torch.zeros(2)
    broken["crit.cluster_bias"] = torch.zeros(5)
    save_file(broken, folder / "model.safetensors")
    with pytest.raises(ValueError) as error:
        AutoModelForCausalLM.from_pretrained(folder)
    message = str(error.value)
    assert "missing keys ['transformer.layers.1.attention.position_proj.weight']" in message
    assert "unexpected keys ['transformer.layers.0.dec_attn.extra']" in message
    assert "lm_head.cluster_bias: checkpoint (5,) vs model (2,)" in message


def test_bin_weights_load_only_plain_tensors(tmp_path):
    folder = tmp_path / "evil"
    shutil.copytree(FIXTURES / "adaptive_div2_bin", folder)
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["transformer.word_emb.emb_projs.0"] = {"payload": print}  # an arbitrary Python object
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(Exception, match="[Ww]eights only load failed|Unsupported global"):
        AutoModelForCausalLM.from_pretrained(folder)


def test_unsupported_legacy_settings_are_refused(tmp_path):
    folder, _ = copy_case(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["attn_type"] = 2
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(NotImplementedError, match="attn_type=2"):
        AutoModelForCausalLM.from_pretrained(folder)
