"""The program rollout driver: a batch of episodes played by the user's agent program against the gateway
(docs/gateway.md, "Training a program"), beside the env proxy (``ragen.agent.rollout``), returning the same
``RolloutBatch``.

Per rollout: the gateway (``ragen.gateway.server``) starts on 127.0.0.1 and a free port over the run's engine, with
the run's sampling settings (``agent.temperature`` / ``top_p`` / ``top_k``, ``agent.max_new_tokens`` per call,
``agent.max_model_len`` for prompt + completion); one program run per episode (``n_groups`` groups of
``group_size`` episodes, the episodes of a group sharing the task and the seed) runs at once with
``env.config.timeout_s`` each (``ragen.gateway.program.run_programs``); the gateway stops (its port closes) and each
episode's recorded calls become rows (``ragen.agent.program_batch``).

Seeds follow the env proxy's (``EnvManager.group_seeds``): group ``g`` of train rollout ``c`` plays
``seed + c * n_groups + g``, validation plays ``val_seed + g``. The engine samples without a fixed seed: which calls
share an engine batch depends on when programs send them, so a rollout is not reproducible sample for sample.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragen.agent.batch import RolloutBatch
from ragen.agent.config import AgentConfig, EnvGroupSpec
from ragen.agent.context import ChatFormat
from ragen.agent.layout import row_layout
from ragen.agent.program_batch import ProgramEpisode, program_batch
from ragen.env import make
from ragen.gateway.expert import ExpertEngine
from ragen.gateway.program import ProgramResult, ProgramTask, call_rewards, run_programs
from ragen.gateway.server import Gateway, GatewayConfig, GatewayThread
from ragen.rollout.base import SamplingParams

_LOG = logging.getLogger(__name__)
API_KEY = "ragen"  # the api key handed to programs: the endpoint checks none


@dataclass(frozen=True)
class ProgramGroups:
    """``n_groups`` groups of ``group_size`` runs of the program configured by ``config`` (the ``agent_program``
    env's keywords, ``ragen.env.agent_program``)."""

    config: dict[str, Any]
    n_groups: int
    group_size: int

    @classmethod
    def of(cls, spec: EnvGroupSpec) -> ProgramGroups:
        return cls(dict(spec.config), spec.n_groups, spec.group_size)


class ProgramProxy:
    """Rolls out the program of ``train`` / ``val`` with ``engine`` (module docstring); used by the trainers as
    the agent proxy is (``rollout``, ``state_dict``, ``pad_id``)."""

    def __init__(self, engine: Any, tokenizer: Any, agent: AgentConfig, train: ProgramGroups,
                 val: ProgramGroups | None, *, seed: int = 0, val_seed: int = 123456) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.cfg = agent
        self.layout = row_layout(agent.layout).name
        self.fmt = ChatFormat(tokenizer, agent.system_prompt, agent.response_prefix)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(self.fmt.eot_id if pad is None else pad)
        self.groups = {"train": train, **({"val": val} if val is not None else {})}
        self.seed, self.val_seed, self.train_calls = int(seed), int(val_seed), 0
        self.last_port: int | None = None  # the port of the latest rollout's gateway (closed once it returned)

    def state_dict(self) -> dict[str, int]:
        """The seed counters (everything needed to resume the same train seed sequence)."""
        return {"seed": self.seed, "val_seed": self.val_seed, "train_calls": self.train_calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.val_seed = int(state["seed"]), int(state["val_seed"])
        self.train_calls = int(state["train_calls"])

    def expert_responder(self) -> ExpertEngine:
        """The engine of a warm start's rollouts: the train program's expert (``env.config.expert``) writing every
        answer (``ragen.gateway.expert``); pass it to :meth:`rollout` as ``responder``."""
        expert = make("agent_program", **self.groups["train"].config).expert
        if expert is None:
            raise ValueError("a warm start of an agent program needs its expert: set env.config.expert="
                             "<module>:<function> (prompt text -> answer text)")
        return ExpertEngine(self.tokenizer, expert, self.fmt.eot_id)

    def rollout(self, mode: str = "train", responder: Any = None) -> RolloutBatch:
        """One batch of program runs: ``"train"`` advances the seeds each call, ``"val"`` uses fixed seeds.
        ``responder``: an engine that answers instead of the run's (a warm start's :meth:`expert_responder`)."""
        if mode not in self.groups:
            raise ValueError(f"unknown rollout mode {mode!r}; valid modes: {sorted(self.groups)}")
        groups = self.groups[mode]
        if mode == "train":
            base = self.seed + self.train_calls * groups.n_groups
            self.train_calls += 1
        else:
            base = self.val_seed
        program = make("agent_program", **groups.config)
        tasks = [ProgramTask(f"g{g}-e{i}", program.task(base + g), base + g)
                 for g in range(groups.n_groups) for i in range(groups.group_size)]
        start = time.perf_counter()
        episodes = self.play(program, tasks, groups.group_size, self.engine if responder is None else responder)
        batch = program_batch(episodes, self.layout, self.pad_id, program.format_penalty)
        batch.metrics["gateway/time/rollout_s"] = time.perf_counter() - start
        _log_failures(episodes, mode)
        return batch

    def play(self, program: Any, tasks: Sequence[ProgramTask], group_size: int, engine: Any) -> list[ProgramEpisode]:
        """Run ``program`` once per task against a gateway of its own over ``engine``, and collect each run's
        episode."""
        ag = self.cfg
        sampling = SamplingParams(temperature=ag.temperature, top_p=ag.top_p, top_k=ag.top_k,
                                  max_new_tokens=ag.max_new_tokens)
        gateway = Gateway(engine, self.tokenizer, sampling, GatewayConfig(
            model=program.model, max_model_len=ag.max_model_len, tool_format=program.tool_parser))
        with GatewayThread(gateway) as thread:
            self.last_port = gateway.port
            results: list[ProgramResult] = thread.submit(
                run_programs(gateway, program.entry, tasks, program.timeout_s, API_KEY))

            def collect() -> list[ProgramEpisode]:
                return [_episode(gateway, task, result, i // group_size)
                        for i, (task, result) in enumerate(zip(tasks, results, strict=True))]

            return thread.call(collect)


def _episode(gateway: Gateway, task: ProgramTask, result: ProgramResult, group: int) -> ProgramEpisode:
    """One run's episode from the gateway's log of it; per-call rewards naming no call of it fail it."""
    log = gateway.book.episode(task.episode)
    per_call = None
    if result.per_call is not None and not result.failed:
        try:
            per_call = call_rewards(log.calls, result.per_call)
        except ValueError as exc:
            log.fail(str(exc))
    failed = result.failed or log.failed
    return ProgramEpisode(list(log.calls), result.reward, failed, "; ".join(log.errors) if failed else "", group,
                          task.seed, [gateway.renderer.completion_text(c.sampled_ids) for c in log.calls], per_call)


def _log_failures(episodes: Sequence[ProgramEpisode], mode: str, shown: int = 5) -> None:
    """Log the failed program runs (seed, group, error; the first ``shown`` of them)."""
    failed = [ep for ep in episodes if ep.failed]
    for ep in failed[:shown]:
        _LOG.warning("[ragen] %s rollout: agent program seed %d (group %d) failed and is masked: %s", mode, ep.seed,
                     ep.group_id, ep.error)
    if len(failed) > shown:
        _LOG.warning("[ragen] %s rollout: %d more failed program runs", mode, len(failed) - shown)
