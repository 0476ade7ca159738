"""An ``ArcherTrainer`` over fakes (engine, tokenizer, worker groups, proxy) for tests of its phases without models:
what it asks the engine and sends to the workers is recorded."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from factories import IdTextTokenizer

from ragen.archer.buffer import Transition
from ragen.archer.trainer import ArcherTrainer
from ragen.trainer.config.compose import load_train_config

EOT = 99


class RecordingGroup:
    """A worker group whose ``call(method, *args, **kw)`` records the call and answers from ``answers[method]``
    (a callable of the keyword arguments, or a constant)."""

    def __init__(self, **answers: Any) -> None:
        self.answers, self.calls = answers, []

    def call(self, method: str, *args: Any, **kw: Any) -> Any:
        self.calls.append((method, args, kw))
        answer = self.answers.get(method, {})
        return answer(**kw) if callable(answer) else answer

    def call_rank0(self, method: str, *args: Any, **kw: Any) -> Any:
        return self.call(method, *args, **kw)

    def shutdown(self) -> None:
        return None


def prefer_candidate(best: int, k: int):
    """A fake target min-Q: candidate ``best`` of the ``k`` candidates (action text ``"10<j>"``) scores 1, the
    others 0 (the action's last id minus 100 is its candidate index)."""

    def target_min_q(states: list[str], actions: list[str]) -> torch.Tensor:
        return torch.tensor([float(int(a.split()[-1]) - 100 == best) for a in actions])

    return target_min_q


def trainer_with_fakes(config: str, engine: Any, overrides: list[str] = (), **groups: Any) -> ArcherTrainer:
    """An ``ArcherTrainer`` of ``config`` (not set up) whose engine, tokenizer, proxy and worker groups are fakes."""
    cfg = load_train_config(config, ["trainer.output_dir=/nonexistent", *overrides])
    trainer = ArcherTrainer(cfg)
    trainer.run.engine, trainer.run.tokenizer = engine, IdTextTokenizer()
    trainer.run.proxy = SimpleNamespace(fmt=SimpleNamespace(eot_id=EOT), pad_id=0)
    trainer.run.workers = dict(groups)
    return trainer


def record(episode: int, turn: int, traj_reward: float, prompt: list[int], action: list[int]) -> Transition:
    dec = IdTextTokenizer().decode
    return Transition(state=dec(prompt), action=dec(action), reward=-1.0, next_state=dec(prompt + action), done=False,
                      traj_reward=traj_reward, mc_return=-1.0, prompt_ids=list(prompt), action_ids=list(action),
                      episode=episode, turn=turn)
