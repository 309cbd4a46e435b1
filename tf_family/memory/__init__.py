"""Carried state and its pure math, shared by the tf_family models: segment-level recurrence, compression, kNN search
and the kNN-LM interpolation. The kNN-LM datastore, which runs models to build itself, is in `tf_family.retrieval`."""

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
from .segment import SegmentMemory, update_segment_memory

__all__ = [
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
