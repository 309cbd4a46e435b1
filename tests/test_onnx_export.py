"""ONNX export (`tf-family export --format onnx`): every architecture's eval forward, exported once with a dynamic
batch size and length, runs in onnxruntime and gives the eager outputs (within 1e-4) at other batch sizes and
lengths, with left padding; the memory models carry their memory through the graph (a second segment reads what the
first wrote, and the memories that come back match too); the kNN-LM's datastore search is refused with the reason.

One head per architecture runs by default; the other heads are ``slow`` (an export takes seconds)."""

import json

import numpy as np
import pytest
import torch

from tests.common.tester import build
from tf_family.cli import main
from tf_family.registry import ARCHITECTURES, create_model
from tf_family.shipping.onnx_export import (
    OnnxExportError,
    OnnxForward,
    example_inputs,
    export_model,
    memory_input_names,
    prepare_model,
)

onnxruntime = pytest.importorskip("onnxruntime")

# the head each architecture exports in the default run: its first task (Longformer's masked LM with global tokens)
HEADS = {arch: spec.tasks[0] for arch, spec in ARCHITECTURES.items()}
OTHER_HEADS = [
    (arch, task)
    for arch, spec in ARCHITECTURES.items()
    for task in spec.model_classes
    if task not in ("base", "multiple_choice", HEADS[arch])
]
# (batch, length) of the inputs checked: neither is the exported (2, 16); 21 tokens reach BigBird's sparse path at
# another block count and Reformer's second LSH chunk, 5 tokens its one-chunk case; the Memorizing Transformer's
# second segment of 21 wraps its 32-slot kNN memory
SHAPES = ((3, 21), (1, 5))
TOLERANCE = 1e-4


def _compare(name: str, got: np.ndarray, expected: torch.Tensor, mask: torch.Tensor | None) -> float:
    got = torch.from_numpy(got)
    assert got.shape == expected.shape, f"{name}: {tuple(got.shape)} != {tuple(expected.shape)}"
    if expected.dtype == torch.bool:
        assert torch.equal(got, expected), name
        return 0.0
    if mask is not None and expected.dim() >= 2 and expected.shape[:2] == mask.shape:
        got, expected = got[mask.bool()], expected[mask.bool()]  # padded positions' outputs are never used
    return float((got.float() - expected.float()).abs().max()) if expected.numel() else 0.0


def check_onnx_matches_eager(arch: str, task: str, folder, **overrides) -> float:
    """Export ``arch``'s ``task`` model (its tiny config with ``overrides``), run `SHAPES` (two segments for memory
    models) in onnxruntime and in eager; returns the largest difference (asserting it is within `TOLERANCE`)."""
    model = prepare_model(build(ARCHITECTURES[arch], task, **overrides))
    path = folder / f"{arch}-{task}.onnx"
    signature = export_model(model, path)
    wrapper = OnnxForward(model, task)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(signature.inputs)
    assert [o.name for o in session.get_outputs()] == list(signature.outputs)
    past_names = memory_input_names(model)
    worst = 0.0
    for batch, length in SHAPES:
        inputs, present = example_inputs(model, task, batch, length, seed=length), {}
        for segment in range(2 if past_names else 1):
            if segment:  # the next segment of the same streams reads the memory the first one left
                inputs = {**example_inputs(model, task, batch, length, seed=length + 1), **present}
            with torch.no_grad():
                expected = dict(zip(wrapper.outputs, wrapper(*inputs.values()), strict=True))
            outputs = session.run(None, {k: v.numpy() for k, v in inputs.items()})
            got = dict(zip(signature.outputs, outputs, strict=True))
            for name in signature.outputs:
                difference = _compare(name, got[name], expected[name], inputs.get("attention_mask"))
                assert difference <= TOLERANCE, f"{arch} {task} {name} at {(batch, length)}: {difference:.2e}"
                worst = max(worst, difference)
            present = {name: expected[name.replace("past_", "present_", 1)] for name in past_names}
    return worst


@pytest.mark.parametrize("arch", list(HEADS))
def test_every_architecture_exports_and_runs_in_onnxruntime(arch, tmp_path):
    check_onnx_matches_eager(arch, HEADS[arch], tmp_path)


