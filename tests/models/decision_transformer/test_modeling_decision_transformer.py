"""Decision Transformer: losses, normalisation, attention backends, acting helpers, discrete actions."""

import copy
from types import MappingProxyType

import pytest
import torch
import torch.nn.functional as F

from tf_family import TffDecisionTransformerConfig, TffDecisionTransformerModel, TrajectoryContext
from tf_family.models.decision_transformer.modeling_decision_transformer import build_trajectory_attention_mask
from tf_family.registry import get_arch

from ...common import tester

SPEC = get_arch("decision_transformer")
DISCRETE = {"action_space": "discrete", "action_tanh": False, "act_dim": 4}


def _discrete_spec():
    spec = copy.copy(SPEC)
    variants = dict(SPEC.variants)
    variants["tiny"] = MappingProxyType({**SPEC.variants["tiny"], **DISCRETE})
    object.__setattr__(spec, "variants", MappingProxyType(variants))
    return spec


@pytest.mark.parametrize("check", tester.ALL_CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
def test_common_checks_with_discrete_actions(check):
    check(_discrete_spec())


def _model(**overrides):
    return tester.build(SPEC, "action", **overrides)


def _inputs(config, batch=3, length=7, seed=0):
    return tester.make_inputs(SPEC, config, "action", batch=batch, length=length, seed=seed)


def test_loss_counts_real_steps_only():
    model = _model()
    inputs = _inputs(model.config)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, :3] = 0  # left padding
    mask[2, 5:] = 0  # right padding
    out = model(**inputs, attention_mask=mask)
    real = mask.bool()
    expected = (out.action_preds - inputs["labels"])[real].pow(2).mean()
    torch.testing.assert_close(out.action_loss, expected)
    garbage = inputs["labels"].clone()
    garbage[~real] = 100.0
    torch.testing.assert_close(model(**inputs | {"labels": garbage}, attention_mask=mask).action_loss, expected)
    # the auxiliary next-state / next-return terms use pairs of real steps
    states = model.normalize_states(inputs["states"])
    pairs = real[:, :-1] & real[:, 1:]
    state_mse = (out.state_preds[:, :-1] - states[:, 1:])[pairs].pow(2).mean()
    return_mse = (out.return_preds[:, :-1] - inputs["returns_to_go"][:, 1:] / model.config.return_scale)[pairs]
    total = expected + 0.5 * state_mse + 0.5 * return_mse.pow(2).mean()
    torch.testing.assert_close(out.loss, total)


def test_discrete_loss_is_cross_entropy_and_ids_equal_one_hot():
    model = _model(**DISCRETE)
    inputs = _inputs(model.config)
    inputs["labels"][1, 2] = -100
    out = model(**inputs)
    logits = out.action_preds.reshape(-1, 4)
    torch.testing.assert_close(out.action_loss, F.cross_entropy(logits, inputs["labels"].reshape(-1)))
    one_hot = F.one_hot(inputs["actions"], 4).float()
    torch.testing.assert_close(model(**inputs | {"actions": one_hot}).action_preds, out.action_preds)
    with pytest.raises(ValueError, match="discrete labels"):
        model(**inputs | {"labels": one_hot})


def test_state_and_return_normalisation_live_in_the_config():
    torch.manual_seed(0)
    mean, std = [0.5, -1.0, 2.0, 0.0, 3.0], [2.0, 0.5, 1.0, 4.0, 0.1]
    normalising = TffDecisionTransformerModel(SPEC.tiny_config(state_mean=mean, state_std=std, return_scale=50.0))
    plain = TffDecisionTransformerModel(SPEC.tiny_config())
    plain.load_state_dict(normalising.state_dict())
    inputs = tester.without_labels(_inputs(normalising.config))
    normalised = inputs | {
        "states": (inputs["states"] - torch.tensor(mean)) / torch.tensor(std),
        "returns_to_go": inputs["returns_to_go"] / 50.0,
    }
    torch.testing.assert_close(normalising(**inputs).action_preds, plain(**normalised).action_preds)


