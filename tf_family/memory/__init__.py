"""Carried state and its pure math, shared by the tf_family models: segment-level recurrence, compression, kNN search,
the Memorizing Transformer's kNN memory and the kNN-LM interpolation. The kNN-LM datastore, which runs models to
build itself, is in `tf_family.retrieval`."""

from .compression import (
    COMPRESSION_KINDS,
    attention_reconstruction_loss,
    autoencoding_loss,
    compress_memory,
    content_attention,
    conv_compress,
    conv_transpose_decompress,
    dilated_conv_compress,
    dilated_conv_layers,
    max_pool_compress,
    mean_pool_compress,
    most_used_compress,
)
from .compressive import (
    CompressiveMemory,
    CompressiveUpdate,
    append_compressed,
    evicted_length,
    split_memory,
    update_compressive_memory,
)
from .knn import ExactKNNStore, FaissKNNStore, KNNStore, chunked_knn_search, dense_knn_search, load_knn_store
from .knn_lm import dense_knn_log_probs, interpolate_log_probs, knn_log_probs
from .knn_memory import (
    KNNMemory,
    MemorizingMemory,
    Retrieved,
    SharedBuffers,
    dense_knn_attention,
    fused_knn_attention,
    gathered_knn_attention,
    knn_attention,
    retrieve,
)
from .knn_reader import MemoryReader, ReaderRegistry
from .knn_search import (
    SEARCH_KINDS,
    Expired,
    MemoryAllowed,
    bucketed_top_k,
    exact_top_k,
    faiss_top_k,
    grouped_top_k,
    knn_top_k,
    native_top_k,
    select_top_k,
    top_k_reference,
)
from .segment import SegmentMemory, update_segment_memory


def _flatten_fields(names: tuple[str, ...]):
    return lambda state: ([getattr(state, name) for name in names], None)


def _unflatten_fields(cls: type, names: tuple[str, ...]):
    def unflatten(values, _context):
        state = object.__new__(cls)  # no __post_init__ checks: pytree utilities rebuild with placeholder leaves
        for name, value in zip(names, values, strict=True):
            setattr(state, name, value)
        return state

    return unflatten


def register_pytree_nodes() -> None:
    """Make `SegmentMemory` and `CompressiveMemory` pytree nodes (idempotent), so that `torch.export` traces the
    models that return them (Transformer-XL, the Compressive Transformer) with their memory. Called when this
    package is imported (below)."""
    import torch.utils._pytree as pytree

    nodes = {SegmentMemory: ("states", "mask"), CompressiveMemory: ("memory", "compressed", "usage")}
    for cls, names in nodes.items():
        if cls not in pytree.SUPPORTED_NODES:
            pytree.register_pytree_node(
                cls,
                _flatten_fields(names),
                _unflatten_fields(cls, names),
                serialized_type_name=f"tf_family.memory.{cls.__name__}",
            )


register_pytree_nodes()

__all__ = [
    "register_pytree_nodes",
    "SEARCH_KINDS",
    "Expired",
    "KNNMemory",
    "MemorizingMemory",
    "MemoryAllowed",
    "MemoryReader",
    "ReaderRegistry",
    "Retrieved",
    "SharedBuffers",
    "bucketed_top_k",
    "dense_knn_attention",
    "fused_knn_attention",
    "exact_top_k",
    "gathered_knn_attention",
    "grouped_top_k",
    "faiss_top_k",
    "knn_attention",
    "knn_top_k",
    "native_top_k",
    "retrieve",
    "select_top_k",
    "top_k_reference",
    "COMPRESSION_KINDS",
    "CompressiveMemory",
    "CompressiveUpdate",
    "ExactKNNStore",
    "FaissKNNStore",
    "KNNStore",
    "chunked_knn_search",
    "dense_knn_log_probs",
    "dense_knn_search",
    "interpolate_log_probs",
    "knn_log_probs",
    "load_knn_store",
    "SegmentMemory",
    "append_compressed",
    "attention_reconstruction_loss",
    "autoencoding_loss",
    "compress_memory",
    "content_attention",
    "conv_compress",
    "conv_transpose_decompress",
    "dilated_conv_compress",
    "dilated_conv_layers",
    "evicted_length",
    "max_pool_compress",
    "mean_pool_compress",
    "most_used_compress",
    "split_memory",
    "update_compressive_memory",
    "update_segment_memory",
]
