"""Env groups, seeds, and exception-isolated env calls.

Each ``EnvGroupSpec`` becomes ``n_groups * group_size`` env slots; the slots of one group share a reset
seed and a group id (numbered across all specs, in spec order). Seeds:

* train: ``seed + counter * total_groups + g`` for global group g, where ``counter`` advances by one per
  train rollout, so every call sees fresh, reproducible groups and consecutive calls never repeat a seed;
* val: ``val_seed + g`` on every call.

An exception raised by an env (reset, step, instructions, legal_actions) never escapes: the slot is marked
failed (``EpisodeRecord.failed`` and ``error``), it takes no further turns, and the rest of the batch goes
on. A failed slot's env is rebuilt before its next episode.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

from ragen.agent.batch import EpisodeRecord
from ragen.agent.config import AgentConfig, EnvGroupSpec
from ragen.agent.parser import clean_text
from ragen.env import make
from ragen.env.base import Env


@dataclass
class TurnOutcome:
    """The effect of one turn's actions, executed sequentially (stopping early at ``done``)."""

    reward: float = 0.0
    step_reward: float = 0.0
    outcome_reward: float = 0.0
    has_split: bool = False  # the env reported step_reward / outcome_reward
    executed: int = 0
    valid: int = 0
    effective: int = 0
    done: bool = False
    success: bool = False
    observation: str = ""


@dataclass
class EnvSlot:
    """One env and the state of its current episode."""

    spec: EnvGroupSpec
    env: Env | None
    group_id: int
    max_turn: int
    max_actions: int
    seed: int = 0
    observation: str = ""
    done: bool = False
    stopped: bool = False  # ended early by the proxy (prompt does not fit max_model_len): counts as truncated
    failed: bool = False
    error: str = ""
    record: EpisodeRecord | None = None
    actions_total: int = 0
    actions_valid: int = 0
    actions_effective: int = 0
    turn_rewards: list[float] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    outcome_reward: float = 0.0
    has_split: bool = False
    obs_keys: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    def begin(self, seed: int) -> None:
        """Clear the previous episode's state before a reset with ``seed``."""
        self.seed, self.observation, self.done, self.failed, self.error = seed, "", False, False, ""
        self.stopped = False
        self.actions_total = self.actions_valid = self.actions_effective = 0
        self.turn_rewards, self.step_rewards, self.obs_keys = [], [], []
        self.outcome_reward, self.has_split = 0.0, False
        self.record = EpisodeRecord(env_name=self.name, seed=seed, group_id=self.group_id)

    def fail(self, where: str, exc: BaseException) -> None:
        """Mark this slot failed by ``exc`` raised in ``where``; the env is rebuilt before the next episode."""
        self.failed = True
        self.done = True
        lines = traceback.format_exception_only(type(exc), exc)
        self.error = f"{where}: {''.join(lines).strip()}"
        if self.record is not None:
            self.record.failed = True
            self.record.error = self.error
        self.env = None


class EnvManager:
    """Builds the env slots of ``specs`` and runs their resets and steps."""

    def __init__(self, specs: list[EnvGroupSpec], agent: AgentConfig) -> None:
        if not specs:
            raise ValueError("no env groups given: pass at least one EnvGroupSpec")
        self.specs = list(specs)
        self.slots: list[EnvSlot] = []
        group = 0
        for spec in self.specs:
            max_turn = spec.max_turn or agent.max_turn
            max_actions = spec.max_actions_per_turn or agent.max_actions_per_turn
            for _ in range(spec.n_groups):
                for _ in range(spec.group_size):
                    env = make(spec.name, **spec.config)  # config errors raise here, before any rollout
                    self.slots.append(EnvSlot(spec, env, group, max_turn, max_actions))
                group += 1
        self.num_groups = group

    def group_seeds(self, base: int, counter: int) -> list[int]:
        """Seed of each global group for rollout number ``counter`` (0 for validation)."""
        return [base + counter * self.num_groups + g for g in range(self.num_groups)]

    def reset(self, seeds: list[int]) -> None:
        """Start a new episode in every slot (slot seed = its group's seed); failures are isolated."""
        for slot in self.slots:
            seed = seeds[slot.group_id]
            slot.begin(seed)
            try:
                if slot.env is None:
                    slot.env = make(slot.name, **slot.spec.config)
                slot.observation = str(slot.env.reset(seed))
            except Exception as exc:  # noqa: BLE001 - any env bug must stay inside its slot
                slot.fail("reset", exc)

    @staticmethod
    def describe(slot: EnvSlot) -> tuple[str, str]:
        """(instructions, legal actions) of the slot's env; raises what the env raises."""
        assert slot.env is not None
        return str(slot.env.instructions), str(slot.env.legal_actions())

    @staticmethod
    def step(slot: EnvSlot, actions: list[str]) -> TurnOutcome:
        """Execute ``actions`` in order (stop early when done); an env exception fails the slot."""
        out = TurnOutcome(observation=slot.observation)
        for action in actions:
            try:
                assert slot.env is not None
                res = slot.env.step(clean_text(action))
                reward = float(res.reward)
            except Exception as exc:  # noqa: BLE001 - any env bug must stay inside its slot
                slot.fail("step", exc)
                out.done = True
                return out
            info = res.info or {}
            out.executed += 1
            out.valid += bool(info.get("action_is_valid", False))
            out.effective += bool(info.get("action_is_effective", False))
            out.reward += reward
            if "step_reward" in info or "outcome_reward" in info:
                out.has_split = True
                out.step_reward += float(info.get("step_reward", 0.0))
                out.outcome_reward += float(info.get("outcome_reward", 0.0))
            out.success = out.success or bool(info.get("success", False))
            out.observation = str(res.observation)
            if res.done:
                out.done = True
                break
        return out