def test_eager_and_sdpa_agree_with_padding():
    model = _model().train()  # dropout is 0 in the tiny config
    inputs = _inputs(model.config)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, :4] = 0
    results = []
    for implementation in ("eager", "sdpa"):
        model.zero_grad()
        model.set_attn_implementation(implementation)
        out = model(**inputs, attention_mask=mask)
        out.loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((out.action_preds.detach(), out.loss.detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-5, atol=1e-6)
    for name in results[0][2]:
        torch.testing.assert_close(results[0][2][name], results[1][2][name], rtol=1e-4, atol=1e-6, msg=name)
    attentions = model(**inputs, attention_mask=mask, output_attentions=True).attentions
    assert len(attentions) == 2 and attentions[0].shape == (3, 2, 21, 21)
    assert torch.all(attentions[0][0, :, 12:, :12] == 0), "real tokens attend to padded steps"


def test_trajectory_mask():
    allowed = build_trajectory_attention_mask(torch.tensor([[False, True, True]]))[0, 0]  # (9, 9)
    assert allowed.shape == (9, 9)
    assert torch.equal(allowed[3:, 3:], torch.ones(6, 6, dtype=torch.bool).tril())
    assert not allowed[3:, :3].any() and torch.equal(allowed[:3, :3], torch.eye(3, dtype=torch.bool))


def test_get_action_crops_pads_and_accepts_histories():
    model = _model()
    config = model.config
    history = _inputs(config, batch=2, length=config.context_length + 4)
    history["timesteps"] = torch.arange(config.context_length + 4).repeat(2, 1)
    full = model.get_action(history["states"], history["actions"], history["returns_to_go"], history["timesteps"])
    window = {k: v[:, -config.context_length :] for k, v in tester.without_labels(history).items()}
    torch.testing.assert_close(full, model(**window).action_preds[:, -1])
    # t - 1 actions: the placeholder is appended; the last action never matters
    shorter = model.get_action(
        history["states"], history["actions"][:, :-1], history["returns_to_go"], history["timesteps"]
    )
    torch.testing.assert_close(shorter, full)
    # short history: left padding to K; unbatched input
    single = model.get_action(
        history["states"][0, :3], history["actions"][0, :2], history["returns_to_go"][0, :3], torch.arange(3)
    )
    short = {k: v[:1, :3] for k, v in tester.without_labels(history).items()}
    torch.testing.assert_close(single, model(**short).action_preds[0, -1])
    with pytest.raises(ValueError, match="actions must cover"):
        model.get_action(history["states"], history["actions"][:, :-3], history["returns_to_go"], history["timesteps"])


def test_context_restarts_rows_and_sampling_is_seeded():
    model = _model(**DISCRETE)
    config = model.config
    states = torch.randn(3, config.state_dim)
    context = TrajectoryContext.start(config, states, target_return=torch.tensor([1.0, 2.0, 3.0]))
    for _ in range(3):
        action = model.get_action(**context.model_inputs())
        context = context.advance(action, torch.ones(3), torch.randn(3, config.state_dim))
    restarted = context.restart(torch.tensor([False, True, False]), torch.randn(3, config.state_dim), 9.0)
    assert restarted.mask[1].sum() == 1 and restarted.mask[0].sum() == 4
    assert restarted.returns_to_go[1, -1] == 9.0 and restarted.timesteps[1, -1] == 0
    assert torch.equal(restarted.returns_to_go[0], context.returns_to_go[0])
    fresh = TrajectoryContext.start(config, restarted.states[1:2, -1], 9.0)
    torch.testing.assert_close(
        model.get_action(**restarted.model_inputs())[1:2], model.get_action(**fresh.model_inputs())
    )
    draws = [
        model.get_action(**context.model_inputs(), do_sample=True, generator=torch.Generator().manual_seed(3))
        for _ in range(2)
    ]
    assert torch.equal(draws[0], draws[1])
    with pytest.raises(ValueError, match="target_return"):
        TrajectoryContext.start(config, states)


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="hidden_size=30 must be divisible by n_head=4"):
        TffDecisionTransformerConfig(hidden_size=30, n_head=4)
    with pytest.raises(ValueError, match="action_tanh"):
        TffDecisionTransformerConfig(action_space="discrete")
    with pytest.raises(ValueError, match="state_std must be > 0"):
        TffDecisionTransformerConfig(state_dim=2, state_std=[1.0, 0.0])
    with pytest.raises(ValueError, match="state_mean must have state_dim=3"):
        TffDecisionTransformerConfig(state_dim=3, state_mean=[0.0])
    with pytest.raises(ValueError, match="set predict_state=True"):
        TffDecisionTransformerConfig(state_loss_weight=1.0)
    with pytest.raises(TypeError, match="action_space"):
        TffDecisionTransformerConfig(action_space="hybrid")
    model = _model()
    inputs = _inputs(model.config)
    with pytest.raises(ValueError, match=r"timesteps must lie in \[0, max_ep_len=64\)"):
        model(**inputs | {"timesteps": inputs["timesteps"] + 64})
    with pytest.raises(ValueError, match=r"needs \['returns_to_go'\]"):
        model(states=inputs["states"], actions=inputs["actions"], timesteps=inputs["timesteps"])


