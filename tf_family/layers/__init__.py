"""`nn.Module`s shared unchanged by several models; they take plain numbers, never a config (a ``from_config``
classmethod reads one for them). `xl_scaffold` holds the functions the Transformer-XL family's models call from
their own ``__init__`` and ``forward`` (builders and forward steps, which read their model's config)."""

from .adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax
from .bert import BertFeedForward
from .feed_forward import PositionwiseFeedForward
from .relative_attention import RelativeAttentionInputs, RelativeDecoderLayer, RelativeMultiHeadAttention
from .reversible import ReversibleChain, reversible_layer, reversible_stack

__all__ = [
    "AdaptiveEmbedding",
    "BertFeedForward",
    "PositionwiseFeedForward",
    "ProjectedAdaptiveLogSoftmax",
    "ReversibleChain",
    "reversible_layer",
    "reversible_stack",
    "RelativeAttentionInputs",
    "RelativeDecoderLayer",
    "RelativeMultiHeadAttention",
]
