"""The pieces of asynchronous training on their own: versions stamped by the engine, weights that change only between
forward passes, staleness per row and per group, admission, and the queue over a scripted proxy."""

import threading

import torch

from ragen.ppo.async_rollout import RolloutQueue, may_start, row_staleness, stale_groups
from ragen.rollout.base import VERSION_KEY, Sample, SamplingParams
from ragen.rollout.versioned import VersionedEngine


class _Engine:
    """Samples one token per prompt; ``gate`` (an Event) makes ``generate`` wait inside its forward pass."""

    def __init__(self, gate=None):
        self.gate, self.weights, self.loads, self.in_forward = gate, 0, [], False
        self.asleep = frozenset()

    def generate(self, prompts, sampling):
        self.in_forward = True
        if self.gate is not None:
            self.gate.wait(10)
        out = [Sample([self.weights], [0.0], "stop") for _ in prompts]
        self.in_forward = False
        return out

    def update_weights(self, w):
        self.loads.append(("during forward" if self.in_forward else "between", w))
        self.weights = w


def test_samples_carry_the_version_their_weights_have():
    eng = VersionedEngine(_Engine(), version=3)
    assert [s.extra[VERSION_KEY] for s in eng.generate([[1], [2]], SamplingParams())] == [3, 3]
    eng.publish(4, lambda: eng.update_weights(40))
    (s,) = eng.generate([[1]], SamplingParams())
    assert (s.token_ids, s.extra[VERSION_KEY]) == ([40], 4)
    eng.publish(5, None)  # a skipped update: same weights, next version
    (s,) = eng.generate([[1]], SamplingParams())
    assert (s.token_ids, s.extra[VERSION_KEY]) == ([40], 5)


def _forward_in_flight() -> tuple[threading.Event, _Engine, VersionedEngine, threading.Thread]:
    """A versioned engine whose ``generate`` (on its own thread) is inside its forward pass until the gate opens."""
    gate = threading.Event()
    inner = _Engine(gate)
    eng = VersionedEngine(inner)
    gen = threading.Thread(target=lambda: eng.generate([[1]], SamplingParams()))
    gen.start()
    while not inner.in_forward:
        pass
    return gate, inner, eng, gen


def test_a_weight_load_waits_for_the_forward_in_flight():
    gate, inner, eng, gen = _forward_in_flight()
    pub = threading.Thread(target=lambda: eng.publish(1, lambda: eng.update_weights(7)))
    pub.start()
    pub.join(0.3)
    assert pub.is_alive() and inner.loads == []  # blocked behind the forward pass
    gate.set()
    gen.join(10)
    pub.join(10)
    assert inner.loads == [("between", 7)] and eng.version == 1


def test_publish_never_goes_back():
    eng = VersionedEngine(_Engine(), version=2)
    try:
        eng.publish(1, None)
    except ValueError as err:
        assert "from 2 to 1" in str(err)
    else:
        raise AssertionError("a version going back was accepted")


def test_row_staleness_and_whole_group_drops():
    versions = torch.tensor([[-1, 3, 3, -1], [-1, 2, 4, 4], [-1, -1, -1, -1], [-1, 4, -1, -1]])
    st = row_staleness(versions, consumer_version=4)
    assert st.tolist() == [1, 2, 0, 0]  # the oldest token counts; a row without model tokens is 0
    groups = torch.tensor([0, 1, 1, 2])
    assert stale_groups(st, groups, max_staleness=1).tolist() == [False, True, True, False]
    assert stale_groups(st, groups, max_staleness=0).tolist() == [True, True, True, False]
    assert not stale_groups(st, groups, max_staleness=2).any()


def test_admission():
    # wait: batch b starts once step b - k is released; never past the last step
    assert may_start(0, 0, 0, 0, "wait", 5) and not may_start(1, 0, 0, 0, "wait", 5)
    assert may_start(1, 0, 1, 1, "wait", 5) and not may_start(2, 0, 0, 1, "wait", 5)
    assert not may_start(5, 5, 0, 2, "wait", 5)
    # drop: while the queue has room for k + 1 batches, whatever the released steps
    assert may_start(9, 0, 1, 1, "drop", 20) and not may_start(9, 0, 2, 1, "drop", 20)


