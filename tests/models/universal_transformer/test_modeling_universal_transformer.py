"""The Universal Transformer with ACT beyond the common tester: the model's loop against tensor2tensor's
``universal_transformer_act`` (transcribed in tests/layers/test_halting.py) with the model's own modules, the ponder
outputs and loss, the per-step key/value cache, the attention backends and the input checks."""

import copy
import json

import pytest
import torch

from tests.layers.test_halting import t2t_act
from tf_family.models.universal_transformer.configuration_universal_transformer import TffUniversalTransformerConfig
from tf_family.models.universal_transformer.modeling_universal_transformer import (
    LearnedStepSignal,
    TffUniversalTransformerForCausalLM,
    TffUniversalTransformerForMaskedLM,
    TffUniversalTransformerForSequenceClassification,
    TffUniversalTransformerModel,
    build_allowed_mask,
    timing_signal,
)
from tf_family.registry import get_arch


def make_config(**overrides) -> TffUniversalTransformerConfig:
    return get_arch("universal_transformer").tiny_config(**{"act_max_steps": 6, **overrides})


def varied_halting(model: torch.nn.Module, seed: int = 0, scale: float = 0.3, bias: float = -3.0) -> torch.nn.Module:
    """Halting weights large enough that positions halt at different steps (the fresh init halts all at step 2);
    `reaching_max_steps`: some positions are also still running at ``act_max_steps``."""
    generator = torch.Generator().manual_seed(seed)
    unit = model.get_submodule("transformer.halting" if hasattr(model, "transformer") else "halting")
    with torch.no_grad():
        unit.linear.weight.copy_(torch.randn(unit.linear.weight.shape, generator=generator) * scale)
        unit.linear.bias.fill_(bias)
    return model.eval()


def reaching_max_steps(model: torch.nn.Module) -> torch.nn.Module:
    """`varied_halting` where about a third of the positions of `ids` never pass the threshold (checked in the
    tests that use it). A post-layer-norm state is smaller (unit scale, no piled-up timing signals): larger weights."""
    post = model.config.layer_norm_position == "post"
    return varied_halting(model, scale=0.3, bias=-5.0) if post else varied_halting(model, scale=0.1, bias=-4.0)


