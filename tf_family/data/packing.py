"""Turn tokenized documents into fixed-length language-modelling blocks and the order they are visited in.

Two layouts, both scoring every token of every document exactly once (plus one end-of-document prediction):

- `pack_into_blocks`: documents joined by a separator into one stream and cut into blocks of ``T`` tokens, for
  models without memory (blocks are independent and can be shuffled: `schedule_shuffled_batches`).
- `build_document_streams` + `schedule_streams`: each document cut into its own blocks (the last one padded), and
  documents laid end to end in ``R`` ordered rows, for memory models (Transformer-XL, Compressive, Memorizing): row
  ``r`` of step ``i + 1`` continues row ``r`` of step ``i``, so the memory can be carried from step to step, and a
  block that starts a document tells the model to reset that row's memory. Because no block spans two documents,
  the reset is exact. Padding costs on average half a block per document.

Targets are the next token (``labels[t] = token[t + 1]``), already aligned: a loss is
``cross_entropy(logits, labels, ignore_index=-100)`` with no shift, so the first token of a block is scored too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..modeling.losses import IGNORE_INDEX

EMPTY_BLOCK = -1  # schedule entry for a row that has run out of documents


@dataclass
class LMBlocks:
    """Blocks of ``block_size`` input tokens with aligned next-token ``labels``.

    Attributes:
        input_ids: ``(N, T)`` token ids (padding uses the separator id).
        labels: ``(N, T)`` next-token targets, ``-100`` where nothing is scored.
        starts_document: ``(N,)`` True where a block begins a new document (memory models reset there).
        pad_token_id: the id used for padding and for empty blocks.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    starts_document: torch.Tensor
    pad_token_id: int

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    @property
    def block_size(self) -> int:
        return self.input_ids.shape[1]

    @property
    def num_targets(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """Rows ``indices`` as a batch; `EMPTY_BLOCK` gives a padding row that scores nothing and resets memory."""
        index = torch.as_tensor(list(indices), dtype=torch.long)
        empty = index == EMPTY_BLOCK
        safe = index.clamp(min=0)
        input_ids = self.input_ids[safe].masked_fill(empty[:, None], self.pad_token_id)
        labels = self.labels[safe].masked_fill(empty[:, None], IGNORE_INDEX)
        reset = self.starts_document[safe] | empty
        return {"input_ids": input_ids, "labels": labels, "reset": reset}


def _check(block_size: int, separator_id: int) -> None:
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be a positive integer.")
    if not isinstance(separator_id, int) or separator_id < 0:
        raise ValueError(f"separator_id={separator_id!r} must be a token id (a non-negative integer).")


def _blocks_of(sequence: torch.Tensor, block_size: int, pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cut ``sequence`` (inputs followed by one extra target) into padded (inputs, labels) blocks."""
    inputs, targets = sequence[:-1], sequence[1:]
    num_blocks = -(-inputs.numel() // block_size)
    padded = num_blocks * block_size
    input_ids = torch.full((padded,), pad_token_id, dtype=torch.long)
    labels = torch.full((padded,), IGNORE_INDEX, dtype=torch.long)
    input_ids[: inputs.numel()] = inputs
    labels[: targets.numel()] = targets
    return input_ids.view(num_blocks, block_size), labels.view(num_blocks, block_size)


def pack_into_blocks(documents: Sequence[Sequence[int]], block_size: int, separator_id: int) -> LMBlocks:
    """``[sep] d1 [sep] d2 [sep] …`` cut into blocks of ``block_size`` inputs; the last block is padded."""
    _check(block_size, separator_id)
    pieces = [torch.tensor([separator_id], dtype=torch.long)]
    for document in documents:
        pieces += [torch.as_tensor(list(document), dtype=torch.long), torch.tensor([separator_id], dtype=torch.long)]
    stream = torch.cat(pieces)
    if stream.numel() < 2:
        raise ValueError("no tokens to pack: every document is empty.")
    input_ids, labels = _blocks_of(stream, block_size, separator_id)
    starts = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    starts[0] = True
    return LMBlocks(input_ids, labels, starts, separator_id)


def build_document_streams(
    documents: Sequence[Sequence[int]], block_size: int, separator_id: int
) -> tuple[LMBlocks, list[list[int]]]:
    """Each document as ``[sep] tokens [sep]`` cut into its own blocks; returns the blocks and each document's
    block indices (empty documents get none)."""
    _check(block_size, separator_id)
    all_inputs, all_labels, starts, document_blocks = [], [], [], []
    count = 0
    for document in documents:
        tokens = list(document)
        if not tokens:
            document_blocks.append([])
            continue
        sequence = torch.as_tensor([separator_id, *tokens, separator_id], dtype=torch.long)
        input_ids, labels = _blocks_of(sequence, block_size, separator_id)
        all_inputs.append(input_ids)
        all_labels.append(labels)
        flags = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        flags[0] = True
        starts.append(flags)
        document_blocks.append(list(range(count, count + input_ids.shape[0])))
        count += input_ids.shape[0]
    if count == 0:
        raise ValueError("no tokens to pack: every document is empty.")
    blocks = LMBlocks(torch.cat(all_inputs), torch.cat(all_labels), torch.cat(starts), separator_id)
    return blocks, document_blocks


def schedule_shuffled_batches(
    num_blocks: int, global_batch_size: int, seed: int, epoch: int = 0, shuffle: bool = True, drop_last: bool = True
) -> list[list[int]]:
    """Global batches of block indices for one epoch, in an order fixed by ``(seed, epoch)``.

    With ``drop_last=False`` the last batch is filled with `EMPTY_BLOCK` so that every process gets a full batch.
    """
    if global_batch_size < 1:
        raise ValueError(f"global_batch_size={global_batch_size} must be at least 1.")
    if shuffle:
        order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    else:
        order = list(range(num_blocks))
    batches = [order[i : i + global_batch_size] for i in range(0, num_blocks, global_batch_size)]
    if batches and len(batches[-1]) < global_batch_size:
        if drop_last:
            batches.pop()
        else:
            batches[-1] += [EMPTY_BLOCK] * (global_batch_size - len(batches[-1]))
    return batches


def schedule_streams(
    document_blocks: Sequence[Sequence[int]], num_rows: int, seed: int, epoch: int = 0, shuffle: bool = True
) -> list[list[int]]:
    """Lay documents end to end in ``num_rows`` ordered rows; returns steps × rows of block indices.

    Documents (in an order fixed by ``(seed, epoch)`` when ``shuffle``) go one by one to the row with the fewest
    blocks so far, which keeps the rows within one document of each other in length. A row that runs out of
    documents is filled with `EMPTY_BLOCK`.
    """
    if num_rows < 1:
        raise ValueError(f"num_rows={num_rows} must be at least 1.")
    order = list(range(len(document_blocks)))
    if shuffle:
        order = torch.randperm(len(order), generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    rows: list[list[int]] = [[] for _ in range(num_rows)]
    for document in order:
        if document_blocks[document]:
            shortest = min(range(num_rows), key=lambda r: (len(rows[r]), r))
            rows[shortest].extend(document_blocks[document])
    steps = max(len(row) for row in rows)
    return [[row[i] if i < len(row) else EMPTY_BLOCK for row in rows] for i in range(steps)]


__all__ = [
    "EMPTY_BLOCK",
    "IGNORE_INDEX",
    "LMBlocks",
    "build_document_streams",
    "pack_into_blocks",
    "schedule_shuffled_batches",
    "schedule_streams",
]
