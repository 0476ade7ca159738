"""Replay buffer of the ArCHer family: one typed record per turn, FIFO capacity, seeded uniform sampling.

The paper's off-policy utterance-level critic (Zhou et al. 2024) learns from every turn collected so far: each turn is
stored as (s, a, r, s', done) plus its trajectory's total reward (online filtered BC) and its Monte-Carlo return.
Records keep the exact token ids the policy saw and sampled (``prompt_ids`` / ``action_ids``), so actor and BC updates
train on the same tokens (docs/design.md, the token layout: token-in / token-out), and the texts the critic encodes. The
buffer saves and loads itself (JSON: records, insertion counter and the sampling generator's state), so a resumed run
samples exactly what an uninterrupted one would.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass
class Transition:
    """One turn. ``state``: the text the critic encodes for s (the conversation up to this turn); ``action``:
    the model's response text; ``next_state``: s' (the state of the next turn, or the final context when the
    episode ended); ``done``: s' is terminal (env done or max_turn; a length cut is not done: it bootstraps);
    ``traj_reward``: the episode's total reward; ``mc_return``: discounted reward-to-go from this turn;
    ``prompt_ids`` / ``action_ids``: the exact tokens of the prompt and of the sampled response;
    ``episode``: a run-wide episode counter (turns of one episode share it); ``turn``: 0-based turn index."""

    state: str
    action: str
    reward: float
    next_state: str
    done: bool
    traj_reward: float
    mc_return: float
    prompt_ids: list[int] = field(default_factory=list)
    action_ids: list[int] = field(default_factory=list)
    episode: int = 0
    turn: int = 0


class ReplayBuffer:
    """FIFO buffer of at most ``capacity`` transitions; ``sample`` draws uniformly (with replacement) with its
    own ``torch.Generator`` seeded by ``seed``, so sampling does not touch (nor depend on) the global RNG."""

    def __init__(self, capacity: int, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"replay buffer capacity={capacity} must be >= 1 (archer.capacity)")
        self.capacity = int(capacity)
        self._items: list[Transition] = []
        self.total_added = 0
        self.generator = torch.Generator().manual_seed(int(seed))

    def __len__(self) -> int:
        return len(self._items)

    def add(self, transitions: list[Transition]) -> None:
        """Append in order; the oldest records are dropped beyond ``capacity``."""
        self._items.extend(transitions)
        self.total_added += len(transitions)
        if len(self._items) > self.capacity:
            del self._items[: len(self._items) - self.capacity]

    def records(self) -> list[Transition]:
        """All stored records, oldest first (a copy of the list)."""
        return list(self._items)

    def sample(self, n: int) -> list[Transition]:
        """``n`` records drawn uniformly with replacement."""
        if not self._items:
            raise ValueError("cannot sample from an empty replay buffer")
        idx = torch.randint(len(self._items), (n,), generator=self.generator)
        return [self._items[i] for i in idx.tolist()]

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict:
        return {"capacity": self.capacity, "total_added": self.total_added,
                "generator": self.generator.get_state().tolist(),
                "items": [dataclasses.asdict(t) for t in self._items]}

    def load_state_dict(self, state: dict) -> None:
        self.capacity = int(state["capacity"])
        self.total_added = int(state["total_added"])
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))
        self._items = [Transition(**d) for d in state["items"]]

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.state_dict()))
        return path

    @classmethod
    def load(cls, path: str | Path) -> ReplayBuffer:
        state = json.loads(Path(path).read_text())
        buf = cls(state["capacity"])
        buf.load_state_dict(state)
        return buf
