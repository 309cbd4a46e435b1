"""The common tester: checks every architecture of the registry must pass (DESIGN §6).

Each ``check_*`` function takes an `ArchSpec` and raises `AssertionError` (via ``assert``/``torch.testing``) when
the architecture breaks the contract. `tests/common/test_common.py` runs every check over every registry entry;
`tests/common/test_tester_catches_faults.py` shows the checks flag deliberately broken models.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import os
import tempfile

import pytest
import torch
from transformers import AutoConfig

from tf_family.auto import AUTO_CLASS_BY_TASK
from tf_family.registry import ArchSpec

BATCH, LENGTH = 2, 12
NUM_CHOICES = 2


# ----------------------------------------------------------------------------------------------------------- helpers
def build(spec: ArchSpec, task: str, seed: int = 0, **overrides):
    """A tiny model whose weights are pushed away from the small init, so that every input matters visibly."""
    torch.manual_seed(seed)
    model = spec.model_classes[task](spec.tiny_config(task=task, **overrides)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1 * torch.randn_like(parameter))
    attach = ATTACHED_STATE.get(spec.name)
    if attach is not None:
        attach(model)
    return model


def _attach_spalm_datastore(model) -> None:
    """SPALM's causal LM reads a kNN datastore beside its weights (without one it is a Transformer-XL and its gate
    is unused): one built by its own (perturbed) Transformer-XL stack over 64 random tokens."""
    if not hasattr(model, "build_datastore"):
        return
    ids = torch.randint(0, model.config.vocab_size, (4, 16), generator=torch.Generator().manual_seed(1234))
    labels = torch.cat([ids[:, 1:], torch.full((4, 1), -100)], dim=1)
    model.build_datastore([{"input_ids": ids, "labels": labels}], show_progress=False)


# state a model reads beside its weights, attached by `build` to every model of the architecture that takes it
ATTACHED_STATE = {"spalm": _attach_spalm_datastore}


def make_inputs(spec: ArchSpec, config, task: str, batch: int = BATCH, length: int = LENGTH, seed: int = 0) -> dict:
    """Deterministic inputs (and labels) for ``task``; token ids cover the whole vocabulary range. Models whose
    forward takes a ``global_attention_mask`` get their first token global (so global projections are exercised)."""
    generator = torch.Generator().manual_seed(seed)
    if task == "action":
        return make_trajectory_inputs(config, batch, length, generator)
    shape = (batch, NUM_CHOICES, length) if task == "multiple_choice" else (batch, length)
    input_ids = torch.randint(0, config.vocab_size, shape, generator=generator)
    inputs = {"input_ids": input_ids}
    if "global_attention_mask" in inspect.signature(spec.model_classes[task].forward).parameters:
        global_mask = torch.zeros_like(input_ids)
        global_mask[..., 0] = 1
        inputs["global_attention_mask"] = global_mask
    if task in ("causal_lm", "masked_lm"):
        inputs["labels"] = input_ids.clone()
    elif task == "sequence_classification":
        inputs["labels"] = torch.randint(0, config.num_labels, (batch,), generator=generator)
    elif task == "token_classification":
        inputs["labels"] = torch.randint(0, config.num_labels, (batch, length), generator=generator)
    elif task == "question_answering":
        inputs["start_positions"] = torch.randint(0, length, (batch,), generator=generator)
        inputs["end_positions"] = torch.randint(0, length, (batch,), generator=generator)
    elif task == "multiple_choice":
        inputs["labels"] = torch.randint(0, NUM_CHOICES, (batch,), generator=generator)
    return inputs


def make_trajectory_inputs(config, batch: int, length: int, generator: torch.Generator) -> dict:
    """Task "action" (Decision Transformer): random (R, s, a, t) trajectories; the labels are the actions.

    Raw states are drawn around ``config.state_mean`` with spread ``config.state_std``; timesteps start at a random
    offset (trajectory windows cut from inside episodes) and stay below ``max_ep_len``.
    """
    mean, std = torch.tensor(config.state_mean), torch.tensor(config.state_std)
    states = mean + std * torch.randn(batch, length, config.state_dim, generator=generator)
    if config.discrete:
        actions = torch.randint(0, config.act_dim, (batch, length), generator=generator)
    else:
        actions = torch.rand(batch, length, config.act_dim, generator=generator) * 1.8 - 0.9
    returns_to_go = config.return_scale * torch.randn(batch, length, 1, generator=generator)
    start = torch.randint(0, config.max_ep_len - length + 1, (batch, 1), generator=generator)
    timesteps = start + torch.arange(length)
    return {
        "states": states,
        "actions": actions,
        "returns_to_go": returns_to_go,
        "timesteps": timesteps,
        "labels": actions.clone(),
    }


def main_output(task: str, outputs) -> torch.Tensor:
    if task == "action":
        return outputs.action_preds
    if task == "base":
        return outputs.last_hidden_state
    if task == "question_answering":
        return torch.stack([outputs.start_logits, outputs.end_logits], dim=-1)  # (B, T, 2)
    return outputs.logits


def scalar_loss(task: str, outputs) -> torch.Tensor:
    if getattr(outputs, "loss", None) is not None:
        return outputs.loss
    loss = main_output(task, outputs).float().pow(2).mean()
    if getattr(outputs, "pooler_output", None) is not None:  # a base model's pooler must get gradients too
        loss = loss + outputs.pooler_output.float().pow(2).mean()
    # a base model's auxiliary loss (e.g. memory compression) trains weights the main output does not reach
    aux_loss = getattr(outputs, "aux_loss", None)
    return loss if aux_loss is None else loss + aux_loss


def without_labels(inputs: dict) -> dict:
    return {k: v for k, v in inputs.items() if k not in ("labels", "start_positions", "end_positions")}


# ------------------------------------------------------------------------------------------------------------ checks
def check_config_round_trip(spec: ArchSpec) -> None:
    config = spec.tiny_config()
    rebuilt = spec.config_class.from_dict(config.to_dict())
    assert rebuilt.to_dict() == config.to_dict(), "config.to_dict() -> from_dict() changed the config"
    with tempfile.TemporaryDirectory() as folder:
        config.save_pretrained(folder)
        loaded = AutoConfig.from_pretrained(folder)
    assert type(loaded) is spec.config_class, f"AutoConfig gave {type(loaded).__name__}"
    loaded_dict, config_dict = loaded.to_dict(), config.to_dict()
    loaded_dict.pop("_name_or_path"), config_dict.pop("_name_or_path")
    assert loaded_dict == config_dict, "save_pretrained -> AutoConfig.from_pretrained changed the config"
    with pytest.raises(ValueError, match="not_a_field"):
        spec.tiny_config(not_a_field=1)


def check_forward_shapes(spec: ArchSpec) -> None:
    for task in spec.model_classes:
        model = build(spec, task)
        inputs = make_inputs(spec, model.config, task)
        with torch.no_grad():
            outputs = model(**inputs)
        out = main_output(task, outputs)
        if task == "base":  # a model whose output is wider than its residual stream says so (Reformer: 2 streams)
            expected = (BATCH, LENGTH, getattr(model, "last_hidden_size", model.config.hidden_size))
        elif task == "causal_lm":
            expected = (BATCH, LENGTH, model.config.vocab_size)
            if out is None:  # heads that skip full logits when labels are given
                out = main_output(task, model(**without_labels(inputs)))
            assert outputs.loss is not None and torch.isfinite(outputs.loss), f"{task}: no finite loss"
        elif task == "sequence_classification":
            expected = (BATCH, model.config.num_labels)
            assert outputs.loss is not None and torch.isfinite(outputs.loss), f"{task}: no finite loss"
        elif task == "action":
            expected = (BATCH, LENGTH, model.config.act_dim)
            assert outputs.loss is not None and torch.isfinite(outputs.loss), f"{task}: no finite loss"
            hidden = (BATCH, 3 * LENGTH, model.config.hidden_size)  # one token per R, s and a of every step
            assert tuple(outputs.last_hidden_state.shape) == hidden, f"{task}: hidden shape, expected {hidden}"
        elif task in ("masked_lm", "token_classification", "question_answering", "multiple_choice"):
            expected = {
                "masked_lm": (BATCH, LENGTH, model.config.vocab_size),
                "token_classification": (BATCH, LENGTH, model.config.num_labels),
                "question_answering": (BATCH, LENGTH, 2),
                "multiple_choice": (BATCH, NUM_CHOICES),
            }[task]
            assert outputs.loss is not None and torch.isfinite(outputs.loss), f"{task}: no finite loss"
        else:
            raise NotImplementedError(f"the common tester does not know task {task!r} yet")
        assert tuple(out.shape) == expected, f"{task}: output shape {tuple(out.shape)}, expected {expected}"
        assert torch.isfinite(out).all(), f"{task}: non-finite outputs"


def check_save_load(spec: ArchSpec) -> None:
    for task, model_class in spec.model_classes.items():
        model = build(spec, task)
        inputs = without_labels(make_inputs(spec, model.config, task))
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder)
            files = set(os.listdir(folder))
            assert "model.safetensors" in files and not any(f.endswith(".bin") for f in files), files
            loaded = model_class.from_pretrained(folder).eval()
            auto_loaded = (
                AUTO_CLASS_BY_TASK[task].from_pretrained(folder).eval() if task in AUTO_CLASS_BY_TASK else None
            )
        with torch.no_grad():
            expected = main_output(task, model(**inputs))
            torch.testing.assert_close(main_output(task, loaded(**inputs)), expected, rtol=0, atol=0)
            if auto_loaded is not None:
                assert type(auto_loaded) is model_class, f"Auto gave {type(auto_loaded).__name__} for {task}"
                torch.testing.assert_close(main_output(task, auto_loaded(**inputs)), expected, rtol=0, atol=0)


def check_auto_from_config(spec: ArchSpec) -> None:
    for task, model_class in spec.model_classes.items():
        if task in AUTO_CLASS_BY_TASK:
            model = AUTO_CLASS_BY_TASK[task].from_config(spec.tiny_config(task=task))
            assert type(model) is model_class, f"{task}: from_config gave {type(model).__name__}"


def check_determinism_and_rng(spec: ArchSpec) -> None:
    for task in spec.model_classes:
        model = build(spec, task)
        inputs = without_labels(make_inputs(spec, model.config, task))
        state = torch.random.get_rng_state()
        with torch.no_grad():
            first = main_output(task, model(**inputs))
            second = main_output(task, model(**inputs))
        assert torch.equal(torch.random.get_rng_state(), state), f"{task}: forward changed the global RNG state"
        assert torch.equal(first, second), f"{task}: two eval forwards differ"


def check_gradients(spec: ArchSpec) -> None:
    for task in spec.model_classes:
        model = build(spec, task).train()
        inputs = make_inputs(spec, model.config, task, length=24)
        scalar_loss(task, model(**inputs)).backward()
        missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        assert not missing, f"{task}: parameters without gradient: {missing}"
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
        assert not bad, f"{task}: non-finite gradients: {bad}"


def check_overfit(spec: ArchSpec, steps: int = 60) -> None:
    for task in spec.model_classes:
        if task == "base":
            continue
        model = build(spec, task).train()
        inputs = make_inputs(spec, model.config, task, length=10)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        first = None
        for _ in range(steps):
            loss = model(**inputs).loss
            first = loss.item() if first is None else first
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        assert loss.item() < 0.25 * first, f"{task}: loss {first:.3f} -> {loss.item():.3f} after {steps} steps"


def _check_trajectory_padding_equivalence(model) -> None:
    """Task "action": padding is per step (all of R, s, a, t of a step); the padded values are garbage on purpose,
    so a model that reads padded steps fails."""
    full = without_labels(make_inputs(None, model.config, "action", batch=2, length=LENGTH))
    short = 7
    with torch.no_grad():
        alone = model(**{k: v[1:, :short] for k, v in full.items()}).action_preds
        for side in ("right", "left"):
            padded, mask = {}, torch.ones(2, LENGTH, dtype=torch.long)
            real = slice(0, short) if side == "right" else slice(LENGTH - short, LENGTH)
            for key, value in full.items():
                value = value.clone()
                garbage = value[0, : LENGTH - short].flip(0)  # another row's values in the padded steps
                if side == "right":
                    value[1, short:] = garbage
                else:
                    value[1] = torch.cat([garbage, full[key][1, :short]])
                padded[key] = value
            if side == "right":
                mask[1, short:] = 0
            else:
                mask[1, : LENGTH - short] = 0
            batched = model(**padded, attention_mask=mask).action_preds
            torch.testing.assert_close(batched[1, real], alone[0], rtol=1e-4, atol=1e-5, msg=f"action, {side} padding")


def check_padding_equivalence(spec: ArchSpec) -> None:
    """A row alone equals the same row padded (left and right) inside a batch, on its real positions."""
    for task in spec.model_classes:
        if task == "multiple_choice":
            continue  # choices are flattened into rows of the base model, which this check covers
        model = build(spec, task)
        if task == "action":
            _check_trajectory_padding_equivalence(model)
            continue
        full = make_inputs(spec, model.config, task, batch=2, length=LENGTH)["input_ids"]
        short = 7
        with torch.no_grad():
            alone = main_output(task, model(input_ids=full[1:, :short]))
            for side in ("right", "left"):
                ids = full.clone()
                mask = torch.ones_like(ids)
                if side == "right":
                    ids[1, short:] = 0
                    mask[1, short:] = 0
                    real = slice(0, short)
                else:
                    ids[1] = torch.cat([torch.zeros(LENGTH - short, dtype=ids.dtype), full[1, :short]])
                    mask[1, : LENGTH - short] = 0
                    real = slice(LENGTH - short, LENGTH)
                batched = main_output(task, model(input_ids=ids, attention_mask=mask))
                got = batched[1] if task == "sequence_classification" else batched[1, real]
                torch.testing.assert_close(got, alone[0], rtol=1e-4, atol=1e-5, msg=f"{task}, {side} padding")


def _check_action_causality(spec: ArchSpec) -> None:
    """Task "action": the action predicted at step t depends on R, s up to t and a up to t - 1 only; in
    particular not on a_t itself (the label), and not on anything later."""
    model = build(spec, "action")
    inputs = without_labels(make_inputs(spec, model.config, "action"))
    cut = 5
    changed = {key: value.clone() for key, value in inputs.items()}
    if model.config.discrete:
        changed["actions"][:, cut:] = (inputs["actions"][:, cut:] + 1) % model.config.act_dim
    else:
        changed["actions"][:, cut:] = -inputs["actions"][:, cut:]
    changed["states"][:, cut + 1 :] += 1.0
    changed["returns_to_go"][:, cut + 1 :] += model.config.return_scale
    with torch.no_grad():
        a = model(**inputs).action_preds[:, : cut + 1]
        b = model(**changed).action_preds[:, : cut + 1]
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg="action at t depends on a_t or on steps after t")


def check_causality(spec: ArchSpec) -> None:
    if "action" in spec.model_classes:
        _check_action_causality(spec)
    if "causal_lm" not in spec.model_classes:
        if "action" not in spec.model_classes:
            pytest.skip(f"{spec.name} has no causal head")
        return
    model = build(spec, "causal_lm")
    ids = make_inputs(spec, model.config, "causal_lm")["input_ids"]
    cut = 5
    changed = ids.clone()
    changed[:, cut:] = (changed[:, cut:] + 1) % model.config.vocab_size
    with torch.no_grad():
        a = model(input_ids=ids).logits[:, :cut]
        b = model(input_ids=changed).logits[:, :cut]
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg="outputs before t depend on tokens after t")


def check_memory_equivalence(spec: ArchSpec) -> None:
    """Memory models: two segments with carried memory equal one forward over both (memory covers segment 1)."""
    if not spec.memory_model:
        pytest.skip(f"{spec.name} carries no memory")
    model = build(spec, "causal_lm")
    ids = make_inputs(spec, model.config, "causal_lm", length=2 * 6)["input_ids"]
    if model.config.mem_len < 6:
        raise AssertionError("tiny config of a memory model needs mem_len >= 6 for this check")
    with torch.no_grad():
        whole = model(input_ids=ids).logits
        first = model(input_ids=ids[:, :6])
        second = model(input_ids=ids[:, 6:], mems=first.mems)
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), whole, rtol=1e-4, atol=1e-5)


def _check_acting_context(spec: ArchSpec) -> None:
    """Task "action": acting step by step through the rolling context (`TrajectoryContext`, `get_action`: crop to
    K, left padding, mask) equals the full forward over the trajectory, for steps both before and after the
    context fills up."""
    from tf_family import TrajectoryContext

    model = build(spec, "action")
    config = model.config
    steps = config.context_length + 3
    trajectory = make_inputs(spec, config, "action", batch=2, length=steps)
    trajectory["timesteps"] = torch.arange(steps).repeat(2, 1)  # an episode from its start, as the context counts
    rewards = trajectory["returns_to_go"][:, :-1, 0] - trajectory["returns_to_go"][:, 1:, 0]
    context = TrajectoryContext.start(config, trajectory["states"][:, 0], trajectory["returns_to_go"][:, 0, 0])
    with torch.no_grad():
        for t in range(steps):
            acted = model.get_action(**context.model_inputs())
            start = max(0, t + 1 - config.context_length)
            window = {k: v[:, start : t + 1] for k, v in without_labels(trajectory).items()}
            expected = model(**window).action_preds[:, -1]
            if config.discrete:
                expected = expected.argmax(-1)
                assert torch.equal(acted, expected), f"step {t}: acted {acted}, full forward {expected}"
            else:
                torch.testing.assert_close(acted, expected, rtol=1e-4, atol=1e-5, msg=f"step {t}")
            if t + 1 < steps:  # record the data's action (teacher forcing), not the acted one
                context = context.advance(trajectory["actions"][:, t], rewards[:, t], trajectory["states"][:, t + 1])
                assert torch.equal(context.timesteps[:, -1], torch.full((2,), t + 1)), "timesteps count from the start"


def check_generation_cache(spec: ArchSpec) -> None:
    """Incremental decoding (state carried, one new token read per step) equals recomputing the full prefix at every
    step."""
    if "action" in spec.model_classes:
        _check_acting_context(spec)
    if "causal_lm" not in spec.model_classes:
        if "action" not in spec.model_classes:
            pytest.skip(f"{spec.name} has no causal head")
        return
    model = build(spec, "causal_lm")
    # prompt + new tokens stay within the tiny configs' memory / context (8 positions)
    prompt = make_inputs(spec, model.config, "causal_lm", batch=2, length=4)["input_ids"]
    kwargs = {"max_new_tokens": 4, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    fed = []  # the number of positions each forward call of the cached generation reads

    def record(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        fed.append(ids.shape[1] if ids is not None else kwargs["inputs_embeds"].shape[1])

    with torch.no_grad():
        hook = model.register_forward_pre_hook(record, with_kwargs=True)
        try:
            cached = model.generate(prompt, attention_mask=torch.ones_like(prompt), use_cache=True, **kwargs)
        finally:
            hook.remove()
        full = model.generate(prompt, attention_mask=torch.ones_like(prompt), use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, full.sequences), "cached and uncached greedy generation differ"
    # the carried state is used: after the prompt every step reads the new token only
    expected = [prompt.shape[1]] + [1] * (kwargs["max_new_tokens"] - 1)
    assert fed == expected, f"generation does not carry its cache: the forward calls read {fed} positions"
    for a, b in zip(cached.scores, full.scores, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def check_generation_from_inputs_embeds(spec: ArchSpec) -> None:
    """``generate(inputs_embeds=...)`` gives the tokens ``generate(input_ids)`` gives for the same prompt (greedy),
    with and without a cache."""
    if "causal_lm" not in spec.model_classes:
        pytest.skip(f"{spec.name} does not generate")
    model = build(spec, "causal_lm")
    prompt = make_inputs(spec, model.config, "causal_lm", batch=2, length=4)["input_ids"]
    kwargs = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "attention_mask": torch.ones_like(prompt)}
    with torch.no_grad():
        embeds = model.get_input_embeddings()(prompt)
        for use_cache in (True, False):
            expected = model.generate(prompt, use_cache=use_cache, **kwargs)[:, prompt.shape[1] :]
            got = model.generate(inputs_embeds=embeds, use_cache=use_cache, **kwargs)
            assert torch.equal(got, expected), f"use_cache={use_cache}: {got.tolist()} != {expected.tolist()}"


def check_gradient_checkpointing(spec: ArchSpec) -> None:
    task = next(t for t in ("causal_lm", "base", *spec.model_classes) if t in spec.model_classes)
    if not spec.model_classes[task].supports_gradient_checkpointing:
        pytest.skip(f"{spec.name} does not support gradient checkpointing")
    grads = []
    for checkpointing in (False, True):
        model = build(spec, task).train()
        if checkpointing:
            (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
        inputs = make_inputs(spec, model.config, task)
        scalar_loss(task, model(**inputs)).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6, msg=name)


def check_bf16_autocast(spec: ArchSpec) -> None:
    for task in spec.model_classes:
        model = build(spec, task).train()
        inputs = make_inputs(spec, model.config, task)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = scalar_loss(task, model(**inputs))
        loss.backward()
        assert torch.isfinite(loss), f"{task}: non-finite loss under bf16 autocast"


# The bf16 check: model seeds (and input seeds) it runs; further configs per architecture, as overrides of its tiny
# config.
BF16_SEEDS = (0, 1, 2)
BF16_CONFIGS = {
    # the causal LSH + local shape of tests/models/reformer/test_parity_reformer.py: LSH and local chunks of 4, so 24
    # tokens make many chunks, two LSH layers (the tiny variant's one LSH layer has 16-token chunks)
    "reformer": {
        "LSH + local": {
            "vocab_size": 61,
            "hidden_size": 32,
            "num_attention_heads": 2,
            "attention_head_size": 8,
            "feed_forward_size": 40,
            "attn_layers": ["local", "lsh", "lsh", "local"],
            "local_attn_chunk_length": 4,
            "lsh_attn_chunk_length": 4,
            "axial_pos_shape": [4, 8],
            "axial_pos_embds_dim": [12, 20],
            "axial_norm_std": 0.1,
        }
    },
}
# tasks held to one seed: as initialised, a sequence-level head's few logits are a cancelling sum (about 1e-2 against
# unit hidden states), so a relative error on them is ill-conditioned (Longformer's multiple choice, seed 2: 2.85 %
# from differences of 2e-4)
BF16_ONE_SEED_TASKS = ("sequence_classification", "multiple_choice")
# Methods that take discrete decisions (LSH bucket ids), which bf16 rounding flips near a boundary: a flipped bucket
# changes whom a token attends to, so the output jumps (a Reformer causal LM by 2-10 % on about a third of seeds;
# float32 arithmetic on the bf16-rounded weights flips them too: bench/results/reformer_bf16_error.md). The bf16 check
# replays the float32 forward's decisions in the bf16 forward, so that it measures the arithmetic;
# tests/models/reformer/test_modeling_reformer.py bounds how many decisions flip.
REPLAYED_DECISIONS = {
    "reformer": ("tf_family.models.reformer.modeling_reformer", "TffReformerAttention", "hash"),
    # k-means cluster ids: a flipped nearest centroid moves a token to another cluster
    "routing_transformer": (
        "tf_family.models.routing_transformer.modeling_routing_transformer",
        "TffRoutingTransformerAttention",
        "route",
    ),
}


class _Decisions:
    """`replayed_decisions`' record: each module's results in call order, recorded until `replay` is called; then
    how many of the decisions taken again differed from the recorded ones (``flipped`` of ``taken``)."""

    def __init__(self):
        self.recorded: dict = {}
        self.replayed: dict | None = None
        self.flipped = self.taken = 0

    def replay(self) -> None:
        self.replayed = {}


@contextlib.contextmanager
def replayed_decisions(spec: ArchSpec):
    """Within ``with``, the architecture's `REPLAYED_DECISIONS` method records its results per module until the
    yielded `_Decisions`' ``replay()``, then returns the recorded ones in the same order (nothing for the others)."""
    decisions = _Decisions()
    target = REPLAYED_DECISIONS.get(spec.name)
    if target is None:
        yield decisions
        return
    module_name, owner_name, method_name = target
    owner = getattr(importlib.import_module(module_name), owner_name)
    original = getattr(owner, method_name)

    def decide(module, *args, **kwargs):
        result = original(module, *args, **kwargs)
        if decisions.replayed is None:
            decisions.recorded.setdefault(module, []).append(result)
            return result
        index = decisions.replayed[module] = decisions.replayed.get(module, -1) + 1
        recorded = decisions.recorded[module][index]
        decisions.flipped += int((result != recorded).sum())
        decisions.taken += recorded.numel()
        return recorded

    setattr(owner, method_name, decide)
    try:
        yield decisions
    finally:
        setattr(owner, method_name, original)


