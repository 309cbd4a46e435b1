"""Language-modelling blocks packed on the fly from a text stream too large to hold: a `datasets.IterableDataset`.

`StreamingBlocks` reads documents one at a time, tokenizes them, and cuts ``[sep] d1 [sep] d2 [sep] …`` into blocks of
``T`` inputs with aligned next-token labels: the blocks `packing.pack_into_blocks` would give for the same documents,
in stream order, without ever holding more than one document and one block. When the stream ends it starts again
(the next epoch, `IterableDataset.set_epoch`), continuing the same token stream.

Resumable: `state_dict` records how far the stream was read (`IterableDataset.state_dict`, which counts the
documents taken from it) and the tokens read but not yet given out; `load_state_dict` continues from there, so a run
resumed from a checkpoint sees exactly the blocks an uninterrupted run would have seen.

`StreamingBatchDataset` and `streaming_loader` read a stream through a `torch.utils.data.DataLoader` prepared by
accelerate: a `SequentialStepSampler` (`tf_family.data.sampling`) names each process's micro-batches, and the dataset
answers each with the stream's next blocks, recording where the stream stood after it (`state_after`), since a
prepared loader reads one batch ahead of the one the loop holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..modeling.losses import IGNORE_INDEX


class StreamingBlocks:
    """Blocks of ``block_size`` tokens, packed on the fly from the ``text_column`` of ``dataset``.

    Args:
        dataset: a `datasets.IterableDataset` (``load_dataset(..., streaming=True)``, or
            ``Dataset.to_iterable_dataset()``), already split for this process (`split_dataset_by_node`).
        tokenize: text -> token ids (no special tokens).
        text_column: the column holding the text.
        block_size: input tokens per block (``T``).
        separator_id: the token joining documents (and starting the stream).
    """

    def __init__(
        self,
        dataset,
        tokenize: Callable[[str], list[int]],
        text_column: str,
        block_size: int,
        separator_id: int,
    ):
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size={block_size!r} must be a positive integer.")
        self.dataset, self.tokenize, self.text_column = dataset, tokenize, text_column
        self.block_size, self.separator_id = block_size, separator_id
        self.buffer: list[int] = [separator_id]  # tokens read and not yet given out as inputs
        self.epoch = 0
        self.documents_read = 0
        self.tokens_read = 0
        self._iterator = None

    def _next_document(self) -> list[int]:
        """The next document's tokens; at the end of the stream the next epoch begins."""
        restarted = False
        while True:
            if self._iterator is None:
                self.dataset.set_epoch(self.epoch)
                self._iterator = iter(self.dataset)
            try:
                row = next(self._iterator)
            except StopIteration:
                if restarted or self.documents_read == 0:
                    raise ValueError(
                        "the training stream has no documents; check --train_file / --dataset_name."
                    ) from None
                self.epoch, self._iterator, restarted = self.epoch + 1, None, True
                continue
            if self.text_column not in row:
                raise ValueError(f"--text_column={self.text_column!r} is not a column of the stream ({list(row)}).")
            tokens = list(self.tokenize(row[self.text_column]))
            self.documents_read += 1
            self.tokens_read += len(tokens)
            return tokens

    def next_block(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(input_ids (T,), labels (T,))``: the next ``T`` tokens of the stream and the ones after each."""
        while len(self.buffer) < self.block_size + 1:
            self.buffer += [*self._next_document(), self.separator_id]
        block = torch.tensor(self.buffer[: self.block_size + 1], dtype=torch.long)
        self.buffer = self.buffer[self.block_size :]  # the last target is the next block's first input
        return block[:-1], block[1:]

    def batch(self, rows: int) -> dict[str, torch.Tensor]:
        """The next ``rows`` blocks as a batch: ``input_ids`` and ``labels`` ``(rows, T)``, ``reset`` ``(rows,)``
        (True: blocks are independent), as `LMBlocks.batch` gives."""
        blocks = [self.next_block() for _ in range(rows)]
        input_ids = torch.stack([inputs for inputs, _ in blocks]) if blocks else torch.zeros(0, self.block_size)
        labels = (
            torch.stack([targets for _, targets in blocks]) if blocks else torch.full_like(input_ids, IGNORE_INDEX)
        )
        return {"input_ids": input_ids.long(), "labels": labels.long(), "reset": torch.ones(rows, dtype=torch.bool)}

    def state_dict(self) -> dict[str, Any]:
        """How far the stream was read (JSON-serialisable): the dataset's position, the epoch, the tokens read but
        not given out, and the counts."""
        dataset_state = self.dataset.state_dict() if self._iterator is not None else None
        return {
            "dataset": dataset_state,
            "epoch": self.epoch,
            "buffer": list(self.buffer),
            "documents_read": self.documents_read,
            "tokens_read": self.tokens_read,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict`: the next block is the one that followed when it was taken."""
        self.epoch, self.buffer = int(state["epoch"]), [int(token) for token in state["buffer"]]
        self.documents_read, self.tokens_read = int(state["documents_read"]), int(state["tokens_read"])
        self._iterator = None
        if state["dataset"] is not None:
            self.dataset.set_epoch(self.epoch)
            self.dataset.load_state_dict(state["dataset"])
            self._iterator = iter(self.dataset)


class StreamingBatchDataset(torch.utils.data.Dataset):
    """`StreamingBlocks` read a batch at a time by a `DataLoader` over a `SequentialStepSampler`: ``__getitems__`` (which a
    loader calls with a sampler's batch of indices) returns the stream's next ``len(indices)`` blocks
    (`StreamingBlocks.batch`), whatever the indices, which only name the micro-batch (``indices[0] // step_rows``).

    The stream is read in order, so its loader must neither shuffle nor skip by reading: ``skip_first_batches``
    skips a sampler's batches without fetching them, and a resumed run restores the stream (`load_state_dict`)
    instead. After each micro-batch it records the stream's `state_dict` (`state_after`): a checkpoint saves the
    position after the micro-batch the loop last trained on, not after the one the loader has already read ahead.

    Args:
        stream: this process's `StreamingBlocks`.
        step_rows: the rows of one step over all processes (``num_processes · batch_size``), as the sampler counts.
    """

    def __init__(self, stream: StreamingBlocks, step_rows: int):
        if not isinstance(step_rows, int) or step_rows < 1:
            raise ValueError(f"step_rows={step_rows!r} must be a positive integer.")
        self.stream, self.step_rows = stream, step_rows
        self._states: dict[int, dict[str, Any]] = {}  # micro-batch -> the stream's state after it (the last few)

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        micro_batch = indices[0] // self.step_rows
        batch = self.stream.batch(len(indices))
        self._states[micro_batch] = self.stream.state_dict()
        for old in [index for index in self._states if index < micro_batch - 2]:
            del self._states[old]
        return batch

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: rows[0] for name, rows in self.__getitems__([index]).items()}

    def state_after(self, micro_batch: int) -> dict[str, Any]:
        """The stream's `StreamingBlocks.state_dict` just after ``micro_batch`` was read (for a checkpoint)."""
        if micro_batch not in self._states:
            raise ValueError(
                f"the stream's position after micro-batch {micro_batch} is not kept (kept: {sorted(self._states)}); "
                "a checkpoint must follow the micro-batch it records."
            )
        return self._states[micro_batch]


def streaming_loader(stream: StreamingBlocks, sampler) -> torch.utils.data.DataLoader:
    """A `DataLoader` reading ``stream`` in ``sampler``'s micro-batches (a `SequentialStepSampler`), for
    ``accelerator.prepare``; its own seeded generator, as `tf_family.data.sampling.block_loader`'s, leaves the global
    random state alone."""
    from .sampling import keep_batch

    dataset = StreamingBatchDataset(stream, sampler.num_processes * sampler.batch_size)
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=keep_batch, generator=torch.Generator().manual_seed(0)
    )


__all__ = ["StreamingBatchDataset", "StreamingBlocks", "streaming_loader"]
