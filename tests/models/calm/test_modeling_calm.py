"""CALM: exits that never fire are the full model; forced and per-row exits equal k layers plus state propagation;
every cache layer stays aligned; batched per-row exits equal row-by-row runs; eager and SDPA agree; Llama parity."""

import copy
import math

import pytest
import torch
from transformers import DynamicCache, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from tf_family import TffCalmConfig, TffCalmForCausalLM
from tf_family.registry import get_arch

SPEC = get_arch("calm")
GREEDY = {"do_sample": False, "output_scores": True, "return_dict_in_generate": True}


def build(seed: int = 0, dtype=torch.float64, **overrides) -> TffCalmForCausalLM:
    """A tiny CALM model with weights pushed off the small init (so the layers disagree visibly)."""
    torch.manual_seed(seed)
    model = TffCalmForCausalLM(SPEC.tiny_config(**overrides)).eval().to(dtype)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return model


def prompt(batch: int = 3, length: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 128, (batch, length), generator=torch.Generator().manual_seed(seed))


def generate(model, ids, steps=6, **kwargs):
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=steps, output_exit_layers=True, **GREEDY, **kwargs
        )
    # the exit layer of each generated token: the first comes from the prompt's last position
    return out, out.exit_layers  # (B, steps)


def threshold_with_mixed_exits(model, ids) -> float:
    """A threshold at which rows exit at different layers (found on the model's own confidences)."""
    for threshold in (0.5, 0.3, 0.2, 0.1, 0.05, 0.7, 0.02):
        model.config.exit_threshold = threshold
        _, exits = generate(model, ids)
        if len(set(exits.flatten().tolist())) >= 3:
            return threshold
    raise AssertionError("no threshold gave mixed exits")


