"""The FIFO rules of the Compressive Transformer's two memories (algorithm 1 of Rae et al. 2019)."""

import functools

import pytest
import torch

from tf_family.memory import (
    CompressiveMemory,
    SegmentMemory,
    append_compressed,
    compress_memory,
    evicted_length,
    mean_pool_compress,
    split_memory,
    update_compressive_memory,
    update_segment_memory,
)


def positions(start, stop, layers=2):
    """Per layer ``(1, stop - start, 1)`` states whose value is the stream position (layer l adds 100 * l)."""
    return [torch.arange(start, stop, dtype=torch.float32).view(1, -1, 1) + 100 * layer for layer in range(layers)]


def mean_pool(layer, states, mask):
    return mean_pool_compress(states, mask, 2)


def test_evicted_length():
    assert evicted_length(0, 10, 8, 2) == 2
    assert evicted_length(8, 3, 8, 2) == 2  # one state waits for its group partner
    assert evicted_length(9, 3, 8, 2) == 4
    assert evicted_length(8, 3, 8, None) == 3  # Transformer-XL: every overflowing state leaves
    assert evicted_length(0, 5, 8, 2) == 0
    assert evicted_length(3, 1, 3, 3) == 0 and evicted_length(5, 1, 3, 3) == 3
    with pytest.raises(ValueError, match="rate must be >= 1"):
        evicted_length(0, 5, 2, 0)


def run(segment_lengths, mem_len=4, cmem_len=3, total=None):
    memory, start = None, 0
    history = []
    for length in segment_lengths:
        memory, *_ = update_compressive_memory(
            memory, positions(start, start + length), torch.ones(1, length, dtype=torch.bool),
            (mem_len, cmem_len, 2), mean_pool,
        )  # fmt: skip
        start += length
        history.append((memory.memory.states[0].flatten().tolist(), memory.compressed.states[0].flatten().tolist()))
    return memory, history


def test_compressed_memory_fills_and_rolls_over():
    memory, history = run([2] * 6)
    assert history == [
        ([0, 1], []),
        ([0, 1, 2, 3], []),
        ([2, 3, 4, 5], [0.5]),  # 0, 1 leave the memory: one compressed slot, their mean
        ([4, 5, 6, 7], [0.5, 2.5]),
        ([6, 7, 8, 9], [0.5, 2.5, 4.5]),  # full
        ([8, 9, 10, 11], [2.5, 4.5, 6.5]),  # rolls over: the oldest slot is discarded
    ]
    assert memory.compressed.states[1].flatten().tolist() == [102.5, 104.5, 106.5]  # every layer
    assert memory.memory.mask.all() and memory.compressed.mask.all()


def test_states_leave_in_whole_groups_and_segmentation_does_not_matter():
    _, history = run([3] * 4)
    assert history == [
        ([0, 1, 2], []),
        ([2, 3, 4, 5], [0.5]),
        ([4, 5, 6, 7, 8], [0.5, 2.5]),  # 3 overflow, 2 leave: the memory holds mem_len + 1
        ([8, 9, 10, 11], [2.5, 4.5, 6.5]),
    ]
    final = history[-1]
    for lengths in ([12], [1] * 12, [5, 7], [2, 3, 4, 3]):
        assert run(lengths)[1][-1] == final, lengths


def test_no_compressed_memory_is_the_transformer_xl_memory():
    memory, old_mask = None, None
    states = None
    for start in (0, 3, 6):
        new = positions(start, start + 3)
        mask = torch.ones(1, 3, dtype=torch.bool)
        memory, evicted, _, compressed, _ = update_compressive_memory(memory, new, mask, (4, 0, 2), mean_pool)
        states, old_mask = update_segment_memory(states, old_mask, new, mask, 4)
        assert compressed == () and memory.compressed.length == 0
        for ours, theirs in zip(memory.memory.states, states, strict=True):
            assert torch.equal(ours, theirs)
    assert evicted[0].flatten().tolist() == [2.0, 3.0, 4.0]


