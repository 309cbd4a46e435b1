"""The kNN-LM datastore: (context representation, next token) pairs of a causal LM over a corpus.

Keys are taken with a forward hook at a named point of *any* ``AutoModelForCausalLM`` (no per-architecture code):

* ``key_point="lm_head_input"`` (default): the input of the output layer (``model.get_output_embeddings()``, or a
  module called ``lm_head`` such as Transformer-XL's adaptive softmax) — the final hidden state;
* ``key_point="ffn_input"``: the input of the last layer's feed-forward block (the last module named ``mlp``,
  ``feed_forward``, ``ffn`` or ``pos_ff``), the paper's best key (Khandelwal et al. 2020, Table 5).

``module_path`` overrides the module (a dotted name from ``model.named_modules()``). The value of the key at
position t is the token at t + 1 (the aligned ``labels`` of `tf_family.data.packing`).

On disk a datastore is a folder: ``datastore.json`` (key point, module path, dimension, count, dtype, the
fingerprints of the model and the tokenizer that built it, and ``content_sha256``, a digest of every key and value)
plus shards ``shard-00000.safetensors`` … each holding ``keys (S_i, D)`` and ``values (S_i,)``. A datastore is built
(or saved) whole into a staging folder beside its final place, flushed to disk and swapped in with a rename
(`tf_family.utils.files.atomic_replace_dir`): a build that is killed or fails leaves the previous datastore as it was.

Loading maps the shards into memory (no copy, no pickle) after checking the folder: every shard ``datastore.json``
names must lie inside the folder (no ``..``, no absolute path, no symlink out of it), its header and shapes must
agree with the description, and values must be integer token ids (damage is a `ValueError` naming the file). Using a
datastore with a model checks that the model built it (the weights fingerprint): another model or tokenizer is
refused unless ``force=True``. The model fingerprint is of the weights' values, not their dtype: the model that
built a datastore matches it when loaded in float32, bfloat16 or float16. A description without a fingerprint is refused unless ``allow_unverified=True`` (both
only log a warning). Indexes built over the keys live in sub-folders ``index-<type>/`` (`FaissKNNStore`), each
recording the ``content_sha256`` of the shards it was built from; an index of other shards (a datastore rebuilt in
place) is refused on load.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..memory.knn import ExactKNNStore, FaissKNNStore, KNNStore, Metric, load_knn_store, neighbour_scores
from ..modeling.losses import IGNORE_INDEX
from ..utils.files import (
    atomic_replace_dir,
    atomic_write_text,
    read_json_object,
    read_safetensors_header,
    resolve_inside,
)

logger = logging.get_logger(__name__)

KeyPoint = Literal["lm_head_input", "ffn_input"]
KEY_POINTS = ("lm_head_input", "ffn_input")
FFN_MODULE_NAMES = ("mlp", "feed_forward", "ffn", "pos_ff")
DESCRIPTION_FILE = "datastore.json"
FORMAT = "tf_family.knn_datastore"
_KEY_DTYPES = {"F16": np.float16, "F32": np.float32}
_VALUE_DTYPES = {"I64": np.int64, "I32": np.int32}


class DatastoreMismatchError(ValueError):
    """The datastore was built by another model or tokenizer than the one it is being used with, or cannot be checked
    (its description has no fingerprint)."""


# ------------------------------------------------------------------------------------------------------ fingerprints
# the load dtypes a datastore's model may come back in (``from_pretrained(dtype=...)``); its fingerprint is also
# recorded for the weights rounded to each, so that a datastore built in float32 serves the model loaded in bfloat16
FINGERPRINT_DTYPES = (torch.bfloat16, torch.float16)


def fingerprint_model(model: torch.nn.Module, rounded_to: torch.dtype | None = None) -> str:
    """SHA-256 of the model's parameter and buffer names, shapes and values (order independent).

    Floating-point tensors are hashed in float32 (after rounding to ``rounded_to`` when given), so the fingerprint
    depends on the values, not on the dtype they are held in: a bfloat16 model and its float32 upcast agree, and a
    float32 model's fingerprint with ``rounded_to=torch.bfloat16`` is that of the same model loaded with
    ``dtype=torch.bfloat16``. For a float32 model it is the fingerprint tf_family always wrote.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        tensor = tensor.detach().cpu()
        if tensor.is_floating_point():
            tensor = (tensor if rounded_to is None else tensor.to(rounded_to)).float()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _dtype_exact_fingerprint(model: torch.nn.Module) -> str:
    """The fingerprint of datastores written before fingerprints were dtype-independent: the tensors' own bytes
    and dtypes (equal to `fingerprint_model` for a float32 model)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def model_fingerprints(model: torch.nn.Module) -> dict[str, str]:
    """The fingerprints a datastore records: its model's values (``"model_fingerprint"``) and those values rounded
    to each of `FINGERPRINT_DTYPES` (``"model_fingerprint_rounded"``: dtype name -> fingerprint)."""
    return {
        "model_fingerprint": fingerprint_model(model),
        "model_fingerprint_rounded": {
            str(dtype).removeprefix("torch."): fingerprint_model(model, dtype) for dtype in FINGERPRINT_DTYPES
        },
    }


def _same_model(description: Mapping[str, Any], model: torch.nn.Module) -> bool:
    """Whether ``model`` holds the weights that built the datastore ``description`` describes, in any load dtype
    (float32, or rounded to bfloat16 / float16), or (a datastore of an older tf_family) byte for byte."""
    recorded = description.get("model_fingerprint")
    if recorded is None:
        return True
    accepted = {recorded, *(description.get("model_fingerprint_rounded") or {}).values()}
    return fingerprint_model(model) in accepted or _dtype_exact_fingerprint(model) == recorded


def fingerprint_tokenizer(tokenizer: Any) -> str | None:
    """SHA-256 of the tokenizer's vocabulary (token → id), or None without a tokenizer."""
    if tokenizer is None:
        return None
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    return hashlib.sha256(json.dumps(vocabulary, ensure_ascii=False).encode()).hexdigest()


