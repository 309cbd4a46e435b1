import pytest
import torch

from tf_family.memory import SegmentMemory, update_segment_memory


def test_update_keeps_most_recent_positions_and_detaches():
    old = [torch.arange(6.0).view(1, 3, 2)]
    new = [torch.arange(6.0, 10.0, requires_grad=True).view(1, 2, 2)]
    states, mask = update_segment_memory(
        old, torch.tensor([[True, False, True]]), new, torch.ones(1, 2, dtype=bool), 4
    )
    assert states[0].tolist() == [[[2.0, 3.0], [4.0, 5.0], [6.0, 7.0], [8.0, 9.0]]]
    assert mask.tolist() == [[False, True, True, True]]
    assert not states[0].requires_grad


def test_update_from_empty_and_zero_length():
    new = [torch.randn(2, 5, 3)]
    states, mask = update_segment_memory(None, None, new, torch.ones(2, 5, dtype=bool), 3)
    torch.testing.assert_close(states[0], new[0][:, -3:])
    assert update_segment_memory(None, None, new, torch.ones(2, 5, dtype=bool), 0) is None
    with pytest.raises(ValueError, match="mem_len"):
        update_segment_memory(None, None, new, torch.ones(2, 5, dtype=bool), -1)


def test_segment_memory_reset_select_and_validation():
    memory = SegmentMemory.from_states([torch.randn(3, 4, 2), torch.randn(3, 4, 2)])
    reset = memory.reset(torch.tensor([False, True, False]))
    assert reset.mask.tolist() == [[True] * 4, [False] * 4, [True] * 4]
    assert memory.mask.all(), "reset must not modify the original"
    picked = memory.index_select(torch.tensor([2, 2]))
    assert picked.batch_size == 2 and torch.equal(picked.states[1][0], memory.states[1][2])
    with pytest.raises(ValueError, match="reset rows"):
        memory.reset(torch.tensor([1, 0, 1]))
    with pytest.raises(ValueError, match="mask must have shape"):
        SegmentMemory((torch.randn(2, 3, 1),), torch.ones(2, 4, dtype=bool))


def snapshot(memory):
    return {key: value.clone() for key, value in memory.state_dict().items()}


def assert_unchanged(memory, before):
    after = memory.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_update_method_returns_the_pure_functions_memory_and_leaves_its_own_alone():
    memory = SegmentMemory(
        (torch.randn(2, 3, 4), torch.randn(2, 3, 4)), torch.tensor([[True, False, True], [True, True, True]])
    )
    before = snapshot(memory)
    new = [torch.randn(2, 2, 4, requires_grad=True) for _ in range(2)]
    new_mask = torch.tensor([[True, True], [False, True]])
    updated = memory.update(new, mem_len=4, new_mask=new_mask)
    states, mask = update_segment_memory(memory.states, memory.mask, new, new_mask, 4)
    assert updated is not memory and isinstance(updated, SegmentMemory)
    assert torch.equal(updated.mask, mask) and updated.length == 4
    assert all(torch.equal(a, b) and not a.requires_grad for a, b in zip(updated.states, states, strict=True))
    assert_unchanged(memory, before)
    # without a mask every new position is real; mem_len=0 means no recurrence
    assert memory.update(new, mem_len=5).mask.tolist() == [[True, False, True, True, True], [True] * 5]
    assert memory.update(new, mem_len=0) is None


def test_update_of_an_empty_memory_starts_the_stream():
    new = [torch.randn(2, 5, 3), torch.randn(2, 5, 3)]
    empty = SegmentMemory.empty_like(new)
    assert empty.length == 0 and len(empty) == 2 and empty.batch_size == 2
    memory = empty.update(new, mem_len=3)
    states, mask = update_segment_memory(None, None, new, torch.ones(2, 5, dtype=torch.bool), 3)
    assert torch.equal(memory.mask, mask)
    assert all(torch.equal(a, b) for a, b in zip(memory.states, states, strict=True))
    assert empty.length == 0
    with pytest.raises(ValueError, match="at least one layer"):
        SegmentMemory.empty_like([])