def ids(batch: int = 2, length: int = 9, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_timing_signal_is_tensor2tensors():
    # get_timing_signal_1d(length=3, channels=6): sin then cos of 3 timescales 1, 100, 1e4
    signal = timing_signal(torch.arange(3), 6)
    inverse = torch.tensor([1.0, 1e-2, 1e-4])
    positions = torch.arange(3.0)[:, None] * inverse
    torch.testing.assert_close(signal, torch.cat([positions.sin(), positions.cos()], dim=-1))
    assert timing_signal(torch.arange(2), 5).shape == (2, 5)  # odd width: a zero column


def test_allowed_mask_rows_are_never_empty():
    valid = torch.tensor([[False, False, True, True]])
    allowed = build_allowed_mask(valid, 4, causal=True)
    assert allowed.any(-1).all()
    assert allowed[0, 0].tolist() == [True, False, False, False]  # a padding query attends to itself only
    assert allowed[0, 3].tolist() == [False, False, True, True]


@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
@pytest.mark.parametrize("graves", [False, True])
@pytest.mark.parametrize("act_type", ["basic", "accumulated"])
@pytest.mark.parametrize("causal", [False, True])
def test_model_equals_tensor2tensor_loop(act_type, causal, graves, layer_norm_position):
    """tensor2tensor's loop with the model's halting unit, timing signals and blocks equals the model: the unweighted
    state feeds the next step, halted positions are still computed and still serve as keys, the timing signals are
    added at every step, the weighted state is the output. ``graves``: with ``act_force_halt_at_max_steps`` (the
    default) the positions still running at the last step halt there with their remainder; without, tensor2tensor's
    loop exactly."""
    torch.manual_seed(0)
    config = make_config(
        act_type=act_type,
        causal=causal,
        layers_per_step=2,
        act_force_halt_at_max_steps=graves,
        layer_norm_position=layer_norm_position,
    )
    model = reaching_max_steps(TffUniversalTransformerModel(config))
    input_ids = ids()
    with torch.no_grad():
        outputs = model(input_ids, use_cache=False)
        embeddings = model.word_embeddings(input_ids) * config.hidden_size**0.5  # t2t's sqrt_depth
        length = input_ids.shape[1]
        position = timing_signal(torch.arange(length), config.hidden_size)
        steps = timing_signal(torch.arange(config.act_max_steps), config.hidden_size)
        allowed = build_allowed_mask(torch.ones(2, length, dtype=torch.bool), length, causal)

        def transform(state, step):
            for block in model.blocks:
                state = block(state, allowed)[0]
            return state

        expected, n_updates, remainders = t2t_act(
            embeddings,
            lambda state, step: state + position + steps[step],
            model.halting,
            transform,
            config.act_max_steps,
            config.act_threshold,
            act_type,
            graves=graves,
        )
    assert len(set(n_updates.flatten().tolist())) > 1, "positions should halt at different steps"
    # the rule that differs: positions still running at act_max_steps halt there with R > 0 (Graves) or stop with R = 0
    assert (n_updates == config.act_max_steps).any(), "the test needs positions that reach act_max_steps"
    assert bool((remainders == 0).any()) != graves
    torch.testing.assert_close(outputs.last_hidden_state, model.final_layer_norm(expected), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outputs.ponder_steps, n_updates)
    torch.testing.assert_close(outputs.remainders, remainders)
    torch.testing.assert_close(outputs.ponder_cost, (n_updates + remainders).mean())


@pytest.mark.parametrize(
    "model_class",
    [TffUniversalTransformerModel, TffUniversalTransformerForCausalLM, TffUniversalTransformerForMaskedLM],
)
def test_fresh_model_starts_at_act_halting_bias_init(model_class):
    """The halting bias starts at act_halting_bias_init (the generic init of linear layers zeroed it), so a fresh
    model's first halting probabilities are near sigmoid(bias)."""
    torch.manual_seed(0)
    config = make_config(act_halting_bias_init=2.5)
    model = model_class(config)
    unit = model.get_submodule("transformer.halting" if hasattr(model, "transformer") else "halting")
    assert unit.linear.bias.item() == 2.5
    assert unit.linear.weight.std().item() == pytest.approx(config.initializer_range, rel=0.5)
    assert (
        model.get_submodule("transformer" if hasattr(model, "transformer") else "")
        .blocks[0]
        .transition.fc_in.bias.abs()
        .max()
        == 0
    )


@pytest.mark.parametrize(
    "model_class",
    [TffUniversalTransformerModel, TffUniversalTransformerForCausalLM, TffUniversalTransformerForMaskedLM],
)
def test_word_embeddings_start_at_tensor2tensors_scale(model_class):
    """tensor2tensor's symbol modality starts the embeddings at std d^-0.5, so scaled by sqrt(d) they enter the loop
    at unit variance, as large as the timing signals; at std initializer_range (0.02) they entered at 0.16 (d=64)
    and a fixed-depth UT learned the copy task half as well (bench/results/universal_transformer_act.md). The tied
    LM heads keep that init (their decoder is the same tensor)."""
    torch.manual_seed(0)
    config = make_config(hidden_size=64, num_attention_heads=4, vocab_size=512)
    model = model_class(config)
    embeddings = model.get_input_embeddings().weight
    assert embeddings[1:].std().item() == pytest.approx(64**-0.5, rel=0.05)
    assert (embeddings[1:] * 64**0.5).std().item() == pytest.approx(1.0, rel=0.05)
    if model_class is not TffUniversalTransformerModel:
        assert model.get_output_embeddings().weight is embeddings


def test_embeddings_enter_scaled_by_sqrt_depth():
    """tensor2tensor's multiply_embedding_mode="sqrt_depth": ``inputs_embeds`` e behave as token embeddings and enter
    the loop as ``e * sqrt(d)``; unscaled, embeddings of std 0.02 are drowned by the timing signals."""
    torch.manual_seed(0)
    config = make_config(act_max_steps=1, act_halting_bias_init=10.0)
    model = TffUniversalTransformerModel(config).eval()
    input_ids = ids()
    with torch.no_grad():
        embeddings = model.word_embeddings(input_ids)
        from_ids = model(input_ids).last_hidden_state
        torch.testing.assert_close(model(inputs_embeds=embeddings).last_hidden_state, from_ids)
        position = timing_signal(torch.arange(input_ids.shape[1]), config.hidden_size)
        steps = timing_signal(torch.arange(1), config.hidden_size)
        state = embeddings * config.hidden_size**0.5 + position + steps[0]
        allowed = build_allowed_mask(torch.ones_like(input_ids, dtype=torch.bool), input_ids.shape[1], False)
        expected = model.blocks[0](state, allowed)[0]  # halts at step 1 (p > 1 - eps): weight R = 1
    torch.testing.assert_close(from_ids, model.final_layer_norm(expected))


def test_ponder_outputs_skip_padding_and_enter_the_loss():
    torch.manual_seed(0)
    model = varied_halting(TffUniversalTransformerForMaskedLM(make_config()))
    input_ids = ids()
    mask = torch.ones_like(input_ids)
    mask[1, :3] = 0
    labels = input_ids.clone()
    with torch.no_grad():
        outputs = model(input_ids, attention_mask=mask, labels=labels)
        model.config.act_loss_weight = 0.0
        without = model(input_ids, attention_mask=mask, labels=labels)
    assert outputs.ponder_steps.shape == input_ids.shape
    assert (outputs.ponder_steps[mask.bool()] >= 1).all() and (outputs.ponder_steps[~mask.bool()] == 0).all()
    real = mask.bool()
    expected_cost = (outputs.ponder_steps + outputs.remainders)[real].mean()
    torch.testing.assert_close(outputs.ponder_cost, expected_cost)
    torch.testing.assert_close(outputs.loss, without.loss + 0.01 * expected_cost)


def test_ponder_cost_under_gradient_accumulation_is_weighted_by_the_calls_share():
    """With `Trainer`'s ``num_items_in_batch`` the token loss is a sum over it and the ponder cost (a mean over the
    call) enters weighted by the call's share of the counted labels (`tf_family.modeling.losses.batch_share`)."""
    model = varied_halting(TffUniversalTransformerForCausalLM(make_config()))
    input_ids = ids()
    labels = input_ids.clone()
    labels[0, 4:] = -100
    counted = int((labels[:, 1:] != -100).sum())
    with torch.no_grad():
        outputs = model(input_ids, labels=labels, num_items_in_batch=3 * counted)
        model.config.act_loss_weight = 0.0
        token_sum = model(input_ids, labels=labels, num_items_in_batch=1).loss
    torch.testing.assert_close(outputs.loss, token_sum / (3 * counted) + 0.01 * outputs.ponder_cost / 3)


def test_forced_halt_changes_only_positions_at_max_steps_and_trains_their_halting():
    """Graves's halt at act_max_steps (the default) against tensor2tensor's (``act_force_halt_at_max_steps=False``):
    the same outputs where a position halts earlier, a remainder and a different output where it reaches the last
    step; and a model that never halts gets a ponder-cost gradient to its halting unit only with the forced halt
    (tensor2tensor's ``N + 0`` is a count)."""
    torch.manual_seed(0)
    graves = reaching_max_steps(TffUniversalTransformerForMaskedLM(make_config(act_type="accumulated")))
    t2t = copy.deepcopy(graves)
    t2t.config.act_force_halt_at_max_steps = False
    input_ids = ids()
    with torch.no_grad():
        forced, stopped = graves(input_ids), t2t(input_ids)
    at_max = stopped.remainders == 0  # still running at the last step (the others halted by the threshold)
    assert at_max.any() and (~at_max).any()
    torch.testing.assert_close(forced.logits[~at_max], stopped.logits[~at_max])
    assert (forced.logits[at_max] - stopped.logits[at_max]).abs().amax(-1).min() > 1e-4
    torch.testing.assert_close(forced.remainders[~at_max], stopped.remainders[~at_max])
    assert (forced.remainders[at_max] > 0).all() and (stopped.remainders[at_max] == 0).all()
    torch.testing.assert_close(forced.ponder_cost, (forced.ponder_steps + forced.remainders).mean())

    for force, expect_gradient in ((True, True), (False, False)):
        model = TffUniversalTransformerModel(
            make_config(act_halting_bias_init=-10.0, act_force_halt_at_max_steps=force)
        )
        outputs = model(input_ids)
        assert (outputs.ponder_steps == model.config.act_max_steps).all()  # nothing halts by itself
        outputs.ponder_cost.backward()
        gradient = model.halting.linear.bias.grad
        assert (gradient is not None and bool(gradient.abs().sum() > 0)) == expect_gradient


def test_classifier_returns_ponder_steps():
    model = varied_halting(TffUniversalTransformerForSequenceClassification(make_config(num_labels=3)))
    outputs = model(ids(), labels=torch.tensor([0, 2]))
    assert outputs.logits.shape == (2, 3) and outputs.ponder_steps.shape == (2, 9)
    outputs.loss.backward()
    assert model.transformer.halting.linear.weight.grad.abs().sum() > 0  # the ponder cost trains the halting unit


def test_cache_runs_every_step_and_changes_no_output():
    """With a cache every position runs all steps (its keys may be needed later); the outputs equal the early-stopped
    forward, and decoding token by token from the cache equals the full forward."""
    torch.manual_seed(0)
    model = varied_halting(TffUniversalTransformerForCausalLM(make_config()))
    input_ids = ids(length=10)
    with torch.no_grad():
        uncached = model(input_ids, use_cache=False)
        cached = model(input_ids[:, :6], use_cache=True)
        assert len(cached.cache.layers) == model.config.act_max_steps  # one layer per step and block
        logits = [cached.logits]
        cache = cached.cache
        for t in range(6, 10):
            step = model(input_ids[:, t : t + 1], cache=cache, use_cache=True)
            logits.append(step.logits)
            cache = step.cache
    torch.testing.assert_close(torch.cat(logits, 1), uncached.logits, rtol=1e-5, atol=1e-5)
    assert len(set(uncached.ponder_steps.flatten().tolist())) > 1


def test_generation_with_varied_halting_equals_uncached():
    torch.manual_seed(0)
    model = varied_halting(TffUniversalTransformerForCausalLM(make_config()), seed=1)
    prompt = ids(length=5)
    kwargs = {"max_new_tokens": 6, "do_sample": False, "attention_mask": torch.ones_like(prompt)}
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **kwargs)
        uncached = model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)


