"""ONNX export of a saved tf_family folder: ``tf-family export --format onnx DIR OUT``.

The graph is the model's eval forward (`torch.onnx.export` with ``dynamo=True``) with a dynamic batch size and a
dynamic sequence length, and plain named tensors in and out, so that onnxruntime (or any ONNX runtime) runs it with
no tf_family installed:

- text models: ``input_ids`` ``(B, T)`` int64 and ``attention_mask`` ``(B, T)`` int64 (1 = real token; left or right
  padding), plus ``global_attention_mask`` ``(B, T)`` int64 for Longformer; out ``logits`` (``(B, T, V)``;
  ``(B, num_labels)`` for sequence classification) or ``start_logits`` / ``end_logits`` ``(B, T)``.
- the memory models carry their memory through the graph as tensors, one segment per call (feed the ``present_*``
  outputs of one call to the ``past_*`` inputs of the next): Transformer-XL ``past_memory_<l>`` ``(B, M, D)`` per
  layer and ``past_memory_mask`` ``(B, M)`` bool; the Compressive Transformer those and ``past_compressed_<l>``
  ``(B, C, D)`` with ``past_compressed_mask``; the Memorizing Transformer the segment memory and, per kNN layer,
  ``past_knn_keys_<i>`` / ``past_knn_values_<i>`` ``(B, H, N, Dh)`` with ``past_knn_mask`` ``(B, N)`` bool, the
  ring buffer held oldest slot first (`canonical_knn_memory`). Empty memories (`empty_memory_inputs`) start a
  stream: zero states with an all-False mask, the fixed sizes the model's config gives (``mem_len``,
  ``cmem_len``, ``knn_memory_size``).
- the Decision Transformer: ``states``, ``actions``, ``returns_to_go``, ``timesteps``, ``attention_mask``; out
  ``action_preds`` (and ``state_preds`` / ``return_preds`` when the model predicts them).

What cannot be exported is refused up front with `OnnxExportError` saying why: the kNN-LM's datastore search (an
external memory-mapped store or faiss index, searched by data-dependent code) — its base LM path (``lmbda=0``, no
datastore) exports, and the datastore's interpolation then runs outside the graph.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers.utils import logging

logger = logging.get_logger(__name__)

ONNX_FILE = "model.onnx"
SIGNATURE_FILE = "onnx_signature.json"
# example sizes traced at export time; any other batch size and length run (they are dynamic dimensions)
EXPORT_BATCH, EXPORT_LENGTH = 2, 16
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
)


class OnnxExportError(ValueError):
    """A model (or setting) that cannot be exported to ONNX; the message says why and what to do instead."""


@dataclass(frozen=True)
class GraphSignature:
    """The named inputs and outputs of an exported graph, and which input dimensions are dynamic."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    dynamic: dict[str, dict[int, str]]  # input name -> {axis: "batch" | "sequence"}

    def to_json(self) -> dict:
        return {
            "inputs": list(self.inputs),
            "outputs": list(self.outputs),
            "dynamic_axes": {name: {str(a): d for a, d in axes.items()} for name, axes in self.dynamic.items()},
        }


def _task_of(model: nn.Module) -> str:
    from ..registry import find_arch

    spec = find_arch(model.config.model_type)
    if spec is None:
        raise OnnxExportError(
            f"model_type {model.config.model_type!r} is not a tf_family architecture; export transformers' own models "
            "with optimum or torch.onnx.export."
        )
    for task, cls in spec.model_classes.items():
        if type(model) is cls:
            return task
    raise OnnxExportError(
        f"{type(model).__name__} is not one of {spec.name}'s model classes {list(spec.model_classes)}."
    )


def main_output_names(task: str, model: nn.Module) -> tuple[str, ...]:
    """The model outputs an exported graph returns for ``task`` (before any carried memory)."""
    if task == "question_answering":
        return ("start_logits", "end_logits")
    if task == "action":
        names = ["action_preds"]
        if getattr(model.config, "predict_state", False):
            names.append("state_preds")
        if getattr(model.config, "predict_return", False):
            names.append("return_preds")
        return tuple(names)
    if task == "base":
        return ("last_hidden_state",)
    return ("logits",)


