"""Pure attention math shared by the tf_family models: the one dispatch (`attend`), masks, relative positions, dense
reference attention, the sparse kernels.

Nothing here is an ``nn.Module`` or reads a config; every function takes tensors and plain numbers, and every fast
path has a slow, obviously-correct twin that a test compares it against.

Shape vocabulary used in every shape comment of the package:

    B  batch                 H  heads               T  query length        S  key length (incl. memory)
    M  memory length         C  compressed memory   D  model width         Dh head width
    W  one-sided window      K  top-k or blocks     L  layers              R  relative positions
    G  global tokens         N  query chunks / blocks
    (lsh.py, Reformer: C chunk length, R hashing rounds)
"""

from . import flex
from .backend import (
    IMPLEMENTATIONS,
    attend,
    attention_backend,
    preferred_chunk,
    takes_masked_attention,
)
from .block_sparse import (
    block_sparse_attention,
    block_sparse_attention_reference,
    build_block_sparse_counts,
    layer_seed,
    min_sparse_blocks,
    random_block_indices,
)
from .dense import dense_attention
from .dropout import dropout, dropout_mask
from .lsh import (
    ChunkPattern,
    auto_num_buckets,
    bucket_factors,
    build_chunked_local_mask,
    cached_chunked_local_attention,
    cached_shared_qk_attention,
    chunked_local_attention,
    chunked_local_attention_reference,
    hash_vectors,
    lsh_attention,
    lsh_attention_reference,
    lsh_meeting_counts,
    lsh_rotations,
    normalize_shared_keys,
    shared_qk_attention,
)
from .masked import masked_attention, masked_attention_reference
from .masks import build_causal_memory_mask, build_key_padding_mask
from .native import fused_attention, fused_keep_mask
from .relative import (
    cached_position_embedding,
    rel_shift,
    rel_shift_reference,
    relative_attention_scores,
    relative_position_scores,
    relative_position_sequence,
    segment_position_embedding,
    sinusoid_position_embedding,
)
from .sliding_window import (
    GlobalTokens,
    WindowPattern,
    build_global_query_mask,
    build_sliding_window_mask,
    global_attention,
    global_attention_reference,
    sliding_window_attention,
    sliding_window_attention_reference,
)

__all__ = [
    "ChunkPattern",
    "GlobalTokens",
    "IMPLEMENTATIONS",
    "WindowPattern",
    "attend",
    "attention_backend",
    "auto_num_buckets",
    "block_sparse_attention",
    "block_sparse_attention_reference",
    "bucket_factors",
    "build_block_sparse_counts",
    "build_causal_memory_mask",
    "build_chunked_local_mask",
    "build_global_query_mask",
    "build_key_padding_mask",
    "build_sliding_window_mask",
    "cached_chunked_local_attention",
    "cached_shared_qk_attention",
    "chunked_local_attention",
    "chunked_local_attention_reference",
    "dense_attention",
    "dropout",
    "dropout_mask",
    "fused_attention",
    "flex",
    "fused_keep_mask",
    "global_attention",
    "global_attention_reference",
    "hash_vectors",
    "lsh_attention",
    "lsh_attention_reference",
    "lsh_meeting_counts",
    "lsh_rotations",
    "masked_attention",
    "masked_attention_reference",
    "min_sparse_blocks",
    "normalize_shared_keys",
    "preferred_chunk",
    "random_block_indices",
    "rel_shift",
    "rel_shift_reference",
    "relative_attention_scores",
    "relative_position_scores",
    "cached_position_embedding",
    "segment_position_embedding",
    "relative_position_sequence",
    "layer_seed",
    "shared_qk_attention",
    "sinusoid_position_embedding",
    "sliding_window_attention",
    "sliding_window_attention_reference",
    "takes_masked_attention",
]