def test_evaluate_in_cartpole():
    pytest.importorskip("gymnasium")
    from tf_family.rl import evaluate_in_env

    torch.manual_seed(0)
    config = SPEC.tiny_config(state_dim=4, act_dim=2, action_space="discrete", action_tanh=False)
    model = TffDecisionTransformerModel(config)
    reference = {"random": 20.0, "expert": 500.0}
    kwargs = {"target_return": 500.0, "num_episodes": 3, "seed": 7, "reference_returns": reference}
    first = evaluate_in_env(model, "CartPole-v1", **kwargs, max_episode_steps=40)
    second = evaluate_in_env(model, "CartPole-v1", **kwargs, max_episode_steps=40)
    assert first == second
    assert len(first["returns"]) == 3 and all(1 <= n <= 40 for n in first["lengths"])
    assert first["returns"] == [float(n) for n in first["lengths"]]  # CartPole pays 1 per step
    assert first["normalized_score"] == pytest.approx(100 * (first["mean_return"] - 20.0) / 480.0)
    with pytest.raises(ValueError, match="state_dim=5"):
        evaluate_in_env(_model(), "CartPole-v1", target_return=1.0, num_episodes=1)


def test_evaluate_continuous_pendulum_clips_to_the_action_bounds():
    pytest.importorskip("gymnasium")
    from tf_family.rl import evaluate_in_env

    torch.manual_seed(0)
    config = SPEC.tiny_config(state_dim=3, act_dim=1, action_tanh=False, env_id="Pendulum-v1", target_return=-150.0)
    model = TffDecisionTransformerModel(config)
    with torch.no_grad():
        model.predict_action.bias.fill_(50.0)  # far outside Pendulum's [-2, 2]: the helper must clip
    result = evaluate_in_env(model, num_episodes=2, max_episode_steps=5, reference_returns=None)
    assert result["env_id"] == "Pendulum-v1" and result["target_return"] == -150.0
    assert result["lengths"] == [5, 5] and all(r < 0 for r in result["returns"])
    assert "normalized_score" in result  # Pendulum-v1 has a scripted expert: default references apply


def test_lora_targets_train():
    peft = pytest.importorskip("peft")
    model = _model()
    lora = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=list(SPEC.lora_target_modules)))
    inputs = _inputs(model.config)
    lora(**inputs).loss.backward()
    trained = [n for n, p in lora.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    assert all(p.grad is not None for n, p in lora.named_parameters() if p.requires_grad)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_default_masks_are_built_on_the_inputs_device():
    model = _model().cuda()
    inputs = {k: v.cuda() for k, v in _inputs(model.config).items()}
    out = model(**inputs)  # no attention_mask: the default one must be made on the GPU
    assert out.action_preds.device.type == "cuda" and torch.isfinite(out.loss)
    context = TrajectoryContext.start(model.config, inputs["states"][:, 0], target_return=1.0)
    action = model.get_action(**context.model_inputs())
    assert action.device.type == "cuda"
    torch.testing.assert_close(
        action.cpu(), model.cpu().get_action(**{k: v.cpu() for k, v in context.model_inputs().items()})
    )


def test_torch_compile_captures_one_graph():
    model = _model()
    inputs = _inputs(model.config)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)  # no graph break anywhere in forward
    with torch.no_grad():
        torch.testing.assert_close(compiled(**inputs).action_preds, model(**inputs).action_preds, rtol=0, atol=0)


