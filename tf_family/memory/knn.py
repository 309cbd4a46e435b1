"""k-nearest-neighbour search over a store of key vectors: one interface, two backends.

* `ExactKNNStore`: brute force in PyTorch, queries against the keys in chunks of ``chunk_size`` keys (a running
  top-k merged chunk by chunk), L2 or inner product. It is the reference the approximate indexes are measured
  against, and fast enough for datastores of a few million keys.
* `FaissKNNStore`: a faiss index (``pip install "tf-family[faiss]"``): ``flat`` (exact), ``ivf_flat``, ``ivf_pq``
  (the kNN-LM paper's index: Khandelwal et al. 2020 used 4096 centroids, 64-byte codes, 32 probes) and ``hnsw``.
  Training and adding go in chunks with a progress bar; the index is saved with ``faiss.write_index`` to its own
  file (no pickle anywhere).

Both return **scores**, higher meaning closer: the negative squared L2 distance for ``metric="l2"`` and the inner
product for ``metric="ip"``, so ``softmax(scores / temperature)`` is the kNN distribution of Khandelwal et al.
(their p_kNN uses ``exp(-d)`` with d the squared L2 distance). Shapes: queries ``(N, D)``, keys ``(S, D)``,
results ``(N, K)``. `dense_knn_search` is the one-matrix-product twin the chunked search is tested against.
"""

from __future__ import annotations

import json
import os
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..utils.files import atomic_write_text, atomic_write_with, read_json_object, read_safetensors_header
from ..utils.files import file_sha256 as _file_sha256

logger = logging.get_logger(__name__)

Metric = Literal["l2", "ip"]
METRICS = ("l2", "ip")
FAISS_INDEX_TYPES = ("flat", "ivf_flat", "ivf_pq", "hnsw")
STORE_DESCRIPTION = "knn_store.json"


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ValueError(f"metric={metric!r} is unknown; choose 'l2' (squared Euclidean) or 'ip' (inner product).")


def _check_queries(queries: torch.Tensor, dim: int, k: int) -> None:
    if queries.dim() != 2 or queries.shape[1] != dim:
        raise ValueError(f"queries must have shape (N, {dim}), got {tuple(queries.shape)}.")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}.")


def pairwise_scores(queries: torch.Tensor, keys: torch.Tensor, metric: Metric) -> torch.Tensor:
    """Scores (higher = closer) of every query against every key: ``(N, D), (S, D) -> (N, S)`` in float32.

    Squared L2 is expanded as ``|q|^2 - 2 q.k + |k|^2`` (one matrix product, as faiss does), clamped at 0.
    """
    _check_metric(metric)
    queries, keys = queries.float(), keys.float()
    products = queries @ keys.T  # (N, S)
    if metric == "ip":
        return products
    squared = queries.pow(2).sum(-1, keepdim=True) - 2 * products + keys.pow(2).sum(-1)[None, :]
    return -squared.clamp_min(0)


def neighbour_scores(queries: torch.Tensor, neighbour_keys: torch.Tensor, metric: Metric) -> torch.Tensor:
    """Exact scores of each query against its own neighbours: ``(N, D), (N, K, D) -> (N, K)`` in float32."""
    _check_metric(metric)
    queries, neighbour_keys = queries.float()[:, None, :], neighbour_keys.float()
    if metric == "ip":
        return (queries * neighbour_keys).sum(-1)
    return -(queries - neighbour_keys).pow(2).sum(-1)


