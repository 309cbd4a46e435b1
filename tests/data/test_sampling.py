"""The recipes' batch samplers through accelerate: each process reads its own rows of every step of the packing
schedule, in the schedule's order, across epochs and after ``skip_first_batches``."""

import pytest
import torch
from accelerate import PartialState, skip_first_batches
from accelerate.data_loader import prepare_data_loader

from tf_family.data import build_document_streams, pack_into_blocks, schedule_shuffled_batches, schedule_streams
from tf_family.data.packing import EMPTY_BLOCK
from tf_family.data.sampling import (
    DocumentStreamSampler,
    ExampleDataset,
    ShuffledBlockSampler,
    block_loader,
    example_loader,
)

DOCUMENTS = [list(range(1, 1 + n)) for n in (40, 7, 0, 23, 61, 3, 18, 30, 12)]


def rows_of(global_batch: list[int], process: int, per_device: int) -> list[int]:
    """What process ``process`` read of a global batch before the recipes had loaders."""
    return global_batch[process * per_device : (process + 1) * per_device]


def expected_batches(blocks, schedule, process: int, per_device: int) -> list[dict[str, torch.Tensor]]:
    return [blocks.batch(rows_of(step, process, per_device)) for step in schedule]


def read(loader) -> list[dict[str, torch.Tensor]]:
    return [dict(batch) for batch in loader]


def assert_same(actual, expected):
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected, strict=True):
        assert got.keys() == want.keys()
        assert all(torch.equal(got[key], want[key]) for key in want)


def prepared(loader, num_processes: int, process: int):
    PartialState()  # accelerate's process state (one process here); the shard is chosen explicitly
    return prepare_data_loader(loader, num_processes=num_processes, process_index=process, put_on_device=True)


@pytest.mark.parametrize("num_processes", [1, 2, 3])
@pytest.mark.parametrize("whole_steps", [1, 2])
def test_document_streams_keep_each_process_rows_in_the_schedule_order(num_processes, whole_steps):
    blocks, document_blocks = build_document_streams(DOCUMENTS, 8, 0)
    per_device = 2
    for process in range(num_processes):
        sampler = DocumentStreamSampler(document_blocks, per_device, num_processes, seed=5, whole_steps=whole_steps)
        loader = prepared(block_loader(blocks, sampler), num_processes, process)
        for epoch in (0, 1, 3):
            loader.set_epoch(epoch)
            schedule = schedule_streams(document_blocks, num_processes * per_device, 5, epoch)
            schedule = schedule[: len(schedule) - len(schedule) % whole_steps]
            expected = expected_batches(blocks, schedule, process, per_device)
            assert len(loader) == len(schedule)
            # resumed two steps into the epoch (as the recipe does: right after set_epoch): the same batches from there
            assert_same(read(skip_first_batches(loader, 2)), expected[2:])
            assert_same(read(loader), expected)
        orders = {
            tuple(map(tuple, schedule_streams(document_blocks, num_processes * per_device, 5, e))) for e in (0, 1)
        }
        assert len(orders) == 2  # the epochs differ: the comparison above can fail


def test_each_row_continues_its_documents_on_the_same_process():
    """Row r of step t+1 reads the block after row r of step t (or starts a document / is empty)."""
    blocks, document_blocks = build_document_streams(DOCUMENTS, 8, 0)
    for process in range(2):
        sampler = DocumentStreamSampler(document_blocks, 2, 2, seed=1)
        batches = read(prepared(block_loader(blocks, sampler), 2, process))
        indices = [rows_of(step, process, 2) for step in sampler.schedule(0)]
        for before, after, batch in zip(indices, indices[1:], batches[1:], strict=False):
            for row, (previous, current) in enumerate(zip(before, after, strict=True)):
                if current != EMPTY_BLOCK and not blocks.starts_document[current]:
                    assert current == previous + 1
                    assert not batch["reset"][row]


@pytest.mark.parametrize("num_processes", [1, 2])
def test_shuffled_blocks_and_padded_evaluation_batches(num_processes):
    blocks = pack_into_blocks(DOCUMENTS, 8, 0)
    for process in range(num_processes):
        train = ShuffledBlockSampler(len(blocks), 3, num_processes, seed=7, whole_steps=2)
        loader = prepared(block_loader(blocks, train), num_processes, process)
        loader.set_epoch(2)
        schedule = schedule_shuffled_batches(len(blocks), 3 * num_processes, 7, 2)
        schedule = schedule[: len(schedule) - len(schedule) % 2]
        assert_same(read(loader), expected_batches(blocks, schedule, process, 3))

        evaluation = ShuffledBlockSampler(len(blocks), 4, num_processes, shuffle=False, drop_last_batch=False)
        loader = prepared(block_loader(blocks, evaluation), num_processes, process)
        schedule = schedule_shuffled_batches(len(blocks), 4 * num_processes, 0, shuffle=False, drop_last=False)
        batches = read(loader)
        assert_same(batches, expected_batches(blocks, schedule, process, 4))
        assert all(batch["input_ids"].shape == (4, 8) for batch in batches)  # the last one padded, not short


@pytest.mark.parametrize("num_processes", [1, 2])
def test_examples_are_read_once_per_epoch_with_their_indices_and_epoch(num_processes):
    """The encoder recipes' loaders: ``collate`` sees each process's real indices of every step (filler dropped)
    and the epoch set on the dataset; a process whose part of the last evaluation step is all filler reads ``{}``."""

    def collate(indices, epoch):
        return {"value": torch.tensor(indices) * 10 + epoch}

    for process in range(num_processes):
        dataset = ExampleDataset(11, collate)
        train = ShuffledBlockSampler(11, 2, num_processes, seed=5, whole_steps=2)
        loader = prepared(example_loader(dataset, train), num_processes, process)
        loader.set_epoch(3)
        dataset.set_epoch(3)
        schedule = schedule_shuffled_batches(11, 2 * num_processes, 5, 3)
        schedule = schedule[: len(schedule) - len(schedule) % 2]
        batches = read(loader)
        assert [batch["example_index"].tolist() for batch in batches] == [rows_of(s, process, 2) for s in schedule]
        assert all(torch.equal(b["value"], b["example_index"] * 10 + 3) for b in batches)

        evaluation = ShuffledBlockSampler(8, 3, num_processes, shuffle=False, drop_last_batch=False)
        batches = read(prepared(example_loader(ExampleDataset(8, collate), evaluation), num_processes, process))
        schedule = schedule_shuffled_batches(8, 3 * num_processes, 0, shuffle=False, drop_last=False)
        expected = [[i for i in rows_of(s, process, 3) if i != EMPTY_BLOCK] for s in schedule]
        assert [batch["example_index"].tolist() if batch else [] for batch in batches] == expected
    if num_processes == 2:
        assert batches[-1] == {}  # process 1's rows of the last step (examples 9 .. 11 of 8) are all filler


def test_reading_data_draws_nothing_from_the_global_random_state():
    blocks, document_blocks = build_document_streams(DOCUMENTS, 8, 0)
    loader = prepared(block_loader(blocks, DocumentStreamSampler(document_blocks, 2, seed=3)), 1, 0)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    read(loader)
    read(skip_first_batches(loader, 1))
    assert torch.equal(torch.get_rng_state(), state)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="batch_size=0 must be a positive integer"):
        ShuffledBlockSampler(10, 0)
    with pytest.raises(ValueError, match="whole_steps=0 must be a positive integer"):
        DocumentStreamSampler([[0]], 1, whole_steps=0)