@pytest.mark.parametrize("threshold", [None, math.inf, 1.5])
def test_threshold_never_met_is_the_full_model(threshold):
    """None and inf skip the exit checks; 1.5 runs them all (softmax_diff <= 1 never reaches it)."""
    model = build()
    ids = prompt()
    model.config.exit_threshold = None
    full, _ = generate(model, ids)
    model.config.exit_threshold = threshold
    early, exits = generate(model, ids)
    assert torch.equal(early.sequences, full.sequences)
    for a, b in zip(early.scores, full.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert bool((exits == model.config.num_hidden_layers).all())


def test_forced_exit_is_k_layers_plus_propagated_cache():
    model = build()
    ids = prompt(2, 7)
    depth, k = model.config.num_hidden_layers, 2
    with torch.no_grad():
        forced = model(ids, exit_layer=k, use_cache=True)
        # k layers: the same model run at depth k (what assistant_early_exit does)
        model.config.num_hidden_layers = k
        truncated = model(ids, use_cache=True, output_hidden_states=True)
        model.config.num_hidden_layers = depth
        torch.testing.assert_close(forced.logits, truncated.logits, rtol=0, atol=0)
        assert bool((forced.exit_layers == k).all())
        cache = forced.cache
        assert [cache.get_seq_length(i) for i in range(depth)] == [7] * depth
        exit_state = truncated.hidden_states[k]  # (B, T, D) after k layers
        cos, sin = model.model.prepare(ids, None, None, None, None)[1:3]
        for index in range(depth):
            key, value = cache.layers[index].keys, cache.layers[index].values
            if index < k:
                torch.testing.assert_close(key, truncated.cache.layers[index].keys, rtol=0, atol=0)
                continue
            layer = model.model.layers[index]
            expected_key, expected_value = layer.self_attn.key_value(layer.input_layernorm(exit_state), cos, sin)
            # one folded product for all skipped layers (norm weight inside the projection): float64 rounding only
            torch.testing.assert_close(key, expected_key, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(value, expected_value, rtol=1e-12, atol=1e-12)


def test_propagation_through_lora_projections_uses_the_adapters():
    """A LoRA-wrapped value projection (peft; the card's targets) adds its update to the propagated values too: the
    one-product propagation must not read the wrapped layer's base weight and drop the adapter."""
    peft = pytest.importorskip("peft")
    model = build()
    adapted = peft.get_peft_model(model, peft.LoraConfig(target_modules=list(SPEC.lora_target_modules), r=4))
    with torch.no_grad():
        for name, parameter in adapted.named_parameters():
            if "lora_B" in name:  # peft starts B at zero (no change): make the adapter visible
                parameter.normal_(std=0.5)
    ids, k = prompt(2, 7), 1
    with torch.no_grad():
        cache = adapted(input_ids=ids, exit_layer=k, use_cache=True).cache
        model.config.num_hidden_layers = k
        exit_state = adapted(input_ids=ids, use_cache=True, output_hidden_states=True).hidden_states[k]
        model.config.num_hidden_layers = SPEC.tiny_config().num_hidden_layers
        cos, sin = model.model.prepare(ids, None, None, None, None)[1:3]
        for index in range(k, model.config.num_hidden_layers):
            layer = model.model.layers[index]
            key, value = layer.self_attn.key_value(layer.input_layernorm(exit_state), cos, sin)  # through LoRA
            torch.testing.assert_close(cache.layers[index].keys, key, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(cache.layers[index].values, value, rtol=1e-12, atol=1e-12)


def test_logits_to_keep_keeps_the_last_positions():
    """`generate` passes ``logits_to_keep=1``: the prompt's forward projects one position onto the vocabulary."""
    model = build()
    ids = prompt(2, 6)
    assert model._supports_logits_to_keep()
    with torch.no_grad():
        for kwargs in ({}, {"exit_layer": 2}):
            every = model(ids, **kwargs).logits
            for keep in (1, 3, 6, 9):
                kept = model(ids, logits_to_keep=keep, **kwargs).logits
                torch.testing.assert_close(kept, every[:, -keep:], rtol=1e-12, atol=1e-12)  # float64
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(ids, labels=ids, logits_to_keep=1)
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(ids, logits_to_keep=-1)
    with pytest.raises(TypeError, match="logits_to_keep"):
        model(ids, logits_to_keep=1.5)


def test_dynamic_exits_follow_the_rule_and_equal_forced_exits_step_by_step():
    """At batch 1, each decoding step exits at the first exit whose softmax_diff reaches λ'(t) (the decayed
    threshold at the token's position t), and its logits equal a step forced to exit there (same cache)."""
    model = build(position_temperature=4.0, decay_length=16)
    ids = prompt(1, 5)
    threshold = threshold_with_mixed_exits(model, ids)
    out, exits = generate(model, ids, steps=8)
    model.config.exit_threshold = None
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(ids, cache=cache, use_cache=True)
        for step in range(1, 8):
            token = out.sequences[:, 5 + step - 1 : 5 + step]
            position = 5 + step - 1
            decayed = 0.9 * threshold + 0.1 * threshold * math.exp(-4.0 * position / 16)
            expected = 4
            for k in (1, 2, 3):
                probe = model(token, cache=copy.deepcopy(cache), use_cache=True, exit_layer=k)
                top = probe.logits[0, -1].softmax(-1).topk(2).values
                if float(top[0] - top[1]) >= decayed:
                    expected = k
                    break
            assert int(exits[0, step]) == expected, f"step {step}"
            replay = model(token, cache=cache, use_cache=True, exit_layer=expected)
            torch.testing.assert_close(replay.logits[:, -1].float(), out.scores[step], rtol=0, atol=0)
    assert len(set(exits[0, 1:].tolist())) >= 2  # the replay covered different exit layers


def test_all_cache_layers_stay_aligned_under_exits():
    model = build()
    ids = prompt()
    model.config.exit_threshold = threshold_with_mixed_exits(model, ids)
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=6, do_sample=False, output_exit_layers=True, return_dict_in_generate=True
        )
    cache = out.cache
    lengths = {cache.get_seq_length(i) for i in range(model.config.num_hidden_layers)}
    assert lengths == {5 + 6 - 1}, lengths
    exits = out.exit_layers[:, 1:]  # the tokens generated by one-token steps
    assert exits.shape == (3, 5) and int(exits.min()) < model.config.num_hidden_layers


@pytest.mark.parametrize("measure", ["softmax_diff", "softmax_max", "state", "meta", "restricted_softmax"])
def test_batched_per_row_exits_equal_row_by_row(measure):
    overrides = {"confidence_measure": measure}
    if measure == "restricted_softmax":
        overrides["restricted_vocab"] = list(range(0, 128, 3))
    model = build(**overrides)
    ids = prompt(4)
    if measure == "meta":
        with torch.no_grad():  # a meta classifier that varies with the state
            model.meta_classifier.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(3))
    thresholds = {"state": 0.9, "meta": 0.5}
    if measure in thresholds:
        model.config.exit_threshold = thresholds[measure]
    else:
        model.config.exit_threshold = threshold_with_mixed_exits(model, ids)
    batched, batched_exits = generate(model, ids)
    for row in range(ids.shape[0]):
        alone, alone_exits = generate(model, ids[row : row + 1])
        assert torch.equal(alone.sequences[0], batched.sequences[row])
        assert torch.equal(alone_exits[0], batched_exits[row])
        for a, b in zip(alone.scores, batched.scores, strict=True):
            torch.testing.assert_close(a[0], b[row], rtol=1e-9, atol=1e-9)
    assert int(batched_exits.min()) < model.config.num_hidden_layers  # something did exit


def test_per_row_exits_with_left_padding_equal_row_alone():
    model = build()
    ids = prompt(2, 6)
    model.config.exit_threshold = threshold_with_mixed_exits(model, prompt())
    padded = ids.clone()
    padded[1, :2] = 0
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with torch.no_grad():
        batched = model.generate(padded, attention_mask=mask, max_new_tokens=5, output_exit_layers=True, **GREEDY)
    alone, alone_exits = generate(model, ids[1:, 2:], steps=5)
    assert torch.equal(batched.sequences[1, 6:], alone.sequences[0, 4:])
    assert torch.equal(batched.exit_layers[1, 1:], alone_exits[0, 1:])


@pytest.mark.parametrize("exits", [False, True])
def test_static_cache_generation_equals_the_dynamic_cache(exits):
    """``generate(cache_implementation="static")``: the cache hands back its whole fixed-size buffer, whose empty
    slots the mask covers (it once failed with a size mismatch); same scores and exits as the growing cache, with
    left padding and per-row exits."""
    model = build()
    ids = prompt(2, 6)
    if exits:
        model.config.exit_threshold = threshold_with_mixed_exits(model, prompt())
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    runs = []
    for cache in ("dynamic", "static"):
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=5,
                output_exit_layers=True,
                cache_implementation=cache,
                **GREEDY,
            )
        runs.append((out, out.exit_layers))
    (dynamic, dynamic_exits), (static, static_exits) = runs
    assert torch.equal(static.sequences, dynamic.sequences) and torch.equal(static_exits, dynamic_exits)
    for a, b in zip(static.scores, dynamic.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_eager_and_sdpa_give_the_same_tokens():
    model = build(dtype=torch.float32)
    ids = prompt()
    model.config.exit_threshold = threshold_with_mixed_exits(model, ids)
    results = []
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        results.append(generate(model, ids))
    assert torch.equal(results[0][0].sequences, results[1][0].sequences)
    assert torch.equal(results[0][1], results[1][1])


def test_threshold_zero_exits_at_the_first_exit_and_min_exit_holds():
    model = build(min_exit=2, exit_threshold=0.0)
    _, exits = generate(model, prompt())
    assert bool((exits[:, 1:] == 2).all())  # min_exit: no token leaves before 2 layers
    model.config.min_exit = 1
    _, exits = generate(model, prompt())
    assert bool((exits[:, 1:] == 1).all())


def test_assistant_early_exit_drafting_gives_the_greedy_tokens():
    """transformers' self-speculative drafting lowers config.num_hidden_layers; the verified tokens are greedy's."""
    model = build(dtype=torch.float32)
    ids = prompt(1, 5)
    with torch.no_grad():
        greedy = model.generate(ids, max_new_tokens=8, do_sample=False)
        drafted = model.generate(ids, max_new_tokens=8, do_sample=False, assistant_early_exit=2)
    assert torch.equal(greedy, drafted)
    assert model.config.num_hidden_layers == 4


def test_sampling_with_exits_runs_and_reports_exits():
    model = build()
    ids = prompt()
    model.config.exit_threshold = 0.2
    with torch.no_grad():
        out = model.generate(
            ids, max_new_tokens=4, do_sample=True, top_k=0, output_exit_layers=True, return_dict_in_generate=True
        )
    assert out.sequences.shape == (3, 9) and out.exit_layers.shape == (3, 4)
    assert int(out.exit_layers.min()) >= 1 and int(out.exit_layers.max()) <= model.config.num_hidden_layers


def test_output_exit_layers_is_refused_where_it_cannot_be_reported_and_leaves_no_hook():
    model = build()
    ids = prompt()
    with pytest.raises(ValueError, match="return_dict_in_generate=True"):
        model.generate(ids, max_new_tokens=2, output_exit_layers=True)
    with pytest.raises(ValueError, match="num_beams=2"):
        model.generate(ids, max_new_tokens=2, num_beams=2, output_exit_layers=True, return_dict_in_generate=True)
    with pytest.raises(ValueError):  # a failing generate call removes its hook too
        model.generate(ids, max_new_tokens=2, output_exit_layers=True, return_dict_in_generate=True, exit_layer=99)
    assert not model._forward_hooks
    plain = model.generate(ids, max_new_tokens=2, do_sample=False)
    assert isinstance(plain, torch.Tensor) and not model._forward_hooks


def test_recipe_loss_split_equals_the_anytime_loss():
    """``exit_targets`` (aligned targets) + the last layer's CE == ``labels`` (shifted inside)."""
    model = build(dtype=torch.float32, aggregation="geometric")
    ids = prompt(2, 8)
    with_labels = model(ids, labels=ids)
    aligned = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=-100)
    split = model(ids, exit_targets=aligned)
    torch.testing.assert_close(split.lm_loss + split.aux_loss, with_labels.loss)
    # by hand: geometric weights 1, 2, 4, 8 over the 4 exits
    logits = [
        model.lm_head(model.model.norm(h)) for h in model.model(ids, output_hidden_states=True).hidden_states[1:]
    ]
    losses = [torch.nn.functional.cross_entropy(x[:, :-1].reshape(-1, 128), ids[:, 1:].reshape(-1)) for x in logits]
    anytime = sum(w * loss for w, loss in zip([1, 2, 4, 8], losses, strict=True)) / 15
    torch.testing.assert_close(with_labels.loss - with_labels.meta_loss, anytime, rtol=1e-5, atol=1e-6)


