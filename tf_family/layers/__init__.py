"""`nn.Module`s shared unchanged by several models; they take plain numbers, never a config."""

from .adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax
from .bert import BertFeedForward
from .feed_forward import PositionwiseFeedForward
from .relative_attention import RelativeDecoderLayer, RelativeMultiHeadAttention
from .reversible import reversible_stack

__all__ = [
    "AdaptiveEmbedding",
    "BertFeedForward",
    "PositionwiseFeedForward",
    "ProjectedAdaptiveLogSoftmax",
    "reversible_stack",
    "RelativeDecoderLayer",
    "RelativeMultiHeadAttention",
]
