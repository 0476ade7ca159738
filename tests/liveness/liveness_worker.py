"""Slow probes of the liveness walk: the real trainers, in-process, on the tiny model (``trainer.use_ray=false``).

* ``ppo_step``: ``PPOTrainer.setup`` + one ``train_step`` (rollout by the scripted engine of ``liveness_probes``,
  then the trainer's own old / ref log-probs, values, credit, critic and actor updates): the ``actor`` and ``critic``
  parameters afterwards.
* ``warm``: ``PPOTrainer.setup`` + ``PPOTrainer.warm_start`` when ``trainer.sft_warmup_steps`` > 0: the ``actor``
  parameters afterwards.
* ``archer_step``: ``ArcherTrainer.setup`` + one ``train_step``, the rollout played by the scripted engine (varied
  rewards) and the fresh actions (and CHAI's candidates) sampled by the trainer's own engine over the tiny policy (so
  their log-probs are the policy's, as the REINFORCE ratio assumes): the ``actor`` and ``critic`` (online and
  target) parameters afterwards.

Each runs in a fresh temporary run folder; torch's deterministic-algorithms switch is restored afterwards.
"""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any

import liveness_probes as P
import torch

from ragen.trainer.config.schema import TrainConfig


def _flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([state[k].detach().float().flatten() for k in sorted(state)]) if state else torch.zeros(0)


def _in_tmp(cfg: TrainConfig, folder: str) -> TrainConfig:
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, output_dir=folder))


def _scripted(trainer: Any, cfg: TrainConfig) -> None:
    """The trainer's engine and proxies replaced by the scripted engine (deterministic, parseable answers)."""
    from ragen.trainer.builders import build_proxies

    trainer.run.engine = P.ScriptedEngine(trainer.run.tokenizer, cfg)
    if cfg.trainer.async_rollout:  # as the trainer's own engine: every sample stamped with its policy version
        from ragen.rollout.versioned import VersionedEngine

        trainer.run.engine = VersionedEngine(trainer.run.engine)
    trainer.run.proxy, trainer.run.val_proxy = build_proxies(cfg, trainer.run.engine, trainer.run.tokenizer)


def _run(cfg: TrainConfig, fn) -> dict[str, torch.Tensor]:
    deterministic = torch.are_deterministic_algorithms_enabled()
    with tempfile.TemporaryDirectory() as folder:
        try:
            return fn(_in_tmp(cfg, folder))
        finally:
            torch.use_deterministic_algorithms(deterministic)


def _ppo(cfg: TrainConfig, warm: bool) -> dict[str, torch.Tensor]:
    from ragen.ppo.trainer import PPOTrainer
    trainer = PPOTrainer(cfg)
    trainer.setup()
    try:
        _scripted(trainer, cfg)
        if warm:
            if cfg.trainer.sft_warmup_steps > 0:
                trainer.warm_start()
        else:
            trainer.train_step()
        out = {"actor": _flat(trainer.run.workers["actor"].call_rank0("full_state_dict"))}
        if trainer.run.workers.get("critic") is not None and not warm:
            out["critic"] = _flat(_critic_state(trainer.run.workers["critic"]))
        return out
    finally:
        trainer.shutdown()


def _critic_state(group: Any) -> dict[str, torch.Tensor]:
    """The PPO critic's weights (the in-process group's worker, world size 1)."""
    return dict(group.worker.module.state_dict())


def ppo_step(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    return _run(cfg, lambda c: _ppo(c, warm=False))


def warm(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    return _run(cfg, lambda c: _ppo(c, warm=True))


def _archer(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    from ragen.archer.trainer import ArcherTrainer
    from ragen.trainer.builders import build_proxies

    trainer = ArcherTrainer(cfg)
    trainer.setup()
    try:  # the rollout by the scripted engine; fresh actions (and CHAI's candidates) sampled by the policy's engine
        run = trainer.run
        run.proxy, run.val_proxy = build_proxies(cfg, P.ScriptedEngine(run.tokenizer, cfg), run.tokenizer)
        trainer.train_step()
        out = {"actor": _flat(trainer.run.workers["actor"].call_rank0("full_state_dict"))}
        if trainer.run.workers.get("critic") is not None:
            state = trainer.run.workers["critic"].call_rank0("full_state_dict")
            out.update({f"critic_{k}": _flat(v) for k, v in state.items()})
        return out
    finally:
        trainer.shutdown()


def archer_step(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    return _run(cfg, _archer)


PROBES = {"ppo_step": ppo_step, "warm": warm, "archer_step": archer_step}
