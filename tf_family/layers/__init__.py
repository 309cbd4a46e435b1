"""``nn.Module``s shared by several tf_family models, taking plain numbers (never a config)."""

from .feed_forward import PostNormFeedForward

__all__ = ["PostNormFeedForward"]
