"""CUDA RNG state in checkpoints: only the process's own device's generator is saved and restored, so a run resumes
on a node with any number of GPUs; checkpoints holding a list of per-device states still load. CUDA is faked (the
test machine may have none): ``torch.cuda`` answers as a node with ``count`` devices whose current one is ``current``.
"""

from __future__ import annotations

import pytest
import torch

from ragen.utils.seeding import get_rng_state, seed_everything, set_rng_state


@pytest.fixture
def fake_cuda(monkeypatch):
    """``make(count, current)`` -> the list of ``(device, state)`` restores the fake generators receive; each fake
    device's own state is ``tensor([device])`` (an index past ``count`` raises IndexError, as torch does)."""
    restored: list[tuple[int, torch.Tensor]] = []

    def make(count: int, current: int) -> list[tuple[int, torch.Tensor]]:
        def check(device: int) -> int:
            if not 0 <= device < count:
                raise IndexError(f"CUDA device {device} of a node with {count}")
            return device

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: current)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": torch.tensor([check(device)]))
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device="cuda": restored.append((check(device), s)))
        return restored

    return make


def test_only_the_current_device_state_is_saved_and_restored(fake_cuda):
    restored = fake_cuda(count=8, current=3)
    seed_everything(0)
    state = get_rng_state()
    assert torch.equal(state["cuda"], torch.tensor([3]))  # device 3's generator, not a list of all 8
    fake_cuda(count=2, current=1)  # resumed on a node with 2 GPUs
    set_rng_state(state)
    assert restored == [(1, state["cuda"])]


@pytest.mark.parametrize(("count", "current", "expected"), [(2, 1, 1), (8, 5, 5), (8, 6, None)])
def test_a_saved_list_of_device_states_restores_the_current_devices_entry(fake_cuda, count, current, expected):
    """An older checkpoint saved every device's state of a 6-GPU node: a node with fewer GPUs takes the entry of its
    current device; a device the list has no entry for keeps its generator."""
    seed_everything(0)
    state = {**get_rng_state(), "cuda": [torch.tensor([10 + i]) for i in range(6)]}
    restored = fake_cuda(count=count, current=current)
    set_rng_state(state)
    if expected is None:
        assert restored == []
    else:
        assert [device for device, _ in restored] == [expected]
        assert torch.equal(restored[0][1], state["cuda"][expected])