def test_eager_and_sdpa_agree():
    torch.manual_seed(0)
    model = varied_halting(TffUniversalTransformerForMaskedLM(make_config()))
    input_ids = ids()
    mask = torch.ones_like(input_ids)
    mask[0, -2:] = 0
    with torch.no_grad():
        model.set_attn_implementation("eager")
        eager = model(input_ids, attention_mask=mask).logits
        model.set_attn_implementation("sdpa")
        sdpa = model(input_ids, attention_mask=mask).logits
    torch.testing.assert_close(sdpa[mask.bool()], eager[mask.bool()], rtol=1e-5, atol=1e-5)


def _mhsa(attention, inputs: torch.Tensor) -> torch.Tensor:
    """Multi-head self-attention written out with ``attention``'s weights (no mask, no dropout)."""
    batch, length, width = inputs.shape
    heads, head_dim = attention.num_heads, attention.head_dim
    q, k, v = (
        proj(inputs).view(batch, length, heads, head_dim).transpose(1, 2)
        for proj in (attention.query, attention.key, attention.value)
    )
    probs = torch.softmax(q @ k.transpose(-1, -2) / head_dim**0.5, dim=-1)
    return attention.out_proj((probs @ v).transpose(1, 2).reshape(batch, length, width))


@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
def test_block_is_the_papers_equations_with_post_layer_norm(layer_norm_position):
    """``layer_norm_position="post"``: one step is the paper's section 2.1, ``A = LN(x + MHSA(x))``, ``H = LN(A +
    FFN(A))`` with ``x = H_prev + P + S``; the default ``"pre"`` normalises each sub-layer's input instead
    (tensor2tensor's code). Written out with the block's own weights."""
    torch.manual_seed(0)
    config = make_config(layer_norm_position=layer_norm_position, hidden_size=32, num_attention_heads=2)
    block = TffUniversalTransformerModel(config).blocks[0].eval()
    attention, transition = block.attention, block.transition
    with torch.no_grad():  # non-trivial layer norms, so that a swapped one would show
        for norm in (attention.layer_norm, transition.layer_norm):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
    x = torch.randn(2, 5, 32) * 3
    allowed = build_allowed_mask(torch.ones(2, 5, dtype=torch.bool), 5, False)
    with torch.no_grad():
        if layer_norm_position == "post":
            a = attention.layer_norm(x + _mhsa(attention, x))
            expected = transition.layer_norm(a + transition.fc_out(torch.relu(transition.fc_in(a))))
        else:
            a = x + _mhsa(attention, attention.layer_norm(x))
            expected = a + transition.fc_out(torch.relu(transition.fc_in(transition.layer_norm(a))))
        torch.testing.assert_close(block(x, allowed)[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
def test_post_layer_norm_keeps_the_re_added_timing_signals_from_piling_up(layer_norm_position):
    """The state after each step: with ``"pre"`` it keeps every step's timing signals (at init, step ``n`` holds
    about ``n`` copies of the position signal, so its norm grows with ``n``); with ``"post"`` every step's output is
    normalised, so it has unit scale at every step (LN at init: weight 1, bias 0)."""
    torch.manual_seed(0)
    config = make_config(layer_norm_position=layer_norm_position, act_max_steps=8, act_halting_bias_init=-10.0)
    model = TffUniversalTransformerModel(config).eval()
    with torch.no_grad():
        states = model(ids(), output_hidden_states=True).hidden_states[1:-1]  # after each of the 8 steps
    norms = [state.pow(2).mean(-1).sqrt().mean().item() for state in states]  # RMS per position
    if layer_norm_position == "post":
        assert norms == pytest.approx([1.0] * 8, rel=1e-3)
    else:
        assert norms[-1] > 3 * norms[0], norms


def test_attentions_and_hidden_states_per_step():
    model = TffUniversalTransformerModel(make_config(layers_per_step=2)).eval()
    outputs = model(ids(), output_attentions=True, output_hidden_states=True)
    steps = int(outputs.ponder_steps.max())
    assert len(outputs.attentions) == 2 * steps
    assert len(outputs.hidden_states) == steps + 2  # embeddings, every step's state, the output


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"act_epsilon": 0.0}, "act_epsilon"),
        ({"act_max_steps": 0}, "act_max_steps"),
        ({"act_type": "graves"}, "act_type"),
        ({"hidden_size": 30, "num_attention_heads": 4}, "num_attention_heads"),
        ({"act_loss_weight": -1.0}, "act_loss_weight"),
        ({"act_force_halt_at_max_steps": "yes"}, "act_force_halt_at_max_steps"),
        ({"layer_norm_position": "sandwich"}, "layer_norm_position"),
        ({"step_timing_signal": "learnt"}, "step_timing_signal must be one of 'sinusoid', 'learned'"),
    ],
)
def test_config_errors_name_the_field(overrides, message):
    with pytest.raises((ValueError, TypeError), match=message):
        make_config(**overrides)


