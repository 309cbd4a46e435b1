"""Parity with transformers 5 `DecisionTransformerModel`: its checkpoint folders load and give the same outputs."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, DecisionTransformerConfig, DecisionTransformerModel

from tf_family import TffDecisionTransformerModel
from tf_family.cli import main as cli_main

pytestmark = pytest.mark.parity

STATE_DIM, ACT_DIM, STEPS = 5, 3, 6


def reference_model(seed=0, **overrides):
    torch.manual_seed(seed)
    config = DecisionTransformerConfig(
        state_dim=STATE_DIM,
        act_dim=ACT_DIM,
        hidden_size=32,
        n_layer=2,
        n_head=4,
        max_ep_len=50,
        n_positions=64,
        **overrides,
    )
    model = DecisionTransformerModel(config).eval()
    with torch.no_grad():  # move every weight (layer norms and zero biases included) away from its init
        for parameter in model.parameters():
            parameter.add_(0.2 * torch.randn_like(parameter))
    return model


def trajectory(batch=3, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return {
        "states": torch.randn(batch, STEPS, STATE_DIM, generator=generator),
        "actions": torch.rand(batch, STEPS, ACT_DIM, generator=generator) * 2 - 1,
        "returns_to_go": torch.randn(batch, STEPS, 1, generator=generator),
        "timesteps": torch.randint(0, 44, (batch, 1), generator=generator) + torch.arange(STEPS),
    }


def assert_same_predictions(ours, theirs, inputs, mask=None):
    with torch.no_grad():
        expected = theirs(**inputs, attention_mask=mask, rewards=None, return_dict=True)
        got = ours(**inputs, attention_mask=mask)
    real = torch.ones(inputs["states"].shape[:2], dtype=torch.bool) if mask is None else mask.bool()
    for name in ("action_preds", "state_preds", "return_preds"):
        torch.testing.assert_close(getattr(got, name)[real], getattr(expected, name)[real], rtol=0, atol=1e-5)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("action_tanh", [True, False])
def test_folder_of_transformers_model_loads_with_equal_outputs(tmp_path, attn_implementation, action_tanh):
    theirs = reference_model(action_tanh=action_tanh)
    theirs.save_pretrained(tmp_path)
    ours = TffDecisionTransformerModel.from_pretrained(tmp_path, attn_implementation=attn_implementation)
    assert type(ours) is TffDecisionTransformerModel and not ours.training
    assert ours.config.predict_state and ours.config.predict_return and ours.config.action_tanh == action_tanh
    inputs = trajectory()
    assert_same_predictions(ours, theirs, inputs)
    mask = torch.ones(3, STEPS, dtype=torch.long)
    mask[0, :2] = 0  # left padding, the layout both implementations' get_action use
    assert_same_predictions(ours, theirs, inputs, mask)


def test_bin_checkpoint_with_old_buffers_and_model_card_statistics(tmp_path):
    theirs = reference_model(seed=3)
    theirs.config.save_pretrained(tmp_path)
    state_dict = dict(theirs.state_dict())
    for layer in range(2):  # what transformers 4.x checkpoints (the edbeeching/* ones) also hold
        state_dict[f"encoder.h.{layer}.attn.bias"] = torch.ones(1, 1, 64, 64, dtype=torch.bool).tril()
        state_dict[f"encoder.h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(state_dict, tmp_path / "pytorch_model.bin")
    mean, std = [0.1 * i for i in range(STATE_DIM)], [1.0 + i for i in range(STATE_DIM)]
    ours = TffDecisionTransformerModel.from_pretrained(
        tmp_path, state_mean=mean, state_std=std, return_scale=1000.0, target_return=3600.0, context_length=STEPS
    )
    assert ours.config.target_return == 3600.0 and ours.config.context_length == STEPS
    inputs = trajectory(seed=4)
    raw = inputs | {
        "states": inputs["states"] * torch.tensor(std) + torch.tensor(mean),
        "returns_to_go": inputs["returns_to_go"] * 1000.0,
    }
    with torch.no_grad():
        expected = theirs(**inputs, return_dict=True).action_preds
        torch.testing.assert_close(ours(**raw).action_preds, expected, rtol=0, atol=1e-5)
        # get_action on the raw history equals transformers on the normalised one
        acted = ours.get_action(raw["states"], raw["actions"][:, :-1], raw["returns_to_go"], raw["timesteps"])
        placeholder = inputs | {"actions": torch.cat([inputs["actions"][:, :-1], torch.zeros(3, 1, ACT_DIM)], 1)}
        torch.testing.assert_close(
            acted, theirs(**placeholder, return_dict=True).action_preds[:, -1], atol=1e-5, rtol=0
        )


def test_convert_command_writes_a_tf_family_checkpoint(tmp_path):
    theirs = reference_model(seed=5)
    theirs.save_pretrained(tmp_path / "in")
    overrides = json.dumps({"return_scale": 1.0, "env_id": "Hopper-v5"})
    assert cli_main(["convert", "decision-transformer", str(tmp_path / "in"), str(tmp_path / "out")]) == 0
    assert (
        cli_main(
            [
                "convert",
                "decision-transformer",
                str(tmp_path / "in"),
                str(tmp_path / "out2"),
                "--config-overrides",
                overrides,
            ]
        )
        == 0
    )
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["model_type"] == "tff_decision_transformer"
    assert not any(key.startswith("encoder.") for key in load_file(tmp_path / "out" / "model.safetensors"))
    loaded = AutoModel.from_pretrained(tmp_path / "out")
    assert type(loaded) is TffDecisionTransformerModel
    assert AutoModel.from_pretrained(tmp_path / "out2").config.env_id == "Hopper-v5"
    assert_same_predictions(loaded.eval(), theirs, trajectory(seed=6))


def test_bad_checkpoints_name_the_keys(tmp_path):
    theirs = reference_model(seed=7)
    theirs.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    weights["encoder.h.1.mlp.c_fc.weight"] = weights["encoder.h.1.mlp.c_fc.weight"][:, :10].contiguous()
    weights["surprise.weight"] = torch.zeros(2)
    del weights["embed_state.bias"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ValueError) as error:
        TffDecisionTransformerModel.from_pretrained(tmp_path)
    message = str(error.value)
    assert "missing keys ['embed_state.bias']" in message and "unexpected keys ['surprise.weight']" in message
    assert "layers.1.mlp.fc_in.weight: checkpoint (10, 32) vs model (128, 32)" in message
    unsupported = reference_model(seed=7, scale_attn_by_inverse_layer_idx=True)
    unsupported.save_pretrained(tmp_path / "unsupported")
    with pytest.raises(NotImplementedError, match="scale_attn_by_inverse_layer_idx=True"):
        TffDecisionTransformerModel.from_pretrained(tmp_path / "unsupported")
