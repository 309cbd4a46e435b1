"""Pure memory math shared by the tf_family models: segment-level recurrence, compression (and, later, kNN)."""

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
from .compressive import CompressiveMemory, append_compressed, evicted_length, split_memory, update_compressive_memory
from .segment import SegmentMemory, update_segment_memory

__all__ = [
    "COMPRESSION_KINDS",
    "CompressiveMemory",
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
