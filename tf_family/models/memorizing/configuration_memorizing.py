"""Configuration of the Memorizing Transformer (Wu et al. 2022, arXiv:2203.08913)."""

from __future__ import annotations

from dataclasses import field
from typing import Literal

from transformers import PreTrainedConfig

from ...layers.xl_config import XL_FAMILY_FIELDS, XLFamilyConfig
from ...memory.knn_faiss import FAISS_MEMORY_INDEXES
from ...memory.knn_search import SEARCH_KINDS
from ...modeling.validation import check_choice, check_float, check_nonnegative_int, check_positive_int

# the fields a Transformer-XL config shares with this one (same meaning, same weights): fine-tuning a Transformer-XL
# checkpoint into a Memorizing Transformer (paper section 4.5) copies them
TRANSFO_XL_FIELDS = XL_FAMILY_FIELDS
KNN_COMBINES = ("gate", "joint")
KNN_RETRIEVALS = ("token", "segment")
KNN_WRITES = ("in_place", "copy")


class TffMemorizingConfig(XLFamilyConfig):
    r"""Configuration of a Memorizing Transformer language model.

    A Transformer-XL decoder (relative positions, segment memory, adaptive input and softmax: the same fields and
    weights as `TffTransfoXLConfig`) in which the layers `knn_layers` also attend over the ``k`` nearest (key, value)
    pairs retrieved from a kNN memory of the stream's past.

    Args:
        transfo_xl_fields: `vocab_size`, `cutoffs`, `d_model`, `d_embed`, `n_head`, `d_head`, `d_inner`,
            `div_val`, `pre_lnorm`, `n_layer`, `mem_len`, `clamp_len`, `same_length`, `proj_share_all_but_first`,
            `untie_r`, `dropout`, `dropatt`, `proj_init_std`, `init_std`, `layer_norm_epsilon`,
            `tie_word_embeddings`, as in `TffTransfoXLConfig` (defaults: a small model, no adaptive softmax:
            `vocab_size` 32000, `d_model` 512, 8 heads, 12 layers, `mem_len` 512).
        knn_layers (`list[int]`, *optional*): indices of the kNN-augmented layers; defaults to the one at three
            quarters of the depth, ``[n_layer * 3 // 4 - 1]`` (meliad: the 9th of 12). An empty list gives
            Transformer-XL.
        knn_memory_size (`int`, defaults to 8192): entries a fresh kNN memory keeps per row and head (the paper's
            memory size; oldest evicted first). A memory passed in keeps its own size, so evaluation can use another
            (`TffMemorizingModel.empty_memory`). ``0`` keeps nothing (no retrieval).
        knn_top_k (`int`, defaults to 32): neighbours retrieved per query and head (``k``; the paper's 32).
        knn_combine (`str`, defaults to `"gate"`): `"gate"`: a learned per-head sigmoid gate mixes the local and the
            retrieved results (the paper, meliad); `"joint"`: one softmax over local keys and retrieved pairs
            (lucidrains).
        knn_retrieval (`str`, defaults to `"token"`): what a query may retrieve. `"token"`: every entry written
            before its own position (the memory as if written token by token, so how a stream is cut into segments
            or generated one token at a time never changes the result); `"segment"`: meliad's rule, the whole segment
            retrieves from earlier segments only, before it is written.
        knn_search (`str`, defaults to `"exact"`): `"exact"` (matrix product + top-k), `"bucketed"` (meliad's
            approximate top-k: the best slot of each of ``k`` strided buckets) or `"faiss"` (a faiss flat index).
        knn_faiss_index (`str`, defaults to `"flat"`): with ``knn_search="faiss"``, the persistent index per row and
            head (built once, then updated by every write in place): `"flat"` (exact), `"ivf_flat"` or `"ivf_pq"`
            (approximate; trained once on the keys present when built, at least `knn_faiss_nlist` of them).
        knn_faiss_nlist (`int`, defaults to 64), knn_faiss_nprobe (`int`, defaults to 8): IVF cells, and cells
            visited per query.
        knn_write (`str`, defaults to `"in_place"`): how a forward writes the segment into the kNN memory.
            `"in_place"`: into the preallocated ring buffers of the memory passed in, which is then consumed (using it
            again raises; `MemorizingMemory.clone` keeps a copy); `"copy"`: into a copy, leaving the memory passed in
            as it was (one copy of every buffer per forward: at 32k entries as costly as the search). Training with
            gradient checkpointing always copies (the recomputed layer must read what the first pass read).
        knn_gate_init (`float`, defaults to 0.0): initial per-head gate bias ``b`` (``g = sigmoid(b)``; meliad: 0).
        knn_scale_init (`float`, defaults to 10.0): initial per-head scale of the cosine scores of retrieved keys.
        use_cache (`bool`, defaults to `True`): return the memories (`mems`) from `forward`.

    The Transformer-XL fields, their derived defaults and their checks are the family's
    (`tf_family.layers.xl_config`); this class adds the kNN memory's.
    """

    model_type = "tff_memorizing"

    # Transformer-XL fields with other defaults: a small model, no adaptive softmax
    vocab_size: int = 32000
    cutoffs: list[int] = field(default_factory=list)
    d_model: int = 512
    n_head: int = 8
    d_inner: int = 2048
    div_val: int = 1
    n_layer: int = 12
    mem_len: int = 512
    same_length: bool = False
    knn_layers: list[int] | None = None
    knn_memory_size: int = 8192
    knn_top_k: int = 32
    knn_combine: Literal["gate", "joint"] = "gate"
    knn_retrieval: Literal["token", "segment"] = "token"
    knn_search: Literal["exact", "bucketed", "faiss"] = "exact"
    knn_faiss_index: Literal["flat", "ivf_flat", "ivf_pq"] = "flat"
    knn_faiss_nlist: int = 64
    knn_faiss_nprobe: int = 8
    knn_write: Literal["in_place", "copy"] = "in_place"
    knn_gate_init: float = 0.0
    knn_scale_init: float = 10.0
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        if self.knn_layers is None:
            self.knn_layers = [max(self.n_layer * 3 // 4 - 1, 0) if type(self.n_layer) is int else 0]
        if isinstance(self.knn_layers, tuple):
            self.knn_layers = list(self.knn_layers)
        super().__post_init__(**kwargs)

    @classmethod
    def from_transfo_xl_config(cls, config: PreTrainedConfig, **overrides) -> TffMemorizingConfig:
        """The Memorizing Transformer with the shape of a Transformer-XL config (`tff_transfo_xl`) plus kNN layers:
        ``overrides`` set the kNN fields (or change any other)."""
        if getattr(config, "model_type", None) != "tff_transfo_xl":
            raise ValueError(
                f"from_transfo_xl_config needs a tff_transfo_xl config, got model_type "
                f"{getattr(config, 'model_type', None)!r}."
            )
        return cls(**{name: getattr(config, name) for name in TRANSFO_XL_FIELDS}, **overrides)

    def validate_architecture(self):
        """The family's rules (`XLFamilyConfig.validate_architecture`) and the kNN memory's."""
        super().validate_architecture()
        check_nonnegative_int(
            "knn_memory_size", self.knn_memory_size, fix="set knn_memory_size >= 0 (0 disables that memory)"
        )
        for name in ("knn_faiss_nlist", "knn_faiss_nprobe"):
            check_positive_int(name, getattr(self, name))
        check_positive_int("knn_top_k", self.knn_top_k, fix="set knn_top_k >= 1 (neighbours per query)")
        if self.knn_layers != sorted(set(self.knn_layers)) or any(not 0 <= i < self.n_layer for i in self.knn_layers):
            raise ValueError(
                f"knn_layers must be increasing layer indices in [0, n_layer={self.n_layer}), got {self.knn_layers}."
            )
        for name, choices in (
            ("knn_combine", KNN_COMBINES),
            ("knn_retrieval", KNN_RETRIEVALS),
            ("knn_search", SEARCH_KINDS),
            ("knn_write", KNN_WRITES),
            ("knn_faiss_index", FAISS_MEMORY_INDEXES),
        ):
            check_choice(name, getattr(self, name), choices)
        check_float("knn_scale_init", self.knn_scale_init, minimum=0.0, min_open=True, fix="set knn_scale_init > 0")


__all__ = ["TffMemorizingConfig"]
