"""Blocks and schedules: every token scored once, streams contiguous, resets exactly at document starts."""

import json

import pytest
import torch

from tf_family.data.packing import (
    EMPTY_BLOCK,
    IGNORE_INDEX,
    build_document_streams,
    pack_into_blocks,
    schedule_shuffled_batches,
    schedule_streams,
)

SEP = 0


def test_pack_into_blocks_hand_computed():
    blocks = pack_into_blocks([[1, 2, 3], [4, 5]], block_size=3, separator_id=SEP)
    # stream: 0 1 2 3 0 4 5 0 -> inputs 0 1 2 | 3 0 4 | 5 (pad pad); targets 1 2 3 | 0 4 5 | 0 (ignored)
    assert blocks.input_ids.tolist() == [[0, 1, 2], [3, 0, 4], [5, 0, 0]]
    assert blocks.labels.tolist() == [[1, 2, 3], [0, 4, 5], [0, IGNORE_INDEX, IGNORE_INDEX]]
    assert blocks.num_targets == 7  # 5 tokens + 2 end-of-document predictions


def test_document_streams_hand_computed():
    blocks, per_document = build_document_streams([[1, 2, 3, 4], [], [5]], block_size=3, separator_id=SEP)
    # doc 0: 0 1 2 3 4 0 -> inputs 0 1 2 | 3 4 (pad); doc 2: 0 5 0 -> inputs 0 5 (pad)
    assert blocks.input_ids.tolist() == [[0, 1, 2], [3, 4, 0], [0, 5, 0]]
    assert blocks.labels.tolist() == [[1, 2, 3], [4, 0, IGNORE_INDEX], [5, 0, IGNORE_INDEX]]
    assert blocks.starts_document.tolist() == [True, False, True]
    assert per_document == [[0, 1], [], [2]]


def test_streams_keep_documents_contiguous_and_reset_at_their_starts():
    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(1, 50, (int(n),), generator=generator).tolist() for n in torch.randint(1, 40, (9,))]
    blocks, per_document = build_document_streams(documents, block_size=4, separator_id=SEP)
    schedule = schedule_streams(per_document, num_rows=3, seed=1)
    seen = []
    for row in range(3):
        indices = [step[row] for step in schedule]
        # each row reads whole documents in order: the blocks of a document are consecutive steps
        real = [i for i in indices if i != EMPTY_BLOCK]
        assert real == sorted(real, key=lambda i: real.index(i))
        for document in per_document:
            if document and document[0] in real:
                start = real.index(document[0])
                assert real[start : start + len(document)] == document
        batch = blocks.batch(indices)
        assert batch["reset"].tolist() == [i == EMPTY_BLOCK or bool(blocks.starts_document[i]) for i in indices]
        seen += real
    assert sorted(seen) == list(range(len(blocks)))  # every block exactly once
    assert len(schedule) <= max(len(d) for d in per_document) + len(blocks) // 3 + 1  # rows are balanced


def test_schedules_are_fixed_by_seed_and_epoch():
    assert schedule_shuffled_batches(10, 4, seed=3, epoch=1) == schedule_shuffled_batches(10, 4, seed=3, epoch=1)
    assert schedule_shuffled_batches(10, 4, seed=3, epoch=1) != schedule_shuffled_batches(10, 4, seed=3, epoch=2)
    assert len(schedule_shuffled_batches(10, 4, seed=0)) == 2  # the incomplete batch is dropped in training
    last = schedule_shuffled_batches(10, 4, seed=0, shuffle=False, drop_last=False)[-1]
    assert last == [8, 9, EMPTY_BLOCK, EMPTY_BLOCK]


def test_empty_block_scores_nothing_and_resets():
    blocks = pack_into_blocks([[1, 2, 3]], block_size=2, separator_id=SEP)
    batch = blocks.batch([0, EMPTY_BLOCK])
    assert batch["labels"][1].eq(IGNORE_INDEX).all() and batch["input_ids"][1].eq(SEP).all()
    assert batch["reset"].tolist() == [True, True]


@pytest.mark.parametrize("kwargs", [{"block_size": 0, "separator_id": 0}, {"block_size": 4, "separator_id": -1}])
def test_bad_arguments_are_named(kwargs):
    with pytest.raises(ValueError, match="block_size|separator_id"):
        pack_into_blocks([[1, 2]], **kwargs)
    with pytest.raises(ValueError, match="no tokens"):
        build_document_streams([[]], block_size=2, separator_id=0)


def _stream_of(documents):
    from datasets import Dataset

    return Dataset.from_list([{"text": " ".join(map(str, doc))} for doc in documents]).to_iterable_dataset()


def _tokenize(text):
    return [int(word) for word in text.split()]


def test_streaming_blocks_are_the_packed_blocks_and_resume_exactly():
    """Packed on the fly, the blocks are `pack_into_blocks`'s, in order (the same stream); a state taken anywhere
    (also after the stream has started again: the next epoch) continues with exactly the blocks that followed."""
    from tf_family.data import StreamingBlocks

    generator = torch.Generator().manual_seed(0)
    documents = [torch.randint(1, 50, (int(n),), generator=generator).tolist() for n in (5, 17, 1, 9, 30, 4)]
    packed = pack_into_blocks(documents, 8, separator_id=0)
    full_blocks = len(packed) - 1  # the last packed block is padded; a stream never pads
    stream = StreamingBlocks(_stream_of(documents), _tokenize, "text", 8, separator_id=0)
    batch = stream.batch(full_blocks)
    assert torch.equal(batch["input_ids"], packed.input_ids[:full_blocks])
    assert torch.equal(batch["labels"], packed.labels[:full_blocks])
    expected = [stream.batch(3) for _ in range(4)]  # runs on into the next epochs
    assert stream.epoch >= 1
    for taken_after in range(4):
        replay = StreamingBlocks(_stream_of(documents), _tokenize, "text", 8, separator_id=0)
        replay.batch(full_blocks)
        for _ in range(taken_after):
            replay.batch(3)
        state = json.loads(json.dumps(replay.state_dict()))  # what a checkpoint stores
        resumed = StreamingBlocks(_stream_of(documents), _tokenize, "text", 8, separator_id=0)
        resumed.load_state_dict(state)
        for step in range(taken_after, 4):
            assert torch.equal(resumed.batch(3)["input_ids"], expected[step]["input_ids"]), (taken_after, step)