# ----------------------------------------------------------------------------------- GTrXL blocks (gating="gru")
def _gated_spec():
    spec = copy.copy(SPEC)
    variants = dict(SPEC.variants)
    variants["tiny"] = MappingProxyType({**SPEC.variants["tiny"], "gating": "gru"})
    object.__setattr__(spec, "variants", MappingProxyType(variants))
    return spec


@pytest.mark.parametrize("check", tester.ALL_CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
def test_common_checks_with_gtrxl_blocks(check):
    check(_gated_spec())


def test_gtrxl_block_is_the_gated_formula():
    """``x1 = g1(x, relu(attn(ln(x))))``, ``out = g2(x1, relu(mlp(ln(x1))))``, with GRU gates (eq. 5-8 of the
    paper, `GRUGate`) in place of both residuals; a GPT-2 block of the same weights adds instead."""
    from tf_family.layers.gated_residual import GRUGate

    model = _model(gating="gru").eval()
    block = model.layers[0]
    assert isinstance(block.attention_gate, GRUGate) and isinstance(block.mlp_gate, GRUGate)
    hidden = torch.randn(2, 9, model.config.hidden_size)
    allowed = build_trajectory_attention_mask(torch.ones(2, 3, dtype=torch.bool))
    attended, _ = block.attention(block.attention_norm(hidden), allowed)
    middle = block.attention_gate(hidden, F.relu(attended))
    expected = block.mlp_gate(middle, F.relu(block.mlp(block.mlp_norm(middle))))
    torch.testing.assert_close(block(hidden, allowed)[0], expected)
    plain = _model().eval().layers[0]
    assert plain.attention_gate is None and plain.mlp_gate is None


def test_fresh_gtrxl_blocks_start_near_the_identity():
    """``b_g`` is subtracted in the update gate: a large bias closes every gate, so a fresh block passes its input
    through unchanged; the default (2, the paper's) keeps the update gate near ``sigmoid(-2)``."""
    allowed = build_trajectory_attention_mask(torch.ones(2, 3, dtype=torch.bool))
    hidden = torch.randn(2, 9, 32)
    config = _model(gating="gru", hidden_size=32).config  # the tester's model has its weights perturbed: a fresh one
    closed_config = copy.deepcopy(config)
    closed_config.gate_bias = 40.0
    closed = TffDecisionTransformerModel(closed_config)
    torch.testing.assert_close(closed.eval().layers[0](hidden, allowed)[0], hidden, atol=1e-6, rtol=0)
    model = TffDecisionTransformerModel(config)
    gate = model.layers[0].attention_gate
    assert torch.equal(gate.gate_bias, torch.full((32,), 2.0))
    update = torch.sigmoid(gate.update_y(hidden) + gate.update_x(hidden) - gate.gate_bias)
    assert 0.05 < update.mean().item() < 0.25
    # every gate parameter learns
    out = model(**_inputs(model.config))
    out.loss.backward()
    for name, parameter in model.named_parameters():
        if "_gate." in name:
            assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name


def test_gtrxl_config_is_validated():
    with pytest.raises(TypeError, match="gating"):
        TffDecisionTransformerConfig(gating="lstm")
    with pytest.raises((TypeError, ValueError), match="gate_bias"):
        TffDecisionTransformerConfig(gating="gru", gate_bias=float("nan"))


def test_gtrxl_blocks_load_as_remote_code_without_tf_family(tmp_path):
    from ...test_remote_code import _export_and_expect, _load_without_tf_family

    folder, tensors = tmp_path / "action" / "model", tmp_path / "action.safetensors"
    _load_without_tf_family(
        {"action": _export_and_expect(_gated_spec(), "action", folder, tensors, tmp_path)}, tmp_path
    )
