"""The patterns of the local attention kernels, plain frozen dataclasses: `WindowPattern` (which keys a query's
sliding window reaches: Longformer) and `ChunkPattern` (which chunks a chunk attends to: Reformer's local and LSH
attention). They live here, not beside their kernels, because both the chunked kernels and the FlexAttention route
(`flex.py`) read them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WindowPattern:
    """Which keys a query's window reaches.

    Attributes:
        window: one-sided window ``W`` (keys up to ``W`` steps away; a Longformer ``attention_window`` of ``w``
            tokens is ``W = w // 2``).
        dilation: step between window positions (``d`` in the paper, section 3.1); 1 is a contiguous window.
        causal: only keys at or before the query.
    """

    window: int
    dilation: int = 1
    causal: bool = False

    def __post_init__(self):
        if not isinstance(self.window, int) or self.window < 0:
            raise ValueError(f"window must be an int >= 0, got {self.window!r}.")
        if not isinstance(self.dilation, int) or self.dilation < 1:
            raise ValueError(f"dilation must be an int >= 1, got {self.dilation!r}.")


@dataclass(frozen=True)
class ChunkPattern:
    """Which chunks a chunk attends to.

    Attributes:
        chunk_length: ``C``, positions per chunk (per round, in sorted order, for LSH).
        before: chunks before a chunk that it also attends to.
        after: chunks after it that it also attends to.
        causal: only keys at or before the query's position.
        wrap_around: transformers' behaviour (see the module docstring): neighbouring chunks are found with a roll
            over all rounds, and LSH scores use its arithmetic (masked / self-only scores -1e9 / -1e5 in float32 and
            float64, probabilities ``exp(score - lse)``, rounds weighted by ``exp(lse - logsumexp(lse))``; a query with only itself then gets
            ``~0.998 v`` over 2 rounds instead of ``v``). For parity only.
        causal_buckets: LSH only, with ``causal`` (not ``wrap_around``): in each round a query sees the keys of its
            own bucket among the ``before * chunk_length`` slots before it in sorted order (the nearest earlier
            keys of its bucket), instead of whole neighbouring chunks. A later token sorts after every earlier
            token of its bucket, so nothing a query sees depends on later tokens (or on right padding given as
            tokens): outputs are causal in the strict sense, and a row's outputs do not depend on its batch.
    """

    chunk_length: int
    before: int = 1
    after: int = 0
    causal: bool = False
    wrap_around: bool = False
    causal_buckets: bool = False

    def __post_init__(self):
        if self.causal_buckets and (not self.causal or self.wrap_around):
            raise ValueError(
                "causal_buckets needs causal=True and wrap_around=False (it makes causal LSH attention independent "
                "of later tokens; the transformers-compatible chunking is not)."
            )
        if not isinstance(self.chunk_length, int) or self.chunk_length < 1:
            raise ValueError(f"chunk_length must be an int >= 1, got {self.chunk_length!r}.")
        for name in ("before", "after"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"chunks {name} must be an int >= 0, got {getattr(self, name)!r}.")

    @property
    def span(self) -> int:
        """Chunks in a window (``before + 1 + after``)."""
        return self.before + 1 + self.after