def test_input_errors():
    encoder = TffUniversalTransformerModel(make_config()).eval()
    with pytest.raises(ValueError, match="token_type_ids"):
        encoder(ids(), token_type_ids=torch.zeros(2, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="causal model"):
        encoder(ids(), use_cache=True)
    with pytest.raises(ValueError, match="add_pooling_layer"):
        TffUniversalTransformerModel(make_config(), add_pooling_layer=True)
    decoder = TffUniversalTransformerForCausalLM(make_config()).eval()
    with pytest.raises(ValueError, match="attention_mask"):
        decoder(ids(), attention_mask=torch.ones(2, 4, dtype=torch.long))


def test_configs_saved_before_layer_norm_position_load_as_pre(tmp_path):
    """A config saved without ``layer_norm_position`` (before the field existed) loads as ``"pre"``: the model it
    describes is unchanged."""
    config = make_config()
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    saved.pop("layer_norm_position")
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert TffUniversalTransformerConfig.from_pretrained(tmp_path).layer_norm_position == "pre"


@pytest.mark.parametrize("layer_norm_position", ["pre", "post"])
def test_learned_step_signal_is_tensor2tensors_and_trains(layer_norm_position):
    """``step_timing_signal="learned"``: before step ``n`` the state gets ``weight[n] * sqrt(d)``, the weight started
    at std ``d ** -0.5`` (tensor2tensor's ``get_layer_timing_signal_learned_1d``), in place of the step's sinusoid;
    the loop is otherwise tensor2tensor's, and the signal gets a gradient."""
    torch.manual_seed(0)
    config = make_config(step_timing_signal="learned", layer_norm_position=layer_norm_position, hidden_size=64)
    model = reaching_max_steps(TffUniversalTransformerModel(config))
    weight = model.step_signal.weight
    assert weight.shape == (config.act_max_steps, 64)
    assert 0.8 * 64**-0.5 < float(weight.detach().std()) < 1.2 * 64**-0.5  # t2t's init (not initializer_range)
    input_ids = ids()
    outputs = model(input_ids, use_cache=False)
    with torch.no_grad():
        embeddings = model.word_embeddings(input_ids) * 8.0
        position = timing_signal(torch.arange(input_ids.shape[1]), 64)
        steps = weight * 8.0
        allowed = build_allowed_mask(torch.ones(2, input_ids.shape[1], dtype=torch.bool), input_ids.shape[1], False)
        expected, n_updates, _ = t2t_act(
            embeddings,
            lambda state, step: state + position + steps[step],
            model.halting,
            lambda state, step: model.blocks[0](state, allowed)[0],
            config.act_max_steps,
            config.act_threshold,
            "basic",
            graves=True,
        )
    assert len(set(n_updates.flatten().tolist())) > 1, "positions should halt at different steps"
    torch.testing.assert_close(outputs.last_hidden_state, model.final_layer_norm(expected), rtol=1e-5, atol=1e-5)
    sinusoid = TffUniversalTransformerModel(make_config(layer_norm_position=layer_norm_position, hidden_size=64))
    sinusoid.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("step_signal.")})
    reaching_max_steps(sinusoid)
    assert not torch.allclose(sinusoid(input_ids).last_hidden_state, outputs.last_hidden_state)
    outputs.last_hidden_state.square().sum().backward()
    assert weight.grad is not None and bool(weight.grad[: int(n_updates.max())].abs().sum(-1).gt(0).all())