def test_masks_travel_with_the_states_and_everything_stored_is_detached():
    new = [torch.arange(6.0).view(1, 6, 1).requires_grad_()]
    mask = torch.tensor([[False, False, False, True, True, True]])  # left padding

    scale = torch.tensor(2.0, requires_grad=True)

    def compress(layer, states, mask):
        out, out_mask = mean_pool_compress(states, mask, 2)
        return out * scale, out_mask  # a learned compression: its output carries a graph

    memory, evicted, evicted_mask, compressed, compressed_mask = update_compressive_memory(
        None, new, mask, (2, 4, 2), compress
    )
    assert evicted_mask.tolist() == [[False, False, False, True]]
    assert compressed_mask.tolist() == [[False, True]] and compressed[0].requires_grad
    assert compressed[0].flatten().tolist() == [0.0, 6.0]
    assert memory.compressed.mask.tolist() == [[False, True]] and memory.memory.mask.tolist() == [[True, True]]
    assert not any(s.requires_grad for s in (*memory.memory.states, *memory.compressed.states, *evicted))


def test_split_and_append_directly():
    kept, kept_mask, evicted, evicted_mask = split_memory(
        positions(0, 3, 1), torch.ones(1, 3, dtype=torch.bool), positions(3, 6, 1),
        torch.ones(1, 3, dtype=torch.bool), 3, 3,
    )  # fmt: skip
    assert kept[0].flatten().tolist() == [3, 4, 5] and evicted[0].flatten().tolist() == [0, 1, 2]
    states, mask = append_compressed(None, None, positions(0, 2, 1), torch.ones(1, 2, dtype=torch.bool), 1)
    assert states[0].flatten().tolist() == [1.0] and mask.shape == (1, 1)
    with pytest.raises(ValueError, match="cmem_len must be >= 0"):
        append_compressed(None, None, positions(0, 2, 1), torch.ones(1, 2, dtype=torch.bool), -1)


def test_compressive_memory_object():
    memory = CompressiveMemory.from_states([torch.randn(3, 4, 2)] * 2, [torch.randn(3, 2, 2)] * 2)
    reset = memory.reset(torch.tensor([False, True, False]))
    assert reset.memory.mask[1].any().item() is False and reset.compressed.mask[1].any().item() is False
    assert reset.memory.mask[0].all() and memory.memory.mask.all()
    picked = memory.index_select(torch.tensor([2, 0]))
    assert torch.equal(picked.compressed.states[0][0], memory.compressed.states[0][2])
    assert picked.batch_size == 2 and len(picked) == 2
    assert memory.to(dtype=torch.float64).memory.states[0].dtype == torch.float64
    empty = CompressiveMemory.from_states([torch.randn(3, 4, 2)])
    assert empty.compressed.length == 0
    with pytest.raises(ValueError, match="must match"):
        CompressiveMemory(memory.memory, SegmentMemory.from_states([torch.randn(2, 1, 2)] * 2))
    with pytest.raises(ValueError, match=r"usage must hold one \(3, 4, 2\) tensor per layer"):
        CompressiveMemory(memory.memory, memory.compressed, (torch.zeros(3, 4, 2),))
    with_usage = CompressiveMemory(memory.memory, memory.compressed, [torch.rand(3, 4, 2)] * 2)
    assert torch.equal(with_usage.index_select(torch.tensor([2])).usage[0][0], with_usage.usage[0][2])
    with pytest.raises(TypeError, match="SegmentMemory objects"):
        CompressiveMemory(memory.memory, None)


def memory_tensors(memory):
    return {key: value.clone() for key, value in memory.state_dict().items()}


