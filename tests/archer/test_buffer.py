"""Replay buffer: FIFO capacity, seeded uniform sampling, save/load round trip."""

import pytest

from ragen.archer.buffer import ReplayBuffer, Transition


def _t(i: int) -> Transition:
    return Transition(state=f"s{i}", action=f"a{i}", reward=float(i), next_state=f"s{i + 1}", done=i % 2 == 0,
                      traj_reward=-i, mc_return=0.5 * i, prompt_ids=[i, i + 1], action_ids=[7], episode=i, turn=0)


def test_capacity_and_fifo_order():
    buf = ReplayBuffer(capacity=3)
    buf.add([_t(0), _t(1)])
    buf.add([_t(2), _t(3), _t(4)])
    assert len(buf) == 3 and buf.total_added == 5
    assert [t.state for t in buf.records()] == ["s2", "s3", "s4"]  # the two oldest were dropped
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=0)


def test_sampling_is_uniform_and_seeded():
    a, b = ReplayBuffer(10, seed=3), ReplayBuffer(10, seed=3)
    for buf in (a, b):
        buf.add([_t(i) for i in range(4)])
    draws = [t.state for t in a.sample(4000)]
    assert draws[:50] == [t.state for t in b.sample(50)]
    counts = [draws.count(f"s{i}") for i in range(4)]
    assert all(900 < c < 1100 for c in counts), counts  # 1000 each expected
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(2).sample(1)


def test_save_load_round_trip_continues_the_same_samples(tmp_path):
    buf = ReplayBuffer(5, seed=1)
    buf.add([_t(i) for i in range(7)])
    buf.sample(3)
    path = buf.save(tmp_path / "buffer.json")
    loaded = ReplayBuffer.load(path)
    assert loaded.records() == buf.records() and loaded.total_added == 7 and loaded.capacity == 5
    assert [t.state for t in loaded.sample(20)] == [t.state for t in buf.sample(20)]