# -------------------------------------------------------------------------------------------------------- key points
def resolve_key_module(
    model: torch.nn.Module, key_point: KeyPoint = "lm_head_input", module_path: str | None = None
) -> tuple[str, torch.nn.Module]:
    """The ``(dotted name, module)`` whose *input* is the key. ``module_path`` wins over ``key_point``."""
    modules = dict(model.named_modules())
    if module_path is not None:
        if module_path not in modules:
            near = [name for name in modules if name.split(".")[-1] == module_path.split(".")[-1]][:5]
            raise ValueError(
                f"module_path={module_path!r} is not a module of {type(model).__name__}"
                + (f"; modules with that name: {near}" if near else "")
                + ". Pass a dotted name from model.named_modules()."
            )
        return module_path, modules[module_path]
    if key_point not in KEY_POINTS:
        raise ValueError(f"key_point={key_point!r} is unknown; choose one of {list(KEY_POINTS)} or give module_path.")
    if key_point == "lm_head_input":
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        for name, module in modules.items():
            if (head is not None and module is head) or (head is None and name.split(".")[-1] == "lm_head"):
                return name, module
        raise ValueError(
            f"{type(model).__name__} has no output embeddings and no module called 'lm_head'; pass module_path= "
            "(the module whose input is the final hidden state)."
        )
    candidates = [name for name in modules if name and name.split(".")[-1] in FFN_MODULE_NAMES]
    if not candidates:
        raise ValueError(
            f"found no feed-forward block (a module named one of {list(FFN_MODULE_NAMES)}) in {type(model).__name__}; "
            "pass module_path= (the last layer's feed-forward module)."
        )
    return candidates[-1], modules[candidates[-1]]