def merge_top_k(
    scores: torch.Tensor, ids: torch.Tensor, more_scores: torch.Tensor, more_ids: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` best of two candidate lists ``(N, K1)`` and ``(N, K2)``, sorted by decreasing score."""
    merged_scores, merged_ids = torch.cat([scores, more_scores], 1), torch.cat([ids, more_ids], 1)
    best, position = merged_scores.topk(min(k, merged_scores.shape[1]), dim=-1)
    return best, merged_ids.gather(1, position)


def dense_knn_search(
    queries: torch.Tensor, keys: torch.Tensor, k: int, metric: Metric = "l2"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference search: all scores at once, then top-k. Returns ``(scores, ids)``, each ``(N, min(k, S))``."""
    _check_queries(queries, keys.shape[1], k)
    scores = pairwise_scores(queries, keys, metric)  # (N, S)
    return scores.topk(min(k, keys.shape[0]), dim=-1)


def chunked_knn_search(
    queries: torch.Tensor, keys: torch.Tensor, k: int, metric: Metric = "l2", chunk_size: int = 65536
) -> tuple[torch.Tensor, torch.Tensor]:
    """`dense_knn_search` with keys visited ``chunk_size`` at a time: memory ``O(N * (chunk_size + k))``.

    ``keys`` may be a memory-mapped float16 tensor; each chunk is read and cast to float32 on the queries' device.
    """
    _check_queries(queries, keys.shape[1], k)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}.")
    n = queries.shape[0]
    k = min(k, keys.shape[0])
    best_scores = queries.new_full((n, 0), float("-inf"), dtype=torch.float32)
    best_ids = torch.zeros((n, 0), dtype=torch.long, device=queries.device)
    for start in range(0, keys.shape[0], chunk_size):
        chunk = keys[start : start + chunk_size].to(queries.device, torch.float32)  # (S_chunk, D)
        scores = pairwise_scores(queries, chunk, metric)  # (N, S_chunk)
        ids = torch.arange(start, start + chunk.shape[0], device=queries.device).expand(n, -1)
        best_scores, best_ids = merge_top_k(best_scores, best_ids, scores, ids, k)
    return best_scores, best_ids


class KNNStore(ABC):
    """What every kNN backend offers: ``add`` keys, ``search`` queries, ``save`` / ``load`` a folder.

    Ids are positions in insertion order (0, 1, …), so a caller keeps its own payload (the kNN-LM's next tokens,
    the Memorizing Transformer's values) in a tensor indexed by them. ``search`` returns ``(scores, ids)`` of shape
    ``(N, K)`` sorted by decreasing score; ids of -1 (faiss, when fewer than K keys are reachable) come with a
    score of ``-inf``.
    """

    dim: int
    metric: Metric
    # what `save(folder, metadata=...)` recorded beside the store (e.g. the datastore it was built from)
    metadata: dict

    @property
    @abstractmethod
    def size(self) -> int:
        """Number of keys held."""

    @abstractmethod
    def add(self, keys: torch.Tensor) -> None:
        """Append ``keys`` ``(S, D)``; their ids continue from ``size``."""

    @abstractmethod
    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(N, D) -> (scores (N, K) float32, ids (N, K) long)``."""

    @abstractmethod
    def save(self, folder: str | os.PathLike, metadata: dict | None = None) -> None:
        """Write the store into ``folder`` (created if needed), each file atomically; ``metadata`` (JSON values) is
        recorded in its description and comes back as ``.metadata`` on load."""

    def __len__(self) -> int:
        return self.size


class ExactKNNStore(KNNStore):
    """Brute-force search in PyTorch (the reference). Keys are kept as given (float16 keys stay float16)."""

    def __init__(self, dim: int, metric: Metric = "l2", chunk_size: int = 65536, keys: torch.Tensor | None = None):
        _check_metric(metric)
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}.")
        self.dim, self.metric, self.chunk_size = dim, metric, chunk_size
        self.metadata: dict = {}
        self._chunks: list[torch.Tensor] = []
        self._keys: torch.Tensor | None = None
        if keys is not None:
            self.add(keys)

    @property
    def size(self) -> int:
        return sum(chunk.shape[0] for chunk in self._chunks)

    @property
    def keys(self) -> torch.Tensor:
        """All keys ``(S, D)`` (concatenated once, on first use after an ``add``)."""
        if self._keys is None:
            if len(self._chunks) == 1:
                self._keys = self._chunks[0]
            else:
                self._keys = torch.cat(self._chunks) if self._chunks else torch.zeros(0, self.dim)
            self._chunks = [self._keys]
        return self._keys

    def add(self, keys: torch.Tensor) -> None:
        if keys.dim() != 2 or keys.shape[1] != self.dim:
            raise ValueError(f"keys must have shape (S, {self.dim}), got {tuple(keys.shape)}.")
        self._chunks.append(keys.detach())
        self._keys = None

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check_queries(queries, self.dim, k)
        if self.size == 0:
            raise ValueError("the store is empty; add keys before searching.")
        # shards are searched one by one (memory-mapped shards are never concatenated)
        scores = queries.new_full((queries.shape[0], 0), float("-inf"), dtype=torch.float32)
        ids = torch.zeros((queries.shape[0], 0), dtype=torch.long, device=queries.device)
        offset = 0
        for chunk in self._chunks:
            chunk_scores, chunk_ids = chunked_knn_search(queries, chunk, k, self.metric, self.chunk_size)
            scores, ids = merge_top_k(scores, ids, chunk_scores, chunk_ids + offset, k)
            offset += chunk.shape[0]
        return scores, ids

    def save(self, folder: str | os.PathLike, metadata: dict | None = None) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        keys = self.keys.contiguous().cpu()
        atomic_write_with(lambda path: save_file({"keys": keys}, path), folder / "keys.safetensors")
        _write_description(folder, {"backend": "exact", "dim": self.dim, "metric": self.metric}, metadata)

    @classmethod
    def load(cls, folder: str | os.PathLike, chunk_size: int = 65536) -> ExactKNNStore:
        from safetensors.torch import load_file

        description = _read_description(folder, "exact")
        path = Path(folder) / "keys.safetensors"
        _, header = read_safetensors_header(path)
        shape = header.get("keys", {}).get("shape")
        if shape is None or len(shape) != 2 or shape[1] != description["dim"]:
            raise ValueError(f"{path} holds no 'keys' of shape (S, {description['dim']}); save the store again.")
        store = cls(description["dim"], description["metric"], chunk_size, load_file(str(path))["keys"])
        store.metadata = description.get("metadata") or {}
        return store


def _require_faiss():
    try:
        import faiss
    except ImportError as error:
        raise ImportError(
            'FaissKNNStore needs faiss: pip install "tf-family[faiss]" (faiss-cpu), or use ExactKNNStore.'
        ) from error
    return faiss


@dataclass(frozen=True)
class FaissIndexParams:
    """The settings of a `FaissKNNStore`'s index (recorded in its ``knn_store.json`` as ``params``).

    Attributes:
        nlist: IVF centroids (``ivf_*``). nprobe: IVF lists visited per query.
        pq_m: PQ sub-quantizers (bytes per code with 8 bits; must divide D). pq_bits: bits per sub-quantizer.
        hnsw_m: HNSW neighbours per node. ef_search / ef_construction: HNSW beam widths.
        chunk_size: keys per ``add`` / training call, shown with a progress bar.
        seed: seed of faiss's k-means (training is deterministic given it).
    """

    nlist: int = 1024
    nprobe: int = 32
    pq_m: int = 8
    pq_bits: int = 8
    hnsw_m: int = 32
    ef_search: int = 64
    ef_construction: int = 64
    chunk_size: int = 500_000
    seed: int = 1234


class FaissKNNStore(KNNStore):
    """A faiss index behind the `KNNStore` interface.

    Args:
        dim: key width D.
        metric: ``"l2"`` or ``"ip"``.
        index_type: ``"flat"``, ``"ivf_flat"``, ``"ivf_pq"`` or ``"hnsw"``.
        index: an index already built (`load`), or None for a new one.
        params: by keyword, the fields of `FaissIndexParams` to set (``nlist=4096, nprobe=32``); the others keep
            their defaults.
    """

    def __init__(self, dim: int, metric: Metric = "l2", index_type: str = "flat", *, index=None, **params: int):
        faiss = _require_faiss()
        _check_metric(metric)
        if index_type not in FAISS_INDEX_TYPES:
            raise ValueError(f"index_type={index_type!r} is unknown; choose one of {list(FAISS_INDEX_TYPES)}.")
        unknown = sorted(set(params) - {f.name for f in fields(FaissIndexParams)})
        if unknown:
            raise TypeError(
                f"FaissKNNStore got unknown index settings {unknown}; the settings are the fields of FaissIndexParams: "
                f"{[f.name for f in fields(FaissIndexParams)]}."
            )
        settings = FaissIndexParams(**params)
        if index_type == "ivf_pq" and dim % settings.pq_m:
            raise ValueError(f"pq_m={settings.pq_m} must divide the key width dim={dim} for index_type='ivf_pq'.")
        self.dim, self.metric, self.index_type = dim, metric, index_type
        self.params = asdict(settings)
        self.index = index if index is not None else self._new_index(faiss)
        self.metadata: dict = {}
        self._apply_search_params()

    def _new_index(self, faiss):
        p = self.params
        faiss_metric = faiss.METRIC_L2 if self.metric == "l2" else faiss.METRIC_INNER_PRODUCT
        if self.index_type == "flat":
            return faiss.IndexFlat(self.dim, faiss_metric)
        if self.index_type == "hnsw":
            index = faiss.IndexHNSWFlat(self.dim, p["hnsw_m"], faiss_metric)
            index.hnsw.efConstruction = p["ef_construction"]
            return index
        quantizer = faiss.IndexFlat(self.dim, faiss_metric)
        if self.index_type == "ivf_flat":
            index = faiss.IndexIVFFlat(quantizer, self.dim, p["nlist"], faiss_metric)
        else:
            index = faiss.IndexIVFPQ(quantizer, self.dim, p["nlist"], p["pq_m"], p["pq_bits"], faiss_metric)
        index.cp.seed = p["seed"]
        # the quantizer must live as long as the index (faiss keeps a raw pointer)
        self._quantizer = quantizer
        return index

    def _apply_search_params(self) -> None:
        faiss = _require_faiss()
        if self.index_type in ("ivf_flat", "ivf_pq"):
            faiss.extract_index_ivf(self.index).nprobe = self.params["nprobe"]
        elif self.index_type == "hnsw":
            self.index.hnsw.efSearch = self.params["ef_search"]

    @property
    def size(self) -> int:
        return int(self.index.ntotal)

    @property
    def is_trained(self) -> bool:
        return bool(self.index.is_trained)

    @property
    def is_exact(self) -> bool:
        return self.index_type == "flat"

    def train(self, keys: torch.Tensor, max_training_keys: int | None = None) -> None:
        """Train the coarse quantizer / PQ codebooks on ``keys`` (or its first ``max_training_keys`` rows).

        A no-op for ``flat`` and ``hnsw``. IVF needs at least ``nlist`` keys (faiss warns below ~39 per centroid).
        """
        if self.is_trained:
            return
        sample = keys if max_training_keys is None else keys[:max_training_keys]
        needed = self.params["nlist"]
        if self.index_type == "ivf_pq":
            needed = max(needed, 2 ** self.params["pq_bits"])
        if sample.shape[0] < needed:
            raise ValueError(
                f"{self.index_type} with nlist={self.params['nlist']} (and pq_bits={self.params['pq_bits']}) needs at "
                f"least {needed} training keys, got {sample.shape[0]}; lower nlist or use index_type='flat'."
            )
        logger.info(f"training faiss {self.index_type} on {sample.shape[0]} keys")
        self.index.train(_as_faiss_array(sample))

    def add(self, keys: torch.Tensor, show_progress: bool = False) -> None:
        if keys.dim() != 2 or keys.shape[1] != self.dim:
            raise ValueError(f"keys must have shape (S, {self.dim}), got {tuple(keys.shape)}.")
        if not self.is_trained:
            raise ValueError(f"the {self.index_type} index is not trained; call train(keys) before add().")
        chunk = self.params["chunk_size"]
        starts = range(0, keys.shape[0], chunk)
        for start in tqdm(starts, desc=f"adding to faiss {self.index_type}", disable=not show_progress):
            self.index.add(_as_faiss_array(keys[start : start + chunk]))

    def search(self, queries: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        _check_queries(queries, self.dim, k)
        if self.size == 0:
            raise ValueError("the store is empty; add keys before searching.")
        distances, ids = self.index.search(_as_faiss_array(queries), min(k, self.size))
        scores = torch.from_numpy(distances).to(queries.device)
        ids = torch.from_numpy(ids).to(queries.device)
        if self.metric == "l2":
            scores = -scores
        return scores.masked_fill(ids < 0, float("-inf")), ids

    def save(self, folder: str | os.PathLike, metadata: dict | None = None) -> None:
        faiss = _require_faiss()
        folder = Path(folder)
        atomic_write_with(lambda path: faiss.write_index(self.index, path), folder / "index.faiss")
        _write_description(
            folder,
            {"backend": "faiss", "dim": self.dim, "metric": self.metric, "index_type": self.index_type}
            | {"params": self.params, "file_sha256": _file_sha256(folder / "index.faiss")},
            metadata,
        )

    @classmethod
    def load(cls, folder: str | os.PathLike, mmap: bool = False, **search_params) -> FaissKNNStore:
        """Read a saved index; ``mmap=True`` maps it from disk (``IO_FLAG_MMAP``); ``nprobe=`` / ``ef_search=``
        override the saved search parameters."""
        faiss = _require_faiss()
        description = _read_description(folder, "faiss")
        path = Path(folder) / "index.faiss"
        if not path.is_file():
            raise FileNotFoundError(f"{folder} has a {STORE_DESCRIPTION} but no index.faiss; rebuild the index.")
        flags = faiss.IO_FLAG_MMAP if mmap else 0
        recorded = description.get("file_sha256")
        if recorded is not None and not mmap and _file_sha256(path) != recorded:  # a mapped index is not read whole
            raise ValueError(
                f"{path} does not match the file_sha256 of {STORE_DESCRIPTION}: it was changed or damaged; rebuild "
                "the index."
            )
        try:
            index = faiss.read_index(str(path), flags)
        except Exception as error:  # noqa: BLE001 - faiss raises RuntimeError with C++ text for damaged files
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ValueError(
                f"{path} could not be read as a faiss index ({first_line}); rebuild the index."
            ) from error
        index_type, params = description.get("index_type"), description.get("params")
        if index_type not in FAISS_INDEX_TYPES or not isinstance(params, dict):
            raise ValueError(
                f"{Path(folder) / STORE_DESCRIPTION}: 'index_type' / 'params' are damaged; rebuild the index."
            )
        if index.d != description["dim"]:
            raise ValueError(f"{path} holds keys of width {index.d}, {STORE_DESCRIPTION} says {description['dim']}.")
        params = {**params, **search_params}
        try:
            store = cls(description["dim"], description["metric"], index_type, index=index, **params)
        except (TypeError, AttributeError, RuntimeError) as error:
            raise ValueError(
                f"{path} does not match {Path(folder) / STORE_DESCRIPTION} ({type(error).__name__}: {error}); rebuild "
                "the index."
            ) from error
        store.metadata = description.get("metadata") or {}
        return store


def _as_faiss_array(tensor: torch.Tensor):
    return tensor.detach().to("cpu", torch.float32).contiguous().numpy()


def _write_description(folder: Path, description: dict, metadata: dict | None = None) -> None:
    if metadata:
        description = {**description, "metadata": metadata}
    atomic_write_text(folder / STORE_DESCRIPTION, json.dumps(description, indent=2))


def _read_description(folder: str | os.PathLike, backend: str | None = None) -> dict:
    """``knn_store.json`` of ``folder``, checked (a `ValueError` names the file and the field)."""
    path = Path(folder) / STORE_DESCRIPTION
    if not path.is_file():
        raise FileNotFoundError(f"{folder} holds no kNN store ({STORE_DESCRIPTION} is missing).")
    description = read_json_object(path, fix="save the store again")
    if backend is not None and description.get("backend") != backend:
        raise ValueError(f"{folder} holds a {description.get('backend')!r} store, not a {backend!r} one.")
    if not (type(description.get("dim")) is int and description["dim"] >= 1):
        raise ValueError(f"{path}: 'dim' is {description.get('dim')!r}, not a positive integer; save the store again.")
    if description.get("metric") not in METRICS:
        raise ValueError(f"{path}: 'metric' is {description.get('metric')!r}, not one of {list(METRICS)}.")
    if not isinstance(description.get("metadata", {}), dict):
        raise ValueError(f"{path}: 'metadata' is not a JSON object; save the store again.")
    return description


def load_knn_store(folder: str | os.PathLike, **kwargs) -> KNNStore:
    """Load whichever store `save` wrote into ``folder``."""
    backend = _read_description(folder).get("backend")
    if backend == "exact":
        return ExactKNNStore.load(folder, **kwargs)
    if backend == "faiss":
        return FaissKNNStore.load(folder, **kwargs)
    raise ValueError(f"{folder}: unknown kNN store backend {backend!r}.")


__all__ = [
    "FAISS_INDEX_TYPES",
    "ExactKNNStore",
    "FaissIndexParams",
    "FaissKNNStore",
    "KNNStore",
    "chunked_knn_search",
    "dense_knn_search",
    "load_knn_store",
    "merge_top_k",
    "neighbour_scores",
    "pairwise_scores",
]
