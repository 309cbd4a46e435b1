"""The causal-LM recipe with the Memorizing Transformer: kNN memory carried and reset per row, exact resume with the
memory in the checkpoint, memory sizes for training and evaluation, fine-tuning from a Transformer-XL checkpoint."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from tf_family.memory import MemorizingMemory
from tf_family.models.memorizing.modeling_memorizing import TffMemorizingForCausalLM, TffMemorizingModel
from tf_family.recipes import causal_lm

from .conftest import TINY_TXL, data_args, run_killed_in_step_5

pytestmark = pytest.mark.recipe

STEPS = ["--max_train_steps", "4", "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2"]
TINY_MEMORIZING = ["--arch", "memorizing", "--variant", "tiny", "--config_overrides", "dropout=0.1",
                   "--block_size", "8", "--memory_size", "24", "--knn_top_k", "4"]  # fmt: skip


def test_knn_memory_is_carried_reset_and_sized(tmp_path, corpus, monkeypatch):
    calls, evaluations = [], []
    forward = TffMemorizingForCausalLM.forward

    def spy(self, input_ids=None, mems=None, reset_mems=None, **kwargs):
        if self.training:
            calls.append((input_ids.clone(), mems, None if reset_mems is None else reset_mems.tolist()))
        elif mems is not None:
            evaluations.append(mems.knn.capacity)
        out = forward(self, input_ids=input_ids, mems=mems, reset_mems=reset_mems, **kwargs)
        return out

    monkeypatch.setattr(TffMemorizingForCausalLM, "forward", spy)
    results = causal_lm.main([*TINY_MEMORIZING, *data_args(corpus), *STEPS, "--max_train_steps", "10",
                              "--block_size", "64", "--eval_memory_size", "40", "--output_dir", str(tmp_path)])  # fmt: skip
    assert len(calls) == 10 and calls[0][1] is None
    assert all(isinstance(mems, MemorizingMemory) and mems.knn.capacity == 24 for _, mems, _ in calls[1:])
    for input_ids, _, reset in calls[1:]:
        assert reset == (input_ids[:, 0] == 0).tolist()  # reset exactly where a document starts
    assert any(any(r) for _, _, r in calls[1:]) and any(not all(r) for _, _, r in calls[1:])
    assert evaluations and set(evaluations) == {40}  # evaluation read with its own memory size
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(model) is TffMemorizingForCausalLM
    assert model.config.knn_memory_size == 24 and model.config.knn_top_k == 4
    assert results["perplexity"] > 0


def test_killed_run_resumes_to_the_same_weights_and_memory(tmp_path, corpus, monkeypatch):
    args = [*TINY_MEMORIZING, *data_args(corpus), *STEPS, "--max_train_steps", "6", "--gradient_accumulation_steps",
            "2", "--checkpointing_steps", "3"]  # fmt: skip
    causal_lm.main([*args, "--output_dir", str(tmp_path / "straight")])
    memory_file = tmp_path / "straight" / "checkpoints" / "step_3" / "memory_rank0.safetensors"
    with safe_open(str(memory_file), framework="pt") as handle:
        assert handle.metadata()["class"] == "MemorizingMemory"
    saved = MemorizingMemory.from_state_dict(load_file(memory_file))
    assert saved.knn.capacity == 24 and saved.knn.size.sum() > 0

    interrupted = tmp_path / "interrupted"
    run_killed_in_step_5(monkeypatch, args, interrupted)  # step 5 = micro-batches 9 and 10
    causal_lm.main([*args, "--output_dir", str(interrupted), "--resume_from_checkpoint", "latest"])
    straight = load_file(tmp_path / "straight" / "model.safetensors")
    resumed = load_file(interrupted / "model.safetensors")
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=1e-5, atol=1e-6)
    untrained = load_file(tmp_path / "straight" / "checkpoints" / "step_3" / "model.safetensors")
    assert any(not torch.equal(untrained[k], straight[k]) for k in untrained)


def test_resume_without_the_memory_would_differ(tmp_path, corpus, monkeypatch):
    """The check above can fail: resuming with an empty kNN memory gives other weights."""
    args = [*TINY_MEMORIZING, *data_args(corpus), *STEPS, "--max_train_steps", "6", "--checkpointing_steps", "3",
            "--config_overrides", "dropout=0.0", "knn_gate_init=3.0"]  # fmt: skip
    causal_lm.main([*args, "--output_dir", str(tmp_path / "straight")])
    (tmp_path / "straight" / "model.safetensors").rename(tmp_path / "straight.safetensors")
    (tmp_path / "straight" / "training_run.json").unlink()
    monkeypatch.setattr(causal_lm, "load_carried_state", lambda checkpoint, accelerator: None)
    step_3 = str(tmp_path / "straight" / "checkpoints" / "step_3")
    causal_lm.main([*args, "--output_dir", str(tmp_path / "straight"), "--resume_from_checkpoint", step_3])
    straight = load_file(tmp_path / "straight.safetensors")
    forgetful = load_file(tmp_path / "straight" / "model.safetensors")
    assert any(not torch.allclose(forgetful[k], straight[k], atol=1e-6) for k in straight)


def test_fine_tune_a_transformer_xl_checkpoint_with_memory(tmp_path, corpus):
    xl = tmp_path / "xl"
    causal_lm.main([*TINY_TXL, *data_args(corpus), *STEPS, "--output_dir", str(xl)])
    results = causal_lm.main([
        "--arch", "memorizing", "--transfo_xl_checkpoint", str(xl), "--config_overrides", "knn_layers=[1]",
        "--memory_size", "16", "--block_size", "16", *data_args(corpus), *STEPS, "--output_dir", str(tmp_path / "m"),
    ])  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert type(model) is TffMemorizingForCausalLM and model.config.knn_layers == [1]
    assert hasattr(model.transformer.layers[1], "knn_gate") and results["perplexity"] > 0
    xl_weights = load_file(xl / "model.safetensors")
    tuned = load_file(tmp_path / "m" / "model.safetensors")
    assert set(xl_weights) < set(tuned)  # every Transformer-XL weight went on training, plus the kNN gate and scale
    with pytest.raises(ValueError, match="--arch memorizing"):
        causal_lm.main([*TINY_TXL, "--transfo_xl_checkpoint", str(xl), *data_args(corpus), "--output_dir", "x"])
    with pytest.raises(ValueError, match="kNN memory"):
        causal_lm.main(
            [*TINY_TXL, "--memory_size", "8", *data_args(corpus), *STEPS, "--output_dir", str(tmp_path / "y")]
        )


def test_empty_memory_has_the_requested_size():
    model = TffMemorizingModel(TffMemorizingForCausalLM.config_class(n_layer=2, d_model=16, n_head=2, d_inner=16,
                                                                     vocab_size=32, knn_layers=[1]))  # fmt: skip
    assert model.empty_memory(3, 7).knn.capacity == 7 and model.empty_memory(3).knn.capacity == 8192
