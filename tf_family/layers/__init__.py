"""`nn.Module`s shared unchanged by several models; they take plain numbers, never a config."""

from .adaptive import AdaptiveEmbedding, ProjectedAdaptiveLogSoftmax
from .bert import BertFeedForward
from .feed_forward import PositionwiseFeedForward
from .relative_attention import RelativeDecoderLayer, RelativeMultiHeadAttention
from .reversible import ReversibleChain, reversible_layer, reversible_stack

__all__ = [
    "AdaptiveEmbedding",
    "BertFeedForward",
    "PositionwiseFeedForward",
    "ProjectedAdaptiveLogSoftmax",
    "ReversibleChain",
    "reversible_layer",
    "reversible_stack",
    "RelativeDecoderLayer",
    "RelativeMultiHeadAttention",
]
