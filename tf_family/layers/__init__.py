"""``nn.Module``s shared unchanged by several models; they take plain numbers, never a config."""

from .bert import BertFeedForward

__all__ = ["BertFeedForward"]