# ------------------------------------------------------------------------------------------------ carried memory
def _memory_layout(model: nn.Module) -> dict[str, int]:
    """The fixed sizes of the memory tensors the graph carries (empty dict: the model carries nothing)."""
    kind = getattr(model, "carried_state", None)
    config = model.config
    if kind is None:
        return {}
    layout = {"layers": config.n_layer, "width": config.d_model, "mem_len": config.mem_len}
    if kind == "compressive_memory":
        layout["cmem_len"] = config.cmem_len
    if kind == "knn_memory":
        layout.update(
            knn_layers=len(config.knn_layers),
            heads=config.n_head,
            head_dim=config.d_head,
            knn_memory_size=config.knn_memory_size,
        )
    return layout


def memory_input_names(model: nn.Module) -> tuple[str, ...]:
    kind = getattr(model, "carried_state", None)
    if kind is None:
        return ()
    layout = _memory_layout(model)
    names: list[str] = []
    if layout["mem_len"] > 0:
        names += [f"past_memory_{layer}" for layer in range(layout["layers"])] + ["past_memory_mask"]
    if kind == "compressive_memory" and layout["cmem_len"] > 0:
        names += [f"past_compressed_{layer}" for layer in range(layout["layers"])] + ["past_compressed_mask"]
    if kind == "knn_memory":
        for index in range(layout["knn_layers"]):
            names += [f"past_knn_keys_{index}", f"past_knn_values_{index}"]
        names.append("past_knn_mask")
    return tuple(names)


def empty_memory_inputs(model: nn.Module, batch_size: int) -> dict[str, torch.Tensor]:
    """The memory inputs that start a stream: zero states, every slot masked, at the sizes the config fixes."""
    layout = _memory_layout(model)
    dtype = next(model.parameters()).dtype
    tensors: dict[str, torch.Tensor] = {}
    for name in memory_input_names(model):
        if name in ("past_memory_mask", "past_compressed_mask", "past_knn_mask"):
            size = {"past_memory_mask": "mem_len", "past_compressed_mask": "cmem_len"}.get(name, "knn_memory_size")
            tensors[name] = torch.zeros(batch_size, layout[size], dtype=torch.bool)
        elif name.startswith("past_memory_"):
            tensors[name] = torch.zeros(batch_size, layout["mem_len"], layout["width"], dtype=dtype)
        elif name.startswith("past_compressed_"):
            tensors[name] = torch.zeros(batch_size, layout["cmem_len"], layout["width"], dtype=dtype)
        else:  # kNN keys / values
            shape = (batch_size, layout["heads"], layout["knn_memory_size"], layout["head_dim"])
            tensors[name] = torch.zeros(shape, dtype=dtype)
    return tensors


def canonical_knn_memory(knn) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """A `KNNMemory`'s buffers rolled so that slot 0 is the oldest (``next_slot == 0``): the layout the graph's
    ``past_knn_*`` inputs and ``present_knn_*`` outputs use. Retrieval does not depend on where a pair sits."""
    # slot i of the result is slot (next_slot + i) mod N: a gather, whose shapes do not depend on next_slot (a
    # symbolic number in a traced graph)
    index = (torch.arange(knn.capacity, device=knn.mask.device) + knn.next_slot) % max(knn.capacity, 1)

    def roll(tensor: torch.Tensor, dim: int) -> torch.Tensor:
        return tensor.index_select(dim, index)

    return [roll(k, 2) for k in knn.keys], [roll(v, 2) for v in knn.values], roll(knn.mask, 1)


def _memory_from_inputs(model: nn.Module, memory: dict[str, torch.Tensor]):
    """The model's memory object built from the graph's ``past_*`` tensors."""
    from ..memory import CompressiveMemory, KNNMemory, MemorizingMemory, SegmentMemory

    kind = getattr(model, "carried_state", None)
    layers = model.config.n_layer if kind else 0
    segment = None
    if "past_memory_mask" in memory:
        segment = SegmentMemory(
            [memory[f"past_memory_{layer}"] for layer in range(layers)], memory["past_memory_mask"]
        )
    if kind == "segment_memory":
        return segment
    if kind == "compressive_memory":
        if segment is None:
            return None
        if "past_compressed_mask" in memory:
            compressed = SegmentMemory(
                [memory[f"past_compressed_{layer}"] for layer in range(layers)], memory["past_compressed_mask"]
            )
        else:
            compressed = SegmentMemory([state[:, :0] for state in segment.states], segment.mask[:, :0])
        return CompressiveMemory(segment, compressed)
    count = len(model.config.knn_layers)
    knn = KNNMemory(
        [memory[f"past_knn_keys_{index}"] for index in range(count)],
        [memory[f"past_knn_values_{index}"] for index in range(count)],
        memory["past_knn_mask"],
        next_slot=0,
    )
    return MemorizingMemory(segment, knn)