def test_distillation_term_by_hand():
    """``distillation_weight`` adds its weight times the intermediate exits' mean KL(p_final || p_exit), a token
    mean over the counted positions; 0 (the default) leaves the anytime loss as it was."""
    model = build(dtype=torch.float64)
    ids = prompt(2, 8)
    labels = ids.clone()
    labels[0, 5:] = -100  # positions 4..6 of row 0 predict ignored tokens: not counted
    plain = model(ids, labels=labels).loss
    model.config.distillation_weight = 0.5
    distilled = model(ids, labels=labels).loss
    logits = [
        model.lm_head(model.model.norm(h)) for h in model.model(ids, output_hidden_states=True).hidden_states[1:]
    ]
    p_final = torch.softmax(logits[-1], dim=-1)
    counted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100) != -100  # (B, T)
    kls = []
    for exit_logits in logits[:-1]:  # tiny: exits after 1, 2, 3 and 4 layers
        kl = (p_final * (p_final.log() - torch.log_softmax(exit_logits, dim=-1))).sum(-1)  # (B, T)
        kls.append(kl[counted].mean())
    torch.testing.assert_close(distilled - plain, 0.5 * torch.stack(kls).mean())
    with pytest.raises(ValueError, match="distillation_weight"):
        SPEC.tiny_config(distillation_weight=-1.0)