@contextlib.contextmanager
def capture_module_inputs(module: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Within the block, every forward of ``module`` appends its first positional input (detached) to the list."""
    captured: list[torch.Tensor] = []

    def hook(_module, args, kwargs):
        value = args[0] if args else next(iter(kwargs.values()))
        captured.append(value.detach())

    handle = module.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield captured
    finally:
        handle.remove()


# ------------------------------------------------------------------------------------------------ safetensors memmap
def _memmap_shard(path: Path, dim: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keys (size, dim), values (size,))`` of a shard mapped from disk (copy-on-write pages, nothing read until
    used), after checking its header (`tf_family.utils.files.read_safetensors_header`) against the description."""
    header_size, header = read_safetensors_header(path)
    tensors = {}
    for name, shape, dtypes in (("keys", (size, dim), _KEY_DTYPES), ("values", (size,), _VALUE_DTYPES)):
        info = header.get(name)
        if info is None:
            raise ValueError(f"{path} has no {name!r} tensor (it holds {sorted(header)}); rebuild the datastore.")
        if info["dtype"] not in dtypes:
            kind = "float16/float32 keys" if name == "keys" else "integer token ids"
            raise ValueError(
                f"{path}: {name!r} has dtype {info['dtype']}, a datastore holds {kind}; rebuild the datastore."
            )
        if tuple(info["shape"]) != shape:
            raise ValueError(
                f"{path}: {name!r} has shape {tuple(info['shape'])}, {DESCRIPTION_FILE} says {shape}; rebuild the "
                "datastore."
            )
        begin, end = info["data_offsets"]
        dtype = dtypes[info["dtype"]]
        if end == begin:
            tensors[name] = torch.from_numpy(np.zeros(shape, dtype=dtype))
            continue
        array = np.memmap(path, dtype=dtype, mode="c", offset=8 + header_size + begin, shape=shape)
        tensors[name] = torch.from_numpy(array)
    return tensors["keys"], tensors["values"]


def read_description(folder: str | os.PathLike) -> dict[str, Any]:
    """The ``datastore.json`` of ``folder``, checked field by field (a `ValueError` names the file and the field)."""
    path = Path(folder) / DESCRIPTION_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a kNN datastore ({DESCRIPTION_FILE} is missing).")
    description = read_json_object(path, fix="rebuild the datastore")
    if description.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} description (format={description.get('format')!r}).")

    def count(value: Any) -> bool:
        return type(value) is int and value >= 0

    shards = description.get("shards")
    problem = None
    if not (type(description.get("dim")) is int and description["dim"] >= 1):
        problem = f"'dim' is {description.get('dim')!r}, not a positive integer"
    elif not count(description.get("size")):
        problem = f"'size' is {description.get('size')!r}, not a non-negative integer"
    elif not isinstance(shards, list):
        problem = f"'shards' is {type(shards).__name__ if 'shards' in description else 'missing'}, not a list"
    elif not all(isinstance(shard, dict) and isinstance(shard.get("file"), str) and count(shard.get("size"))
                 for shard in shards):  # fmt: skip
        problem = '\'shards\' must list objects {"file": name, "size": count}'
    elif sum(shard["size"] for shard in shards) != description["size"]:
        problem = f"the shards' sizes add up to {sum(s['size'] for s in shards)}, 'size' is {description['size']}"
    elif description.get("vocab_size") is not None and not (
        type(description["vocab_size"]) is int and description["vocab_size"] >= 1
    ):
        problem = f"'vocab_size' is {description['vocab_size']!r}, not a positive integer"
    else:
        for name in ("model_fingerprint", "tokenizer_fingerprint", "content_sha256", "module_path"):
            if description.get(name) is not None and not isinstance(description[name], str):
                problem = f"{name!r} is {description[name]!r}, not a string"
        for name, value in description.items():  # fingerprints by name (e.g. per dtype the weights were rounded to)
            if (
                name.startswith("model_fingerprint_")
                and value is not None
                and not (isinstance(value, dict) and all(isinstance(v, str) for v in value.values()))
            ):
                problem = f"{name!r} is {value!r}, not an object of fingerprint strings"
    if problem:
        raise ValueError(f"{path}: {problem}; the description is damaged: rebuild the datastore.")
    return description