def _memory_outputs(model: nn.Module, mems) -> tuple[torch.Tensor, ...]:
    """The ``present_*`` tensors of the memory a forward returned, in `memory_input_names` order."""
    kind = getattr(model, "carried_state", None)
    out: list[torch.Tensor] = []
    segment = mems.memory if kind == "compressive_memory" else (mems.segment if kind == "knn_memory" else mems)
    if model.config.mem_len > 0:
        out += [*segment.states, segment.mask]
    if kind == "compressive_memory" and model.config.cmem_len > 0:
        out += [*mems.compressed.states, mems.compressed.mask]
    if kind == "knn_memory":
        keys, values, mask = canonical_knn_memory(mems.knn)
        for key, value in zip(keys, values, strict=True):
            out += [key, value]
        out.append(mask)
    return tuple(out)


# ------------------------------------------------------------------------------------------------------- the graph
def input_names(model: nn.Module, task: str) -> tuple[str, ...]:
    """The graph's inputs, in order."""
    if task == "action":
        return ("states", "actions", "returns_to_go", "timesteps", "attention_mask")
    names = ["input_ids", "attention_mask"]
    import inspect

    if "global_attention_mask" in inspect.signature(model.forward).parameters:
        names.append("global_attention_mask")
    return (*names, *memory_input_names(model))


def output_names(model: nn.Module, task: str) -> tuple[str, ...]:
    present = tuple(name.replace("past_", "present_", 1) for name in memory_input_names(model))
    return (*main_output_names(task, model), *present)


class OnnxForward(nn.Module):
    """The eval forward of ``model`` with named tensors in (`input_names` order) and a tuple of tensors out
    (`output_names` order): what `export_onnx` traces, and what a test runs eagerly to compare with onnxruntime."""

    def __init__(self, model: nn.Module, task: str):
        super().__init__()
        self.model, self.task = model, task
        self.inputs, self.outputs = input_names(model, task), output_names(model, task)

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        named = dict(zip(self.inputs, tensors, strict=True))
        model, task = self.model, self.task
        if task == "action":
            outputs = model(**named, return_dict=True)
            return tuple(getattr(outputs, name) for name in self.outputs)
        memory = {name: named.pop(name) for name in memory_input_names(model)}
        kwargs = dict(named, return_dict=True)
        if getattr(model, "carried_state", None) is not None:
            kwargs["mems"] = _memory_from_inputs(model, memory)
            kwargs["use_cache"] = True
        elif "use_cache" in _parameters(model):
            kwargs["use_cache"] = False  # a transformers KV cache is not a graph output
        outputs = model(**kwargs)
        main = tuple(getattr(outputs, name) for name in main_output_names(task, model))
        if getattr(model, "carried_state", None) is None:
            return main
        return (*main, *_memory_outputs(model, outputs.mems))


def _parameters(model: nn.Module) -> set[str]:
    import inspect

    return set(inspect.signature(model.forward).parameters)


