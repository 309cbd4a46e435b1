"""Pure memory math shared by the tf_family models: segment-level recurrence (and, later, compression and kNN)."""

from .segment import SegmentMemory, update_segment_memory

__all__ = ["SegmentMemory", "update_segment_memory"]