@pytest.mark.parametrize(
    "overrides",
    [
        {"sparsity_pattern": "blockwise"},  # its causal shift's mask once had a bool Where onnxruntime lacks
        {"sparsity_pattern": "blockwise", "position_embedding_type": "distance_aware"},
        {"sparsity_pattern": "fixed", "position_embedding_type": "distance_aware"},
    ],
    ids=["blockwise", "blockwise-distance-aware", "fixed-distance-aware"],
)
def test_sparse_transformer_options_export(overrides, tmp_path):
    check_onnx_matches_eager("sparse_transformer", "causal_lm", tmp_path, **overrides)


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "task"), OTHER_HEADS, ids=[f"{a}-{t}" for a, t in OTHER_HEADS])
def test_the_other_heads_export(arch, task, tmp_path):
    check_onnx_matches_eager(arch, task, tmp_path)


def test_a_fresh_memory_input_is_no_memory(tmp_path):
    """The empty memory inputs that start a stream (zero states, every slot masked) give the outputs of a call
    without memory."""
    model = prepare_model(build(ARCHITECTURES["transfo_xl"], "causal_lm"))
    inputs = example_inputs(model, "causal_lm", 2, 9)
    with torch.no_grad():
        with_empty = OnnxForward(model, "causal_lm")(*inputs.values())[0]
        without = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
    keep = inputs["attention_mask"].bool()
    torch.testing.assert_close(with_empty[keep], without[keep], rtol=0, atol=1e-5)


def test_the_command_writes_the_graph_config_and_tokenizer(tmp_path, capsys):
    model = build(ARCHITECTURES["decision_transformer"], "action")
    model.save_pretrained(tmp_path / "saved")
    (tmp_path / "saved" / "tokenizer.json").write_text("{}")  # copied as it is (a Decision Transformer has none)
    command = ["export", "--format", "onnx", str(tmp_path / "saved"), str(tmp_path / "out")]
    assert main(command) == 0
    written = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert written == ["config.json", "model.onnx", "onnx_signature.json", "tokenizer.json"]
    signature = json.loads((tmp_path / "out" / "onnx_signature.json").read_text())
    assert signature["inputs"] == ["states", "actions", "returns_to_go", "timesteps", "attention_mask"]
    assert signature["dynamic_axes"]["states"] == {"0": "batch", "1": "sequence"}
    session = onnxruntime.InferenceSession(str(tmp_path / "out" / "model.onnx"), providers=["CPUExecutionProvider"])
    inputs = example_inputs(model.eval(), "action", 4, 7)
    (action_preds, *_) = session.run(None, {k: v.numpy() for k, v in inputs.items()})
    with torch.no_grad():
        expected = model(**inputs).action_preds
    keep = inputs["attention_mask"].bool()
    torch.testing.assert_close(torch.from_numpy(action_preds)[keep], expected[keep], rtol=0, atol=TOLERANCE)
    # a second export into the same, now full, folder is refused before any work
    assert main(command) == 1
    assert "not an empty folder" in capsys.readouterr().err


def test_the_knn_lm_datastore_search_is_refused_with_the_reason(tmp_path):
    from tf_family.retrieval.datastore import build_datastore

    model = build(ARCHITECTURES["knn_lm"], "causal_lm")
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.base_config.vocab_size, (2, 12), generator=generator)
    batches = [{"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}]
    datastore = build_datastore(model.lm, batches, tmp_path / "datastore", show_progress=False)
    model.set_datastore(datastore, allow_unverified=True)
    with pytest.raises(OnnxExportError, match="datastore search cannot be exported"):
        export_model(model, tmp_path / "model.onnx", include_datastore=True)
    assert not (tmp_path / "model.onnx").exists()


def test_reformer_settings_that_branch_on_the_length_are_refused(tmp_path):
    for overrides, match in (({"num_buckets": None}, "num_buckets=None"), ({"chunk_wrap_around": True}, "wrap")):
        model = build(ARCHITECTURES["reformer"], "causal_lm", **overrides)
        with pytest.raises(OnnxExportError, match=match):
            export_model(model, tmp_path / "model.onnx")


def test_export_without_onnxscript_names_the_extra_to_install(tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else find_spec(name, *a)
    )
    model = create_model("transfo_xl", "causal_lm", "tiny")
    with pytest.raises(ImportError, match=r'onnxscript.*pip install "tf_family\[onnx\]"'):
        export_model(model, tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()
