"""Exact resume (issue 19, class 5): a checkpoint whose random states cannot be restored is refused, or resumed with
a loud warning under --allow_inexact_resume (accelerate itself only logs an INFO line and goes on inexactly)."""

import pytest
import torch
from safetensors.torch import load_file

from .conftest import data_args

pytestmark = pytest.mark.recipe


def test_resume_with_an_unreadable_random_state_is_refused_or_loudly_inexact(tmp_path, corpus, tiny_gpt2, caplog):
    from tf_family.recipes import causal_lm

    args = ["--model_name_or_path", tiny_gpt2, "--block_size", "16", *data_args(corpus), "--max_train_steps", "4",
            "--per_device_train_batch_size", "2", "--per_device_eval_batch_size", "2", "--checkpointing_steps", "2"]  # fmt: skip
    causal_lm.main([*args, "--output_dir", str(tmp_path / "straight")])
    checkpoint = tmp_path / "straight" / "checkpoints" / "step_2"
    straight = load_file(tmp_path / "straight" / "model.safetensors")

    def resumed(name: str, *extra: str) -> dict:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
        causal_lm.main(
            [*args, "--output_dir", str(tmp_path / name), "--resume_from_checkpoint", str(checkpoint), *extra]
        )
        return load_file(tmp_path / name / "model.safetensors")

    exact = resumed("exact")  # the machinery resumes exactly when the checkpoint is whole
    assert all(torch.equal(exact[key], straight[key]) for key in straight)

    rng_file = checkpoint / "random_states_0.pkl"
    rng_file.write_bytes(rng_file.read_bytes()[:100])  # truncated
    with pytest.raises(ValueError, match=r"random_states_0\.pkl cannot be restored.*--allow_inexact_resume"):
        resumed("refused")
    with caplog.at_level("WARNING"):
        inexact = resumed("inexact", "--allow_inexact_resume")
    assert "RESUME IS NOT EXACT" in caplog.text and "random_states_0.pkl" in caplog.text
    assert any(not torch.equal(inexact[key], straight[key]) for key in straight)  # dropout drew other masks
