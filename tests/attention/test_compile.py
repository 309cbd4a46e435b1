"""``torch.compile`` of the sparse models (Longformer, BigBird, Reformer) under ``"sdpa"`` and ``"flex_attention"``:
their forward traces as one graph (``torch._dynamo.explain`` finds no graph break), a training step traces too, and
inputs of five lengths compile at most twice (the second length makes the graph dynamic). Dynamo's tracing is what
these tests check, with the ``eager`` / ``aot_eager`` backends (no code generation, seconds on a CPU). The Inductor
compile of a whole model's training step takes minutes per case on 2 cores: `bench/inductor_cpu_check.py` (CPU,
against eager) and the GPU benchmark (`bench/gpu_bench.py`) run it."""

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter

from tests.common.tester import build, make_inputs, without_labels
from tf_family.registry import ARCHITECTURES

_LENGTHS = {"longformer": 40, "big_bird": 40, "reformer": 48}  # the tiny models' sparse paths
_NO_DROPOUT = {"lsh_attention_probs_dropout_prob": 0.0, "local_attention_probs_dropout_prob": 0.0}


def _model(name: str, implementation: str):
    spec = ARCHITECTURES[name]
    task = "causal_lm" if "causal_lm" in spec.model_classes else "base"
    model = build(spec, task, **(_NO_DROPOUT if name == "reformer" else {}))
    model.set_attn_implementation(implementation)
    return spec, task, model


def _inputs(spec, model, task, length: int, padded: bool = True) -> dict:
    inputs = without_labels(make_inputs(spec, model.config, task, batch=2, length=length))
    if padded:
        mask = torch.ones_like(inputs["input_ids"])
        mask[1, -3:] = 0
        inputs["attention_mask"] = mask
    return inputs


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("implementation", ["sdpa", "flex_attention"])
@pytest.mark.parametrize("name", list(_LENGTHS))
def test_forward_traces_without_a_graph_break(name, implementation):
    spec, task, model = _model(name, implementation)
    inputs = _inputs(spec, model, task, _LENGTHS[name])
    inputs.pop("global_attention_mask", None)  # how many tokens are global is read once per forward (see below)
    with torch.no_grad():
        explained = torch._dynamo.explain(model)(**inputs)
        compiled = torch.compile(model, backend="eager", fullgraph=True)
        got, want = compiled(**inputs), model(**inputs)
    assert explained.graph_break_count == 0, explained.break_reasons
    first = next(iter(want.values()))
    torch.testing.assert_close(next(iter(got.values())), first)


@pytest.mark.parametrize("implementation", ["sdpa", "flex_attention"])
@pytest.mark.parametrize("name", list(_LENGTHS))
def test_a_training_step_compiles(name, implementation):
    """Forward and backward through ``torch.compile`` (``aot_eager``: AOTAutograd's joint graph, no code generation)
    give the eager model's gradients (BigBird's padded input included: its slab mask is copied to the standard
    layout before the reshape the graph traces as a view, `block_sparse.block_sparse_attention`)."""
    spec, task, model = _model(name, implementation)
    inputs = _inputs(spec, model, task, _LENGTHS[name])
    model.train()

    def gradients(run):
        model.zero_grad()
        output = next(iter(run(**inputs).values()))
        output.float().square().mean().backward()
        # a parameter the output does not reach (BigBird's pooler) has no gradient in eager, zeros from AOTAutograd
        return {n: torch.zeros_like(p) if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}

    want = gradients(model)
    got = gradients(torch.compile(model, backend="aot_eager"))
    assert any(grad.any() for grad in want.values())
    for name, want_grad in want.items():
        torch.testing.assert_close(got[name], want_grad, rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("implementation", ["sdpa", "flex_attention"])
@pytest.mark.parametrize("name", list(_LENGTHS))
def test_five_lengths_compile_at_most_twice(name, implementation):
    """The second length makes the graph dynamic and the later ones reuse it: nothing in the traced forward
    specialises on the length (a traced Longformer keeps whole chunks of queries below one chunk, BigBird's middle
    blocks go in one slab, the keys of the compiled forward's block-mask cache leave their sizes out, and Reformer's
    LSH slots are gathered, not sliced). The lengths are 4 apart, some multiples of Reformer's chunk and some not,
    all inside one FlexAttention tile (128)."""
    spec, task, model = _model(name, implementation)
    counter = CompileCounter()
    compiled = torch.compile(model, backend=counter)
    base = _LENGTHS[name]
    with torch.no_grad():
        for length in (base, base + 4, base + 8, base + 12, base + 16):  # Reformer: at most 64 (axial positions)
            inputs = _inputs(spec, model, task, length)
            inputs.pop("global_attention_mask", None)
            compiled(**inputs)
    assert counter.frame_count <= 2, f"{counter.frame_count} compilations for 5 lengths"