def test_learned_step_signal_round_trips_and_sinusoid_models_have_no_new_weights(tmp_path):
    """A learned model saves and reloads its step vectors; a sinusoid model (the default) has no step parameters, so
    its state dict -- and a checkpoint saved before the field existed -- is unchanged, and such a config loads as
    ``"sinusoid"``."""
    torch.manual_seed(0)
    model = TffUniversalTransformerForCausalLM(make_config(step_timing_signal="learned")).eval()
    model.save_pretrained(tmp_path / "learned")
    loaded = TffUniversalTransformerForCausalLM.from_pretrained(tmp_path / "learned").eval()
    torch.testing.assert_close(loaded.transformer.step_signal.weight, model.transformer.step_signal.weight)
    torch.testing.assert_close(loaded(ids()).logits, model(ids()).logits)
    default = TffUniversalTransformerForCausalLM(make_config())
    assert not any(isinstance(module, LearnedStepSignal) for module in default.modules())
    assert not any("step_signal" in name for name in default.state_dict())
    default.config.save_pretrained(tmp_path / "old")
    saved = json.loads((tmp_path / "old" / "config.json").read_text())
    saved.pop("step_timing_signal")
    (tmp_path / "old" / "config.json").write_text(json.dumps(saved))
    assert TffUniversalTransformerConfig.from_pretrained(tmp_path / "old").step_timing_signal == "sinusoid"