def test_llama_checkpoint_loads_with_identical_outputs(tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, rope_parameters={"rope_theta": 500.0, "rope_type": "default"},
    )  # fmt: skip
    llama = LlamaForCausalLM(config).eval()
    llama.save_pretrained(tmp_path)
    calm = TffCalmForCausalLM.from_pretrained(tmp_path, first_exit=1, exit_interval=1).eval()
    assert isinstance(calm.config, TffCalmConfig) and calm.config.rope_base == 500.0
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    with torch.no_grad():
        torch.testing.assert_close(calm(ids, attention_mask=mask).logits[0], llama(ids, attention_mask=mask).logits[0])
        torch.testing.assert_close(calm(ids).logits, llama(ids).logits, rtol=1e-5, atol=1e-5)
        expected = llama.generate(ids[:1], max_new_tokens=6, do_sample=False)
        assert torch.equal(calm.generate(ids[:1], max_new_tokens=6, do_sample=False), expected)
    assert torch.equal(calm.meta_classifier.weight, torch.zeros(2, 32))


def test_gpt2_checkpoint_loads_with_identical_outputs(tmp_path):
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=96, n_embd=32, n_layer=3, n_head=4, n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0
    )
    gpt2 = GPT2LMHeadModel(config).eval()
    gpt2.save_pretrained(tmp_path)
    calm = TffCalmForCausalLM.from_pretrained(tmp_path).eval()
    assert calm.config.decoder_style == "gpt2" and calm.lm_head.weight is calm.model.embed_tokens.weight
    ids = torch.randint(0, 96, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(calm(ids).logits, gpt2(ids).logits, rtol=1e-5, atol=1e-5)
        expected = gpt2.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
        assert torch.equal(
            calm.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False), expected
        )