def check_bf16_weights_match_float32(spec: ArchSpec) -> None:
    """Every task's output with its weights in bfloat16 (``model.to(torch.bfloat16)``) stays within 2 % of float32
    (largest difference against the largest output value; sequence-level heads: relative norm), on the model as
    initialised (no weight perturbation: a bad init is what loses the tokens to bfloat16 rounding, as Reformer's
    unitialised axial positions did at 11-21 %), for model and input seeds `BF16_SEEDS` (one seed:
    `BF16_ONE_SEED_TASKS`) and the tiny config plus the architecture's `BF16_CONFIGS`; discrete decisions
    (`REPLAYED_DECISIONS`) are the float32 forward's. 24 tokens: past Reformer's 16-token LSH chunk. Language-model
    logits are centred per position (log-probabilities differ from logits by a constant)."""
    configs = {"tiny": {}, **BF16_CONFIGS.get(spec.name, {})}
    for task in spec.model_classes:
        one_seed = task in BF16_ONE_SEED_TASKS
        for name, overrides in configs.items():
            for seed in BF16_SEEDS[:1] if one_seed else BF16_SEEDS:
                torch.manual_seed(seed)
                model = spec.model_classes[task](spec.tiny_config(task=task, **overrides)).eval()
                inputs = without_labels(make_inputs(spec, model.config, task, length=24, seed=seed))
                half = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}
                with torch.no_grad(), replayed_decisions(spec) as decisions:
                    expected = main_output(task, model(**inputs)).double()
                    decisions.replay()
                    got = main_output(task, model.to(torch.bfloat16)(**half)).double()
                if task in ("causal_lm", "masked_lm"):
                    expected, got = expected - expected.mean(-1, keepdim=True), got - got.mean(-1, keepdim=True)
                if task in BF16_ONE_SEED_TASKS:  # a few ill-conditioned logits: the norm of the difference
                    error = float((got - expected).norm() / expected.norm())
                else:  # per position: one position far off is caught
                    error = float((got - expected).abs().max() / expected.abs().max())
                assert error < 0.02, (
                    f"{task}, {name} config, seed {seed}: bfloat16 output {error:.2%} away from float32"
                )


ALL_CHECKS = [
    check_config_round_trip,
    check_forward_shapes,
    check_save_load,
    check_auto_from_config,
    check_determinism_and_rng,
    check_gradients,
    check_overfit,
    check_padding_equivalence,
    check_causality,
    check_memory_equivalence,
    check_generation_cache,
    check_generation_from_inputs_embeds,
    check_gradient_checkpointing,
    check_bf16_autocast,
    check_bf16_weights_match_float32,
]


def with_model_class(spec: ArchSpec, task: str, model_class: type) -> ArchSpec:
    """A copy of ``spec`` whose ``task`` model is replaced (used to feed the tester broken models)."""
    broken = copy.copy(spec)
    object.__setattr__(broken, "model_classes", {task: model_class})
    return broken