class _Proxy:
    """A train proxy that plays one group of two one-token rows per batch through ``engine``."""

    def __init__(self, engine, permits=None):
        self.engine, self.played, self.permits = engine, 0, permits

    def rollout(self, split):
        from ragen.agent.batch import RolloutBatch

        if self.permits is not None:  # the test lets each batch start
            assert self.permits.acquire(timeout=10)
        (s1, s2) = self.engine.generate([[1], [2]], SamplingParams())
        self.played += 1
        v = torch.tensor([[-1, s1.extra[VERSION_KEY]], [-1, s2.extra[VERSION_KEY]]])
        z = torch.zeros((2, 2))
        return RolloutBatch(input_ids=torch.ones((2, 2), dtype=torch.long), attention_mask=torch.ones((2, 2)),
                            response_mask=(v >= 0).long(), turn_ids=torch.where(v >= 0, 0, -1), token_rewards=z,
                            sample_log_probs=z, group_ids=torch.tensor([self.played, self.played]),
                            turn_rewards=torch.zeros((2, 1)), num_turns=torch.ones(2, dtype=torch.long),
                            truncated=torch.zeros(2, dtype=torch.bool), sample_versions=v)

    def state_dict(self):
        return {"played": self.played}


def _train(queue, engine, steps):
    """The trainer's side: get, publish the next version, release; returns each step's async metrics."""
    out = []
    for step in range(steps):
        item, metrics = queue.get(step)
        assert item.index == step and item.proxy_state == {"played": step + 1}
        engine.publish(step + 1, None)
        queue.release(step + 1)
        out.append(metrics)
    return out


def test_queue_at_k0_plays_each_batch_after_the_previous_step():
    engine = VersionedEngine(_Engine())
    queue = RolloutQueue(_Proxy(engine), engine, max_staleness=0, stale_policy="wait", partial=False, first=0,
                         last=4).start()
    metrics = _train(queue, engine, 4)
    assert queue.stop() == 0
    assert [m["async/staleness_max"] for m in metrics] == [0.0] * 4


def test_queue_bound_holds_at_k2():
    engine = VersionedEngine(_Engine())
    proxy = _Proxy(engine)
    queue = RolloutQueue(proxy, engine, max_staleness=2, stale_policy="wait", partial=False, first=0, last=6).start()
    metrics = _train(queue, engine, 6)
    queue.stop()
    assert max(m["async/staleness_max"] for m in metrics) <= 2 and proxy.played == 6  # never past the last step


def test_drop_policy_drops_stale_groups():
    engine = VersionedEngine(_Engine())
    permits = threading.Semaphore(0)
    proxy = _Proxy(engine, permits)
    queue = RolloutQueue(proxy, engine, max_staleness=1, stale_policy="drop", partial=False, first=0, last=2)
    queue.start()
    permits.release(2)  # batches 0 and 1 play at version 0 (the queue has room for k + 1 = 2)
    item, m = queue.get(0)
    assert item.index == 0 and m["async/dropped_groups"] == 0
    engine.publish(1, None)
    engine.publish(2, None)
    permits.release(1)  # batch 1 is now 2 versions stale: dropped whole, and one more batch plays, at version 2
    item, m = queue.get(2)
    assert (item.index, m["async/dropped_groups"], m["async/staleness_max"]) == (2, 1, 0.0)
    assert queue.dropped_batches == 1
    queue.stop()


def test_an_error_in_the_rollout_thread_reaches_the_trainer():
    class Broken(_Proxy):
        def rollout(self, split):
            raise RuntimeError("env exploded")

    engine = VersionedEngine(_Engine())
    queue = RolloutQueue(Broken(engine), engine, max_staleness=0, stale_policy="wait", partial=False, first=0,
                         last=2).start()
    try:
        queue.get(0)
    except RuntimeError as err:
        assert "env exploded" in str(err)
    else:
        raise AssertionError("the rollout thread's error was lost")
    queue.stop()


def test_a_publish_records_how_long_it_waited_for_the_engine():
    gate, _, eng, gen = _forward_in_flight()
    threading.Timer(0.2, gate.set).start()
    eng.publish(1, None)  # waits for the forward pass the timer ends
    gen.join(10)
    waited = eng.publish_wait_s
    eng.publish(2, None)  # nothing in flight
    assert waited > 0 and eng.publish_wait_s < waited