def test_gpt2_style_per_row_exits_equal_row_by_row():
    model = build(decoder_style="gpt2", attention_bias=True, mlp_bias=True, hidden_act="gelu_new")
    ids = prompt()
    model.config.exit_threshold = threshold_with_mixed_exits(model, ids)
    batched, batched_exits = generate(model, ids)
    for row in range(ids.shape[0]):
        alone, alone_exits = generate(model, ids[row : row + 1])
        assert torch.equal(alone.sequences[0], batched.sequences[row])
        assert torch.equal(alone_exits[0], batched_exits[row])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"first_exit": 0}, "first_exit"),
        ({"exit_threshold": -1.0}, "exit_threshold"),
        ({"confidence_measure": "restricted_softmax"}, "restricted_vocab"),
        ({"restricted_vocab": [1, 1]}, "restricted_vocab"),
        ({"aggregation": "cubic"}, "aggregation"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ],
)
def test_config_errors_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        SPEC.tiny_config(**overrides)


def test_forward_errors():
    model = build()
    with pytest.raises(ValueError, match="exit_layer"):
        model(prompt(), exit_layer=9)
    model.config.num_hidden_layers = 7
    with pytest.raises(ValueError, match="num_hidden_layers"):
        model(prompt())


def test_prompt_step_runs_at_full_depth_and_decoding_steps_exit():
    """The prompt (several new tokens per row) is not exited: its every position fills every layer's cache from its
    real states, exactly as the full model does, even at a threshold that makes every generated token leave at the
    first exit; the next one-token step then does exit."""
    model = build(exit_threshold=0.0)
    depth = model.config.num_hidden_layers
    ids = prompt()
    with torch.no_grad():
        early = model(ids, use_cache=True)
        model.config.exit_threshold = None
        full = model(ids, use_cache=True)
        model.config.exit_threshold = 0.0
        torch.testing.assert_close(early.logits, full.logits, rtol=0, atol=0)
        for index in range(depth):
            torch.testing.assert_close(early.cache.layers[index].keys, full.cache.layers[index].keys, rtol=0, atol=0)
        assert bool((early.exit_layers == depth).all())
        step = model(early.logits[:, -1:].argmax(-1), cache=early.cache, use_cache=True)
    assert bool((step.exit_layers == 1).all())


def test_both_batched_modes_run_and_equal_row_by_row():
    """Once at most half the rows run, attention and MLP run on those rows only (``rows``); a batch of 6 whose
    steps go through that mode gives each row the tokens, exits and scores of its run alone. (Steps with a few rows
    left, the whole-batch mode with torch.where, are `test_batched_per_row_exits_equal_row_by_row`'s.)"""
    model = build()
    ids = prompt(6)
    subsets = []
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda module, args: subsets.append(len(args) > 5 and args[5] is not None))
    for threshold in (0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005):
        model.config.exit_threshold = threshold
        subsets.clear()
        batched, batched_exits = generate(model, ids)
        if any(subsets) and not all(subsets):
            break
    else:
        raise AssertionError("no threshold ran both modes")
    for row in range(ids.shape[0]):
        alone, alone_exits = generate(model, ids[row : row + 1])
        assert torch.equal(alone.sequences[0], batched.sequences[row])
        assert torch.equal(alone_exits[0], batched_exits[row])
        for a, b in zip(alone.scores, batched.scores, strict=True):
            torch.testing.assert_close(a[0], b[row], rtol=1e-9, atol=1e-9)