class _ContentDigest:
    """SHA-256 of a datastore's keys and values (in id order, whatever the sharding): what ties an index to them."""

    def __init__(self) -> None:
        self.keys, self.values = hashlib.sha256(), hashlib.sha256()

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys.update(keys.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        self.values.update(values.detach().cpu().to(torch.long).contiguous().view(torch.uint8).numpy().tobytes())

    def hexdigest(self, dim: int, key_dtype: str) -> str:
        parts = f"{dim}:{key_dtype}:{self.keys.hexdigest()}:{self.values.hexdigest()}"
        return hashlib.sha256(parts.encode()).hexdigest()


def _check_replaceable(folder: Path) -> None:
    """A datastore is written by replacing ``folder`` whole: refuse a folder that holds something else."""
    if folder.exists() and (
        not folder.is_dir() or (any(folder.iterdir()) and not (folder / DESCRIPTION_FILE).is_file())
    ):
        raise ValueError(
            f"{folder} exists and is not a kNN datastore (no {DESCRIPTION_FILE}); a datastore replaces its folder "
            "whole, so pass a new or empty folder (or one holding a datastore to rebuild)."
        )


# --------------------------------------------------------------------------------------------------------- datastore
@dataclass
class KNNDatastore:
    """Keys (one tensor per shard, ``(S_i, D)``), their next tokens, and the description.

    ``search`` goes through ``index`` when one is attached (a `FaissKNNStore` built with `build_index` or loaded
    with `load_index`) and through an exact PyTorch search over the keys otherwise.
    """

    key_shards: list[torch.Tensor]
    value_shards: list[torch.Tensor]
    description: dict[str, Any]
    folder: Path | None = None
    index: KNNStore | None = None
    _exact: dict[str, ExactKNNStore] = field(default_factory=dict, repr=False)
    _values: torch.Tensor | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return sum(values.shape[0] for values in self.value_shards)

    def __len__(self) -> int:
        return self.size

    @property
    def dim(self) -> int:
        return int(self.description["dim"])

    @property
    def values(self) -> torch.Tensor:
        """Next tokens of all keys, ``(S,)`` long, in id order; checked on first use to be token ids (>= 0, below the
        description's ``vocab_size``)."""
        if self._values is None:
            vocab_size = self.description.get("vocab_size")
            shards = self.description.get("shards") or [{}] * len(self.value_shards)
            for number, (values, shard) in enumerate(zip(self.value_shards, shards, strict=False)):
                if values.is_floating_point() or values.is_complex():
                    raise ValueError(f"value shard {number} has dtype {values.dtype}; token ids must be integers.")
                if values.numel() and (values.min() < 0 or (vocab_size is not None and values.max() >= vocab_size)):
                    where = self.folder / shard["file"] if self.folder is not None and "file" in shard else number
                    raise ValueError(
                        f"{where}: 'values' holds token ids in [{int(values.min())}, {int(values.max())}], outside "
                        f"[0, {vocab_size}) (the vocab_size of {DESCRIPTION_FILE}); rebuild the datastore."
                    )
            self._values = torch.cat([v.long() for v in self.value_shards]) if self.value_shards else torch.zeros(0)
        return self._values

    def keys_at(self, ids: torch.Tensor) -> torch.Tensor:
        """Stored keys of ``ids`` (any shape) as float32 ``(*ids.shape, D)``; ids < 0 give zeros."""
        flat = ids.reshape(-1).cpu()
        out = torch.zeros(flat.shape[0], self.dim)
        offset = 0
        for shard in self.key_shards:
            inside = (flat >= offset) & (flat < offset + shard.shape[0])
            if inside.any():
                out[inside] = shard[flat[inside] - offset].float()
            offset += shard.shape[0]
        return out.view(*ids.shape, self.dim).to(ids.device)

    def exact_store(self, metric: Metric = "l2") -> ExactKNNStore:
        if metric not in self._exact:
            store = ExactKNNStore(self.dim, metric)
            for shard in self.key_shards:
                store.add(shard)
            self._exact[metric] = store
        return self._exact[metric]

    def search(
        self, queries: torch.Tensor, k: int, metric: Metric = "l2", recompute_distances: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N, D)`` queries → ``(scores (N, K), next tokens (N, K))``; missing neighbours have token -1.

        With an approximate ``index`` (IVF-PQ …) and ``recompute_distances=True``, the scores are recomputed
        exactly from the stored keys of the neighbours found (the paper's setting).
        """
        if queries.shape[-1] != self.dim:
            raise ValueError(f"queries have width {queries.shape[-1]}, the datastore's keys {self.dim}.")
        store = self.index if self.index is not None else self.exact_store(metric)
        if store.metric != metric:
            raise ValueError(f"the attached index searches with metric={store.metric!r}, not {metric!r}.")
        scores, ids = store.search(queries.float(), k)
        if recompute_distances and self.index is not None:
            keys = self.keys_at(ids).to(queries.device)  # (N, K, D)
            scores = neighbour_scores(queries.float(), keys, metric).masked_fill(ids < 0, float("-inf"))  # (N, K)
            scores, order = scores.sort(-1, descending=True)
            ids = ids.gather(1, order)
        tokens = self.values.to(ids.device)[ids.clamp_min(0)].masked_fill(ids < 0, -1)
        return scores, tokens

    # ---------------------------------------------------------------------------------------------------- indexes
    def build_index(
        self,
        index_type: str = "ivf_pq",
        metric: Metric = "l2",
        max_training_keys: int | None = 1_000_000,
        save: bool = True,
        show_progress: bool = True,
        **params,
    ) -> FaissKNNStore:
        """Train a faiss index on (a prefix of) the keys, add every shard, attach it, and save it into the folder."""
        store = FaissKNNStore(self.dim, metric, index_type, **params)
        if not store.is_trained:
            store.train(_prefix(self.key_shards, max_training_keys))
        for shard in self.key_shards:
            store.add(shard, show_progress=show_progress)
        self.index = store
        if save and self.folder is not None:
            store.save(self.folder / f"index-{index_type}", metadata=self.index_metadata())
        return store

    def verify(self) -> None:
        """Read every shard and compare its keys and values with the description's ``content_sha256`` (what loading
        does not do: it maps the shards without reading them). A `ValueError` says the shards were changed."""
        expected = self.description.get("content_sha256")
        if expected is None:
            raise ValueError(f"the datastore {self.folder or ''} records no content_sha256 to verify against.")
        digest = _ContentDigest()
        for keys, values in zip(self.key_shards, self.value_shards, strict=True):
            digest.update(keys, values)
        if digest.hexdigest(self.dim, str(self.description.get("key_dtype"))) != expected:
            raise ValueError(
                f"the shards of the datastore {self.folder or ''} do not match the content_sha256 of its "
                f"{DESCRIPTION_FILE}: they were changed or damaged; rebuild the datastore."
            )

    def index_metadata(self) -> dict[str, Any]:
        """What an index saved for this datastore records: the digest of the keys and values it was built from."""
        return {"datastore_content_sha256": self.description.get("content_sha256")}

    def load_index(self, index_type: str, allow_unverified: bool = False, **kwargs) -> KNNStore:
        """Load and attach ``index-<index_type>/``. An index built from other shards (the datastore was rebuilt since)
        is refused; one that records no shards (saved by an older version) too, unless ``allow_unverified=True``."""
        if self.folder is None:
            raise ValueError("this datastore has no folder to load an index from; save it first.")
        path = self.folder / f"index-{index_type}"
        if not path.is_dir():
            raise FileNotFoundError(f"{path} does not exist; build it with datastore.build_index({index_type!r}).")
        index = load_knn_store(path, **kwargs)
        recorded = getattr(index, "metadata", {}).get("datastore_content_sha256")
        expected = self.description.get("content_sha256")
        rebuild = f"rebuild it with datastore.build_index({index_type!r})"
        if index.size != self.size or index.dim != self.dim:
            raise ValueError(
                f"{path} holds {index.size} keys of width {index.dim}, the datastore {self.size} of width {self.dim}; "
                f"{rebuild}."
            )
        if recorded is None or expected is None:
            message = f"{path} cannot be checked against the datastore's shards (no content digest recorded)"
            if not allow_unverified:
                raise ValueError(f"{message}; {rebuild}, or pass allow_unverified=True to use it anyway.")
            logger.warning(f"{message}; using it anyway (allow_unverified=True).")
        elif recorded != expected:
            raise ValueError(
                f"{path} was built from other keys than the datastore's shards (the datastore was rebuilt since); "
                f"{rebuild}."
            )
        self.index = index
        return self.index

    # ------------------------------------------------------------------------------------------------------ disk
    def save(self, folder: str | os.PathLike, shard_size: int | None = None) -> None:
        """Write every shard and the description as ``folder`` (re-sharded to ``shard_size`` keys if given): built
        beside it and swapped in whole (`tf_family.utils.files.atomic_replace_dir`), so an interrupted save leaves what
        was there; indexes of an earlier datastore in ``folder`` go with it."""
        from safetensors.torch import save_file

        folder = Path(folder)
        _check_replaceable(folder)
        keys_shards, value_shards = self.key_shards, self.value_shards
        if shard_size is not None:
            keys, values = torch.cat(list(keys_shards)), torch.cat(list(value_shards))
            keys_shards, value_shards = list(keys.split(shard_size)), list(values.split(shard_size))
        shards, digest = [], _ContentDigest()
        with atomic_replace_dir(folder) as staging:
            for number, (keys, values) in enumerate(zip(keys_shards, value_shards, strict=True)):
                name = f"shard-{number:05d}.safetensors"
                save_file({"keys": keys.contiguous().cpu(), "values": values.contiguous().cpu()}, str(staging / name))
                digest.update(keys, values)
                shards.append({"file": name, "size": int(values.shape[0])})
            description = {
                **self.description,
                "shards": shards,
                "size": sum(s["size"] for s in shards),
                "content_sha256": digest.hexdigest(self.dim, str(self.description.get("key_dtype"))),
            }
            atomic_write_text(staging / DESCRIPTION_FILE, json.dumps(description, indent=2))
        self.description, self.folder = description, folder

    @classmethod
    def load(
        cls,
        folder: str | os.PathLike,
        model: torch.nn.Module | None = None,
        tokenizer: Any = None,
        force: bool = False,
        index_type: str | None = None,
        allow_unverified: bool = False,
    ) -> KNNDatastore:
        """Map a saved datastore, after checking its description and shards (see the module docstring). With
        ``model`` / ``tokenizer``, check they are the ones that built it (raise `DatastoreMismatchError` unless
        ``force=True``, which only logs a warning); a description without a model fingerprint, or an index that
        records no shards, is refused unless ``allow_unverified=True`` (a warning)."""
        folder = Path(folder)
        description = read_description(folder)
        check_fingerprints(description, model, tokenizer, force, where=str(folder), allow_unverified=allow_unverified)
        key_shards, value_shards = [], []
        manifest = folder / DESCRIPTION_FILE
        for shard in description["shards"]:
            path = resolve_inside(folder, shard["file"], manifest, what="shard")
            if not path.is_file():
                raise FileNotFoundError(f"{manifest} names the shard {shard['file']!r}, which is missing in {folder}.")
            keys, values = _memmap_shard(path, description["dim"], shard["size"])
            key_shards.append(keys)
            value_shards.append(values)
        datastore = cls(key_shards, value_shards, description, folder)
        if index_type is not None and index_type != "exact":
            datastore.load_index(index_type, allow_unverified=allow_unverified)
        return datastore


def check_fingerprints(
    description: Mapping[str, Any],
    model: torch.nn.Module | None,
    tokenizer: Any,
    force: bool,
    where: str = "",
    allow_unverified: bool = False,
) -> None:
    """Compare the model / tokenizer at hand with those that built a datastore; raise `DatastoreMismatchError` (or
    warn when ``force=True``). A description without a model fingerprint cannot be checked: refused too, unless
    ``allow_unverified=True`` (or ``force=True``), which warn."""
    problems = []
    recorded = description.get("model_fingerprint")
    if model is not None and recorded is None:
        message = f"The kNN datastore {where} records no model fingerprint, so nothing shows that this model built it"
        if not (allow_unverified or force):
            raise DatastoreMismatchError(
                message + ". Rebuild it with this model (tf_family.retrieval.build_datastore), or pass "
                "allow_unverified=True to use it anyway."
            )
        logger.warning(message + "; using it anyway (allow_unverified=True).")
    elif model is not None and not _same_model(description, model):
        problems.append(
            f"it was built by another model (weights fingerprint {recorded[:12]}…, "
            f"built from {description.get('model_name_or_path')!r})"
        )
    if tokenizer is not None and description.get("tokenizer_fingerprint") not in (
        None,
        fingerprint_tokenizer(tokenizer),
    ):
        problems.append("it was built with another tokenizer (a different vocabulary)")
    if not problems:
        return
    message = f"The kNN datastore {where} does not match: " + "; ".join(problems) + "."
    if force:
        logger.warning(message + " Using it anyway (force=True).")
        return
    raise DatastoreMismatchError(
        message + " Its keys live in another model's representation space, so neighbours would be meaningless. "
        "Rebuild the datastore with this model, or pass force=True (e.g. after a change that keeps the keys valid)."
    )


def _prefix(shards: list[torch.Tensor], count: int | None) -> torch.Tensor:
    if count is None:
        return torch.cat([s.float() for s in shards])
    taken, pieces = 0, []
    for shard in shards:
        if taken >= count:
            break
        pieces.append(shard[: count - taken].float())
        taken += pieces[-1].shape[0]
    return torch.cat(pieces)


# ----------------------------------------------------------------------------------------------------------- builder
def build_datastore(
    model: torch.nn.Module,
    batches: Iterable[Mapping[str, torch.Tensor]],
    folder: str | os.PathLike | None = None,
    *,
    tokenizer: Any = None,
    key_point: KeyPoint = "lm_head_input",
    module_path: str | None = None,
    key_dtype: torch.dtype = torch.float16,
    shard_size: int = 1_000_000,
    total: int | None = None,
    show_progress: bool = True,
) -> KNNDatastore:
    """Run ``model`` over ``batches`` and store (key, next token) for every scored position.

    Ten parameters: what to run over what and where to write it, then seven settings by keyword (where the keys
    are read, how they are stored, how the progress shows).

    Args:
        model: any causal LM (``model(input_ids=…, attention_mask=…)``); it runs in eval mode without gradients.
        batches: dicts with ``input_ids (B, T)``, aligned next-token ``labels (B, T)`` (-100 where nothing is
            stored) and optionally ``attention_mask``; e.g. ``LMBlocks.batch(...)`` of `tf_family.data.packing`.
        folder: where the datastore goes (None keeps it in memory). Each shard is written as soon as it fills, into a
            staging folder beside ``folder``; at the end the description is written and the staging folder replaces
            ``folder`` whole (an earlier datastore there, and its indexes, stay untouched until then, and stay if
            the build fails or is killed). A ``folder`` that holds anything but a datastore is refused.
        tokenizer: fingerprinted into the description, so a later load with another tokenizer is refused.
        key_point / module_path: where keys are read (see the module docstring).
        key_dtype: ``torch.float16`` (half the disk, the paper's ``--dstore-fp16``) or ``torch.float32``.
        shard_size: keys per shard file.
        total: number of batches, for the progress bar.
    """
    if key_dtype not in (torch.float16, torch.float32):
        raise ValueError(f"key_dtype must be torch.float16 or torch.float32, got {key_dtype}.")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}.")
    name, module = resolve_key_module(model, key_point, module_path)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    folder = Path(folder) if folder is not None else None
    build = contextlib.ExitStack()
    staging = None
    if folder is not None:
        _check_replaceable(folder)
        staging = build.enter_context(atomic_replace_dir(folder))
    shards = _ShardWriter(staging, key_dtype, shard_size)
    with build, torch.no_grad(), capture_module_inputs(module) as captured:
        for batch in tqdm(batches, total=total, desc="building kNN datastore", disable=not show_progress):
            shards.add(*_scored_pairs(model, batch, device, name, captured))
        shards.flush(final=True)
        model.train(was_training)
        if shards.dim is None:
            raise ValueError("no batches: the datastore would be empty.")
        description = _describe(model, shards, key_point, module_path, name, tokenizer)
        if staging is not None:
            description["shards"] = shards.written
            atomic_write_text(staging / DESCRIPTION_FILE, json.dumps(description, indent=2))
    # from a folder, memory-mapped: a datastore larger than RAM is never held whole
    datastore = (
        KNNDatastore(shards.key_shards, shards.value_shards, description)
        if folder is None
        else KNNDatastore.load(folder)
    )
    logger.info(f"kNN datastore: {datastore.size} keys of width {shards.dim} at {name!r}")
    return datastore


def _scored_pairs(
    model: torch.nn.Module, batch: Mapping[str, torch.Tensor], device, name: str, captured: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """One batch through ``model``: the keys ``(S, D)`` read at module ``name`` (its inputs, ``captured``) and the
    next tokens ``(S,)`` of its ``S`` scored positions (labels not -100), on the device they were computed on."""
    captured.clear()
    inputs = {"input_ids": batch["input_ids"].to(device)}
    if batch.get("attention_mask") is not None:
        inputs["attention_mask"] = batch["attention_mask"].to(device)
    model(**inputs)
    if len(captured) != 1:
        raise ValueError(
            f"the key module {name!r} ran {len(captured)} times in one forward; pass a module_path that "
            "runs once per forward (the input of the output layer or of one feed-forward block)."
        )
    hidden = captured[0]  # (B, T, D), or (B*T, D) for heads that flatten (adaptive softmax)
    labels = batch["labels"].to(hidden.device)
    if hidden.dim() == 2 and hidden.shape[0] == labels.numel():
        hidden = hidden.view(*labels.shape, -1)
    if hidden.shape[:2] != labels.shape:
        raise ValueError(
            f"keys at {name!r} have shape {tuple(hidden.shape)}, labels {tuple(labels.shape)}: the key module "
            "must see one vector per input position."
        )
    keep = labels != IGNORE_INDEX
    return hidden[keep], labels[keep]


class _ShardWriter:
    """The (key, next token) pairs of a build, cut into shards of ``shard_size``: each written into ``staging`` as
    soon as it fills (memory holds one shard at most), or kept in memory without a folder; with the content digest
    of everything emitted, in order."""

    def __init__(self, staging: Path | None, key_dtype: torch.dtype, shard_size: int):
        self.staging, self.key_dtype, self.shard_size = staging, key_dtype, shard_size
        self.digest = _ContentDigest()
        self.pending_keys: list[torch.Tensor] = []
        self.pending_values: list[torch.Tensor] = []
        self.key_shards: list[torch.Tensor] = []  # without a folder
        self.value_shards: list[torch.Tensor] = []
        self.written: list[dict[str, Any]] = []  # shards already on disk
        self.dim: int | None = None

    @property
    def size(self) -> int:
        return sum(v.shape[0] for v in self.value_shards) + sum(shard["size"] for shard in self.written)

    def add(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Queue a batch's pairs (keys cast to ``key_dtype`` on the CPU); emit every full shard."""
        self.dim = keys.shape[-1]
        self.pending_keys.append(keys.to("cpu", self.key_dtype))
        self.pending_values.append(values.to("cpu", torch.long))
        if sum(k.shape[0] for k in self.pending_keys) >= self.shard_size:
            self.flush(final=False)

    def flush(self, final: bool) -> None:
        """Emit the full shards queued (``final``: and the rest)."""
        size = self.shard_size
        keys = (
            torch.cat(self.pending_keys) if self.pending_keys else torch.zeros(0, self.dim or 0, dtype=self.key_dtype)
        )
        values = torch.cat(self.pending_values) if self.pending_values else torch.zeros(0, dtype=torch.long)
        while keys.shape[0] >= size or (final and keys.shape[0] > 0):
            self._emit(keys[:size].clone(), values[:size].clone())
            keys, values = keys[size:], values[size:]
        self.pending_keys, self.pending_values = [keys], [values]

    def _emit(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.digest.update(keys, values)
        if self.staging is None:
            self.key_shards.append(keys)
            self.value_shards.append(values)
            return
        from safetensors.torch import save_file

        name = f"shard-{len(self.written):05d}.safetensors"
        save_file({"keys": keys.contiguous(), "values": values.contiguous()}, str(self.staging / name))
        self.written.append({"file": name, "size": int(values.shape[0])})


def _describe(
    model: torch.nn.Module,
    shards: _ShardWriter,
    key_point: KeyPoint,
    module_path: str | None,
    name: str,
    tokenizer: Any,
) -> dict[str, Any]:
    """The datastore's description (``datastore.json`` without its shard list): where the keys were read, their
    width, count and dtype, the model and tokenizer fingerprints and the content digest."""
    config = getattr(model, "config", None)
    key_dtype_name = str(shards.key_dtype).removeprefix("torch.")
    return {
        "format": FORMAT,
        "version": 2,
        "key_point": key_point if module_path is None else "module_input",
        "module_path": name,
        "dim": int(shards.dim),
        "size": shards.size,
        "key_dtype": key_dtype_name,
        "model_class": type(model).__name__,
        "model_name_or_path": getattr(config, "_name_or_path", None) or None,
        "vocab_size": getattr(config, "vocab_size", None),
        **model_fingerprints(model),
        "tokenizer_fingerprint": fingerprint_tokenizer(tokenizer),
        "content_sha256": shards.digest.hexdigest(int(shards.dim), key_dtype_name),
    }


__all__ = [
    "DESCRIPTION_FILE",
    "read_description",
    "KEY_POINTS",
    "DatastoreMismatchError",
    "KNNDatastore",
    "build_datastore",
    "capture_module_inputs",
    "check_fingerprints",
    "fingerprint_model",
    "model_fingerprints",
    "fingerprint_tokenizer",
    "resolve_key_module",
]