def example_inputs(
    model: nn.Module, task: str, batch_size: int = EXPORT_BATCH, length: int = EXPORT_LENGTH, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Inputs of the graph for ``batch_size`` rows of ``length`` positions: random tokens (or trajectories) with
    the last row's first quarter left-padded, the global token first for Longformer, empty memories."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch_size, length, dtype=torch.long)
    if batch_size > 1:
        mask[-1, : max(1, length // 4)] = 0  # left padding on the last row
    if task == "action":
        dtype = next(model.parameters()).dtype
        states = torch.randn(batch_size, length, config.state_dim, generator=generator, dtype=dtype)
        if getattr(config, "discrete", False):
            actions = torch.randint(0, config.act_dim, (batch_size, length), generator=generator)
        else:
            actions = torch.rand(batch_size, length, config.act_dim, generator=generator, dtype=dtype) * 1.8 - 0.9
        returns = torch.randn(batch_size, length, 1, generator=generator, dtype=dtype)
        timesteps = torch.arange(length).expand(batch_size, length).contiguous()
        return {
            "states": states,
            "actions": actions,
            "returns_to_go": returns,
            "timesteps": timesteps,
            "attention_mask": mask,
        }
    vocab = config.vocab_size if hasattr(config, "vocab_size") else config.base_config.vocab_size
    inputs = {"input_ids": torch.randint(0, vocab, (batch_size, length), generator=generator), "attention_mask": mask}
    names = input_names(model, task)
    if "global_attention_mask" in names:
        global_mask = torch.zeros(batch_size, length, dtype=torch.long)
        global_mask[:, -1] = 1  # the last token (real in every row) is global
        inputs["global_attention_mask"] = global_mask
    inputs.update(empty_memory_inputs(model, batch_size))
    return inputs


def _dynamic_shapes(model: nn.Module, task: str, inputs: dict[str, torch.Tensor]) -> tuple[dict[int, object], ...]:
    from ..modeling.utils import max_input_length

    limit = None if task == "action" else max_input_length(getattr(model.config, "base_config", None) or model.config)
    if getattr(model, "carried_state", None) == "knn_memory":  # a segment no longer than the kNN memory
        limit = model.config.knn_memory_size
    batch = torch.export.Dim("batch")
    # segments of the Compressive Transformer that evict at least one whole group, as the trace assumes
    shortest = model.config.compression_rate + 1 if hasattr(model.config, "compression_rate") else 2
    sequence = torch.export.Dim("sequence", min=shortest, **({} if limit is None else {"max": limit}))
    # the memory sizes are the config's (mem_len, cmem_len, knn_memory_size), except the Compressive Transformer's
    # memory, which holds between mem_len and mem_len + rate - 1 states (whole groups of rate leave it)
    memory = None
    if getattr(model, "carried_state", None) == "compressive_memory" and model.config.compression_rate > 1:
        mem_len = model.config.mem_len
        memory = torch.export.Dim("memory", min=mem_len, max=mem_len + model.config.compression_rate - 1)
    shapes = []
    for name in inputs:
        if memory is not None and (name.startswith("past_memory_")):
            shapes.append({0: batch, 1: memory})
        elif name.startswith("past_"):
            shapes.append({0: batch})
        else:
            shapes.append({0: batch, 1: sequence})
    return tuple(shapes)


def _refuse_unexportable(model: nn.Module, include_datastore: bool) -> None:
    config = model.config
    if config.model_type == "tff_reformer":
        if config.chunk_wrap_around:
            raise OnnxExportError(
                "chunk_wrap_around=True (transformers' chunking, kept for parity) pads the input to a multiple of the "
                "chunk lengths, a branch on the length that a graph with a dynamic length cannot hold; export a model "
                "with chunk_wrap_around=False."
            )
        if "lsh" in config.attn_layers and config.num_buckets is None:
            raise OnnxExportError(
                "num_buckets=None picks the LSH bucket count from each call's length (and with it the shape of the "
                "random rotations), which a graph with a dynamic length cannot; set num_buckets in config.json (the "
                "value auto_num_buckets gives for your usual length) and export again."
            )
    if include_datastore and config.model_type != "tff_knn_lm":
        raise OnnxExportError(f"include_datastore (--with-datastore) is for kNN-LM folders, not {config.model_type}.")
    if include_datastore:
        raise OnnxExportError(
            "the kNN-LM's datastore search cannot be exported to ONNX: the datastore is an external store "
            "(memory-mapped key shards or a faiss index) searched by data-dependent code (top-k over a store whose "
            "size is not part of the graph), so no ONNX operator reproduces it. Export the base LM path instead "
            "(leave out --with-datastore: the graph returns the base model's log-probabilities, the kNN-LM with "
            "lmbda=0) and interpolate with the search results outside the graph."
        )


def prepare_model(model: nn.Module) -> nn.Module:
    """The model as the graph runs it, set in place: eval mode, the kNN-LM and SPALM without their datastore, the Memorizing
    Transformer with copy-on-write kNN memory and exact search instead of faiss (which runs outside a graph)."""
    model = model.eval()
    if getattr(model, "datastore", None) is not None:
        logger.warning(
            "The model's kNN datastore is left out of the ONNX graph (its search cannot be exported): the graph gives "
            "the model without retrieval (a kNN-LM's base model, lmbda=0; SPALM's Transformer-XL); combine with the "
            "search results outside it."
        )
        model.set_datastore(None)
    if getattr(model, "carried_state", None) == "knn_memory":
        model.config.knn_write = "copy"  # the same values; a graph does not write into its inputs
        if model.config.knn_search == "faiss":
            logger.warning("knn_search='faiss' runs outside a graph: the ONNX graph searches the kNN memory exactly.")
            model.config.knn_search = "exact"
    return model


def export_model(
    model: nn.Module,
    output_file: str | os.PathLike,
    *,
    include_datastore: bool = False,
    opset: int | None = None,
    optimize: bool = True,
) -> GraphSignature:
    """Export ``model``'s eval forward to ``output_file`` (see the module docstring for the graph's inputs and
    outputs; ``optimize``: onnxscript's graph optimisations, constant folding and the like); returns its
    signature."""
    task = _task_of(model)
    _refuse_unexportable(model, include_datastore)
    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"ONNX export needs {' and '.join(missing)}, which are not installed; install them with "
            '`pip install "tf_family[onnx]"` (or `pip install onnx onnxscript onnxruntime`).'
        )
    model = prepare_model(model)
    wrapper = OnnxForward(model, task).eval()
    inputs = example_inputs(model, task)
    shapes = _dynamic_shapes(model, task, inputs)
    dynamic = {
        name: {axis: dim.__name__ for axis, dim in shape.items()} for name, shape in zip(inputs, shapes, strict=True)
    }
    kwargs = {"opset_version": opset} if opset is not None else {}
    with torch.no_grad():
        # torch.export first, so that a branch on the length (a guard the graph would silently bake in) is an error
        # here rather than a graph that is wrong for other lengths
        exported = torch.export.export(
            wrapper,
            tuple(inputs.values()),
            dynamic_shapes=(shapes,),  # one entry: forward's *tensors
            strict=False,
        )
        program = torch.onnx.export(
            exported,
            dynamo=True,
            input_names=list(inputs),
            output_names=list(wrapper.outputs),
            external_data=False,
            optimize=optimize,
            verbose=False,
            **kwargs,
        )
    program.save(os.fspath(output_file))
    return GraphSignature(tuple(inputs), wrapper.outputs, dynamic)


def export_onnx(
    folder: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    include_datastore: bool = False,
    opset: int | None = None,
) -> Path:
    """``tf-family export --format onnx DIR OUT``: write ``OUT/model.onnx`` (the eval forward of the model saved in
    ``DIR``, dynamic batch and sequence length), ``onnx_signature.json`` (its inputs and outputs), ``config.json``
    and the tokenizer files. The folder is written beside ``OUT`` and renamed into place."""
    from transformers import AutoConfig  # knows our model types: importing this module ran tf_family/__init__

    from ..registry import find_arch

    source = Path(folder)
    if not (source / "config.json").is_file():
        raise OnnxExportError(f"{os.fspath(folder)!r} holds no config.json; pass a folder saved by save_pretrained.")
    config = AutoConfig.from_pretrained(source)
    spec = find_arch(config.model_type)
    if spec is None:
        raise OnnxExportError(
            f"{source}/config.json has model_type {config.model_type!r}, not a tf_family architecture; export "
            "transformers' own models with optimum or torch.onnx.export."
        )
    names = list(config.architectures or [])
    model_class = next((cls for cls in spec.model_classes.values() if cls.__name__ in names), None)
    if model_class is None:
        model_class = next(iter(spec.model_classes.values()))
    model = model_class.from_pretrained(source)
    _refuse_unexportable(model, include_datastore)

    target = Path(output_dir)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise OnnxExportError(f"{target} exists and is not an empty folder; pass a new output folder.")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        signature = export_model(model, staging / ONNX_FILE, include_datastore=include_datastore, opset=opset)
        (staging / SIGNATURE_FILE).write_text(
            json.dumps(
                {"architecture": spec.name, "model_class": model_class.__name__, **signature.to_json()}, indent=2
            )
            + "\n"
        )
        model.config.save_pretrained(staging)
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, staging / name)
        if target.exists():
            if not target.is_dir() or any(target.iterdir()):
                raise OnnxExportError(f"{target} exists and is not an empty folder; pass a new output folder.")
            target.rmdir()
        os.replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target / ONNX_FILE


def run_onnxruntime(path: str | os.PathLike, inputs: dict[str, torch.Tensor]) -> dict[str, object]:
    """Run an exported graph with onnxruntime on CPU: ``inputs`` by name -> outputs by name (NumPy arrays)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(os.fspath(path), providers=["CPUExecutionProvider"])
    feed = {i.name: inputs[i.name].numpy() for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


__all__ = [
    "GraphSignature",
    "OnnxExportError",
    "OnnxForward",
    "canonical_knn_memory",
    "empty_memory_inputs",
    "example_inputs",
    "export_model",
    "export_onnx",
    "input_names",
    "output_names",
    "run_onnxruntime",
]
