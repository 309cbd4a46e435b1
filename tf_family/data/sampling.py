"""Batch samplers that read the block orders of `tf_family.data.packing` through a `torch.utils.data.DataLoader`
prepared by accelerate.

An epoch is a schedule of global batches: steps × ``num_processes · batch_size`` block indices (`schedule`). The
sampler yields, for every step, process 0's ``batch_size`` rows, then process 1's, and so on. ``accelerator.prepare``
shards a batch sampler by handing process ``p`` the batches ``p, p + n, p + 2n, …`` (accelerate's
``BatchSamplerShard``), so process ``p`` reads rows ``[p · batch_size, (p + 1) · batch_size)`` of every step: row
``r`` of step ``t + 1`` is read by the same process, in the same place, as row ``r`` of step ``t``. That is the
contract the memory models need (Transformer-XL, the Compressive and Memorizing Transformers and SPALM carry one
memory per row between segments), and one process reads exactly what it read before the loader existed.

- `DocumentStreamSampler`: documents laid end to end in ordered rows (`schedule_streams`), for memory models.
- `ShuffledBlockSampler`: independent blocks, shuffled per epoch (`schedule_shuffled_batches`), for the others
  (and for the examples of the encoder recipes, read through `ExampleDataset` and `example_loader`).

The order depends only on ``(seed, epoch)``: the samplers draw nothing from the global random state, so reading data
leaves a model's dropout masks where they were. ``set_epoch`` chooses the epoch; a prepared loader's ``set_epoch``
reaches it (see `StepBatchSampler.sampler`), and ``accelerate.skip_first_batches`` resumes inside an epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Sampler

from .packing import EMPTY_BLOCK, LMBlocks, schedule_shuffled_batches, schedule_streams


class StepBatchSampler(Sampler[list[int]]):
    """Yields each step's global batch of `schedule` as ``num_processes`` consecutive batches of ``batch_size`` block
    indices, process 0's first (see the module docstring for why accelerate's sharding then keeps each process's rows).

    ``whole_steps`` (gradient accumulation) drops the steps of an epoch that do not fill a whole group of that many,
    so that an epoch ends on an optimizer step. Subclasses say what an epoch's global batches are."""

    drop_last = (
        True  # accelerate's BatchSamplerShard reads it: every step gives every process a batch, none is wrapped
    )

    def __init__(self, batch_size: int, num_processes: int = 1, whole_steps: int = 1):
        for name, value in (
            ("batch_size", batch_size),
            ("num_processes", num_processes),
            ("whole_steps", whole_steps),
        ):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be a positive integer.")
        self.batch_size = batch_size
        self.num_processes = num_processes
        self.whole_steps = whole_steps
        self.epoch = 0
        self._steps: tuple[int, list[list[int]]] | None = None  # (epoch, its steps): __len__ and __iter__ share them

    def schedule(self, epoch: int) -> list[list[int]]:
        """Every step of ``epoch``: a global batch of ``num_processes · batch_size`` block indices each."""
        raise NotImplementedError(f"{type(self).__name__} must define schedule(epoch).")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    @property
    def sampler(self) -> StepBatchSampler:
        """The sampler itself: accelerate's ``DataLoaderShard.set_epoch`` passes the epoch on to
        ``batch_sampler.sampler`` and, once the loader is sharded over processes, ``batch_sampler.batch_sampler.sampler``
        (not to ``batch_sampler.batch_sampler``), so this is how a prepared loader's ``set_epoch`` reaches it."""
        return self

    def steps(self) -> list[list[int]]:
        """The current epoch's steps, cut to a whole number of ``whole_steps`` groups."""
        if self._steps is None or self._steps[0] != self.epoch:
            schedule = self.schedule(self.epoch)
            self._steps = (self.epoch, schedule[: len(schedule) - len(schedule) % self.whole_steps])
        return self._steps[1]

    def __len__(self) -> int:
        return len(self.steps()) * self.num_processes

    def __iter__(self) -> Iterator[list[int]]:
        size = self.batch_size
        for step in self.steps():
            for process in range(self.num_processes):
                yield step[process * size : (process + 1) * size]


class DocumentStreamSampler(StepBatchSampler):
    """Documents (their blocks, ``document_blocks`` from `build_document_streams`) laid end to end in
    ``num_processes · batch_size`` rows (`schedule_streams`), in an order fixed by ``(seed, epoch)`` when
    ``shuffle``: each row reads its documents contiguously from step to step, on the same process. A row that has
    run out of documents reads `EMPTY_BLOCK` (scores nothing, resets its memory)."""

    def __init__(
        self,
        document_blocks: Sequence[Sequence[int]],
        batch_size: int,
        num_processes: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        whole_steps: int = 1,
    ):
        super().__init__(batch_size, num_processes, whole_steps)
        self.document_blocks, self.seed, self.shuffle = document_blocks, seed, shuffle

    def schedule(self, epoch: int) -> list[list[int]]:
        return schedule_streams(
            self.document_blocks, self.num_processes * self.batch_size, self.seed, epoch, shuffle=self.shuffle
        )


class ShuffledBlockSampler(StepBatchSampler):
    """``num_blocks`` independent blocks in global batches of ``num_processes · batch_size``
    (`schedule_shuffled_batches`), shuffled by ``(seed, epoch)`` when ``shuffle``; with ``drop_last=False`` the last
    batch is filled with `EMPTY_BLOCK` rows so that every process reads a full batch (evaluation)."""

    def __init__(
        self,
        num_blocks: int,
        batch_size: int,
        num_processes: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        drop_last_batch: bool = True,
        whole_steps: int = 1,
    ):
        super().__init__(batch_size, num_processes, whole_steps)
        self.num_blocks, self.seed, self.shuffle, self.drop_last_batch = num_blocks, seed, shuffle, drop_last_batch

    def schedule(self, epoch: int) -> list[list[int]]:
        return schedule_shuffled_batches(
            self.num_blocks,
            self.num_processes * self.batch_size,
            self.seed,
            epoch,
            shuffle=self.shuffle,
            drop_last=self.drop_last_batch,
        )