def assert_same_memory(ours, theirs):
    ours, theirs = ours.state_dict(), theirs.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_update_method_returns_the_pure_functions_update_and_leaves_its_own_memory_alone():
    memory, _ = run([3, 3])  # memory [2, 3, 4, 5], compressed [0.5]
    before = memory_tensors(memory)
    new, mask = positions(6, 9), torch.tensor([[True, False, True]])
    weights = [torch.randn(1, 1, 2, requires_grad=True) for _ in range(2)]
    compress = [functools.partial(compress_memory, "conv", rate=2, weights=(w,), biases=(None,)) for w in weights]
    step = memory.update(new, mem_len=4, cmem_len=3, rate=2, compress=compress, new_mask=mask)

    def pure_compress(layer, states, states_mask):
        return compress_memory("conv", states, states_mask, 2, weights=(weights[layer],), biases=(None,))

    expected = update_compressive_memory(memory, new, mask, (4, 3, 2), pure_compress)
    assert step.memory is not memory
    assert_same_memory(step.memory, expected.memory)
    for ours, theirs in zip(step[1:], expected[1:], strict=True):
        if isinstance(ours, tuple):
            assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
        else:
            assert torch.equal(ours, theirs)
    assert step.compressed[0].requires_grad  # the compression's output keeps its graph for the auxiliary losses
    assert_same_memory(memory, CompressiveMemory.from_state_dict(before))


def test_update_of_an_empty_memory_starts_the_stream():
    new, mask = positions(0, 6), torch.ones(1, 6, dtype=torch.bool)
    compress = [functools.partial(compress_memory, "mean_pool", rate=2)] * 2
    empty = CompressiveMemory.empty_like(new)
    assert empty.memory.length == 0 and empty.compressed.length == 0 and len(empty) == 2
    step = empty.update(new, mem_len=4, cmem_len=3, rate=2, compress=compress)
    assert_same_memory(step.memory, update_compressive_memory(None, new, mask, (4, 3, 2), mean_pool).memory)
    # no compressed memory: no compression function needed, the Transformer-XL memory
    plain = empty.update(new, mem_len=4, cmem_len=0, rate=2).memory
    assert plain.memory.states[0].flatten().tolist() == [2, 3, 4, 5] and plain.compressed.length == 0
    with pytest.raises(ValueError, match="one compression function per layer"):
        empty.update(new, mem_len=4, cmem_len=3, rate=2)


def test_update_accumulates_usage_and_ranks_the_leaving_states_by_it():
    new = positions(0, 4, 1)  # one layer, states 0..3
    compress = [functools.partial(compress_memory, "most_used", rate=2)]
    memory = CompressiveMemory.empty_like(new).update(
        new, mem_len=2, cmem_len=2, rate=2, compress=compress, usage=[torch.tensor([[[0, 1], [9, 1], [0, 0], [0, 0]]])]
    ).memory  # fmt: skip
    # states 0 and 1 left: 1 was used more, so it is kept; 2 and 3 stay with their statistics
    assert memory.compressed.states[0].flatten().tolist() == [1.0]
    assert memory.usage[0].tolist() == [[[0, 0], [0, 0]]]
    segment_usage = torch.tensor([[[4.0, 2.0], [1.0, 2.0], [0, 1], [0, 1]]])  # keys [2, 3, 4, 5]
    before = memory_tensors(memory)
    step = memory.update(positions(4, 6, 1), mem_len=2, cmem_len=2, rate=2, compress=compress, usage=[segment_usage])
    assert step.compressed[0].flatten().tolist() == [2.0]  # 2 received 4 / 2 queries, 3 only 1 / 2
    assert step.memory.usage[0].tolist() == [[[0, 1], [0, 1]]]
    assert step.memory.compressed.states[0].flatten().tolist() == [1.0, 2.0]
    assert_same_memory(memory, CompressiveMemory.from_state_dict(before))
    with pytest.raises(ValueError, match=r"usage must hold one \(1, 4, 2\) tensor per layer"):
        memory.update(
            positions(4, 6, 1), mem_len=2, cmem_len=2, rate=2, compress=compress, usage=[segment_usage[:, 1:]]
        )
