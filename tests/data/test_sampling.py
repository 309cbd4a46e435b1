"""The recipes' batch samplers through accelerate: each process reads its own rows of every step of the packing
schedule, in the schedule's order, across epochs and after ``skip_first_batches``."""

import json

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


def _stream(documents, block_size=8):
    from datasets import Dataset

    from tf_family.data import StreamingBlocks

    rows = Dataset.from_list([{"text": " ".join(map(str, doc))} for doc in documents]).to_iterable_dataset()
    return StreamingBlocks(rows, lambda text: [int(word) for word in text.split()], "text", block_size, 0)


@pytest.mark.parametrize("num_processes", [1, 2])
def test_sequential_steps_give_each_process_its_own_slice_lazily(num_processes):
    from tf_family.data.sampling import SequentialStepSampler

    sampler = SequentialStepSampler(5, 3, num_processes)
    assert len(sampler) == 5 * num_processes
    assert [b for step in sampler.schedule(0) for b in step] == list(range(5 * 3 * num_processes))
    assert [i for batch in sampler for i in batch] == list(range(5 * 3 * num_processes))
    with pytest.raises(ValueError, match="num_steps=0 must be a positive integer"):
        SequentialStepSampler(0, 3)


@pytest.mark.parametrize("num_processes", [1, 2])
def test_a_stream_through_a_prepared_loader_reads_its_blocks_in_order_and_resumes_exactly(num_processes):
    """A prepared loader reads one batch ahead of the loop; `state_after` is the stream's position after the batch
    the loop holds, and a loader resumed from it with ``skip_first_batches`` continues with exactly the blocks an
    uninterrupted one reads (what the causal-LM recipe's --streaming checkpoints rely on)."""
    from tf_family.data.sampling import SequentialStepSampler
    from tf_family.data.streaming import streaming_loader

    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(1, 50, (int(n),), generator=generator).tolist() for n in (5, 17, 1, 9, 30, 4, 22)]
    steps, per_device = 7, 2
    for process in range(num_processes):
        plain = _stream(documents)
        expected = [plain.batch(per_device) for _ in range(steps)]
        loader = prepared(
            streaming_loader(_stream(documents), SequentialStepSampler(steps, per_device, num_processes)),
            num_processes,
            process,
        )
        states = []
        batches = []
        for micro_batch, batch in enumerate(loader):
            batches.append(dict(batch))
            states.append(json.loads(json.dumps(loader.dataset.state_after(micro_batch))))
        assert_same(batches, expected)
        for done in (1, 4, 6):
            stream = _stream(documents)
            stream.load_state_dict(states[done - 1])
            resumed = prepared(
                streaming_loader(stream, SequentialStepSampler(steps, per_device, num_processes)),
                num_processes,
                process,
            )
            assert_same(read(skip_first_batches(resumed, done)), expected[done:])
    with pytest.raises(ValueError, match="position after micro-batch 0 is not kept"):
        loader.dataset.state_after(0)


@pytest.mark.parametrize("num_processes", [1, 2])
def test_decision_transformer_windows_are_a_function_of_micro_batch_and_process(num_processes):
    """`window_loader`: process p's micro-batch i holds the windows drawn with the generator of (i, p), in order,
    and ``skip_first_batches`` resumes on exactly the remaining ones; reading draws nothing from the global state."""
    from tf_family.data.sampling import SequentialStepSampler
    from tf_family.training.offline_rl import window_loader

    class Windows:  # stands in for a TrajectoryWindowSampler: what it draws shows the generator it was given
        def __len__(self):
            return 100

        def sample(self, batch_size, generator):
            return {"ends": torch.randint(0, 100, (batch_size,), generator=generator)}

    def generator_of(micro_batch, rank):
        return torch.Generator().manual_seed(1000 * micro_batch + rank)

    steps, per_device = 6, 3
    for process in range(num_processes):
        expected = [Windows().sample(per_device, generator_of(i, process)) for i in range(steps)]
        loader = prepared(
            window_loader(Windows(), SequentialStepSampler(steps, per_device, num_processes), generator_of),
            num_processes,
            process,
        )
        torch.manual_seed(0)
        state = torch.get_rng_state()
        assert_same(read(loader), expected)
        assert_same(read(skip_first_batches(loader, 4)), expected[4:])
        assert torch.equal(torch.get_rng_state(), state)


def test_sequential_block_loader_reads_blocks_in_order_with_a_short_last_batch():
    from tf_family.data.sampling import sequential_block_loader

    blocks = pack_into_blocks(DOCUMENTS, 8, 0)
    # the batches the kNN-LM recipe read before it had a loader
    expected = [blocks.batch(range(i, min(i + 5, len(blocks)))) for i in range(0, len(blocks), 5)]
    assert_same(read(prepared(sequential_block_loader(blocks, 5), 1, 0)), expected)
    assert_same(read(sequential_block_loader(blocks, 5, num_blocks=7)), [blocks.batch(range(5)), blocks.batch([5, 6])])
    with pytest.raises(ValueError, match="batch_size=0 must be a positive integer"):
        sequential_block_loader(blocks, 0)


def test_prompt_loader_gives_the_slices_calibration_read_before():
    from tf_family.training.early_exit import prompt_loader

    prompts = torch.arange(7 * 4).reshape(7, 4)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    batches = list(prompt_loader(prompts, 3))
    assert [b.tolist() for b in batches] == [prompts[i : i + 3].tolist() for i in range(0, 7, 3)]
    assert torch.equal(torch.get_rng_state(), state)