class SequentialStepSampler(StepBatchSampler):
    """``num_steps`` steps of consecutive indices (step ``t``: ``[t · n · batch_size, (t + 1) · n · batch_size)``, in
    the processes' slices), yielded without building the schedule: micro-batches whose indices only count them and
    name the process reading them (a training stream, `tf_family.data.streaming.StreamingBatchDataset`; the
    Decision Transformer's random windows, `tf_family.training.offline_rl.WindowBatchDataset`)."""

    def __init__(self, num_steps: int, batch_size: int, num_processes: int = 1):
        super().__init__(batch_size, num_processes)
        if not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps={num_steps!r} must be a positive integer.")
        self.num_steps = num_steps

    def schedule(self, epoch: int) -> list[list[int]]:
        rows = self.num_processes * self.batch_size
        return [list(range(step * rows, (step + 1) * rows)) for step in range(self.num_steps)]

    def __len__(self) -> int:
        return self.num_steps * self.num_processes

    def __iter__(self) -> Iterator[list[int]]:
        rows = self.num_processes * self.batch_size
        for step in range(self.num_steps):
            for process in range(self.num_processes):
                start = step * rows + process * self.batch_size
                yield list(range(start, start + self.batch_size))


class BlockDataset(torch.utils.data.Dataset):
    """`LMBlocks` as a map-style dataset read a batch at a time: ``__getitems__`` (which a `DataLoader` calls with a
    sampler's batch of indices) returns `LMBlocks.batch` of them (`EMPTY_BLOCK` included), the tensors the recipe
    used before it read through a loader; use it with ``collate_fn=keep_batch``."""

    def __init__(self, blocks: LMBlocks):
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: rows[0] for name, rows in self.blocks.batch([index]).items()}

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        return self.blocks.batch(indices)


def keep_batch(batch: Any) -> Any:
    """The ``collate_fn`` of a `BlockDataset` loader: the batch `BlockDataset.__getitems__` built, as it is."""
    return batch


def block_loader(blocks: LMBlocks, sampler: StepBatchSampler) -> torch.utils.data.DataLoader:
    """A `DataLoader` reading ``blocks`` in ``sampler``'s order, for ``accelerator.prepare``. Its own generator
    (seeded, never drawn from for the order) gives the loader's worker seed, which a loader otherwise draws from the
    global random state: reading data then leaves the model's dropout masks where they were."""
    return torch.utils.data.DataLoader(
        BlockDataset(blocks), batch_sampler=sampler, collate_fn=keep_batch, generator=torch.Generator().manual_seed(0)
    )


def sequential_block_loader(
    blocks: LMBlocks, batch_size: int, num_blocks: int | None = None
) -> torch.utils.data.DataLoader:
    """A `DataLoader` reading the first ``num_blocks`` of ``blocks`` (all when None) in order, ``batch_size`` at a
    time (the last batch shorter), each batch `LMBlocks.batch` of its indices: for reading a split once, as the kNN-LM
    recipe's datastore and grid do. Its own seeded generator, as `block_loader`'s, leaves the global random state
    alone."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be a positive integer.")
    count = len(blocks) if num_blocks is None else min(num_blocks, len(blocks))
    return torch.utils.data.DataLoader(
        BlockDataset(blocks),
        batch_size=batch_size,
        sampler=range(count),
        collate_fn=keep_batch,
        generator=torch.Generator().manual_seed(0),
    )


class ExampleDataset(torch.utils.data.Dataset):
    """``num_examples`` examples read a batch at a time: ``__getitems__`` (which a `DataLoader` calls with a
    sampler's batch of indices) returns ``collate(indices, epoch)`` of the indices that are not `EMPTY_BLOCK`, with
    those indices as ``example_index`` (a tensor), or an empty dict when none is (the filler of a last evaluation
    batch). ``epoch`` is the one given to ``set_epoch`` (a masked LM draws its masks from it); a prepared loader
    passes its epoch on to its dataset only in one process, so the reader sets both
    (`tf_family.training.encoder.epoch_batches`). Use it with ``collate_fn=keep_batch``."""

    def __init__(self, num_examples: int, collate: Callable[[list[int], int], dict[str, torch.Tensor]]):
        self.num_examples, self.collate, self.epoch = num_examples, collate, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_examples

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return self.__getitems__([index])

    def __getitems__(self, indices: list[int]) -> dict[str, torch.Tensor]:
        indices = [i for i in indices if i != EMPTY_BLOCK]
        if not indices:
            return {}
        return {**self.collate(indices, self.epoch), "example_index": torch.tensor(indices, dtype=torch.long)}


def example_loader(dataset: ExampleDataset, sampler: StepBatchSampler) -> torch.utils.data.DataLoader:
    """A `DataLoader` reading ``dataset`` in ``sampler``'s order, for ``accelerator.prepare`` (its own generator, as
    in `block_loader`, so that reading leaves the global random state alone)."""
    return torch.utils.data.DataLoader(
        dataset, batch_sampler=sampler, collate_fn=keep_batch, generator=torch.Generator().manual_seed(0)
    )


__all__ = [
    "EMPTY_BLOCK",
    "BlockDataset",
    "DocumentStreamSampler",
    "ExampleDataset",
    "ShuffledBlockSampler",
    "StepBatchSampler",
    "SequentialStepSampler",
    "block_loader",
    "example_loader",
    "keep_batch",
    "sequential_block_loader",
]
