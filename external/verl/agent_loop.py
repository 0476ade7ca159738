"""ragen's envs as a verl agent loop (written against verl 0.9.1, ``verl.experimental.agent_loop``).

Registered as ``ragen``. A verl user trains on ragen envs with::

    actor_rollout_ref.rollout.agent.agent_loop_config_path=<ragen_external/verl/agent_loop.yaml>
    actor_rollout_ref.rollout.agent.default_agent_loop=ragen
    # verl's legacy trainer only (its default v1 trainer takes rm_scores from RagenAgentLoopOutput.as_dict):
    +actor_rollout_ref.rollout.agent.agent_loop_manager_class=ragen_external.verl.manager.RagenAgentLoopManager
    trainer.use_v1=false

and a dataset whose rows name the env and seed (``make_dataset_rows``). Per row, ``run`` plays one episode with
ragen's agent proxy (``episode.run_episode``: append-only token context, ragen's parser and env registry), each
turn sampled by verl's server manager, and returns the episode as verl's ``AgentLoopOutput``
(``convert.episode_to_agent_loop_output``: env tokens response_mask 0, model tokens 1, per-turn rewards on each
turn's last model token in ``extra_fields`` and in ``rm_scores``, their sum as ``reward_score``). Rows with the
same seed form a group (verl's ``rollout.n`` repeats a row), as ragen's groups share an env seed.

Importing this module imports verl; the pure parts live in ``convert`` and ``episode``.
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any

import torch
import verl
from ragen_external.verl import check_verl_version
from ragen_external.verl.convert import VerlEpisode, episode_to_agent_loop_output
from ragen_external.verl.episode import run_episode, spec_from_row
from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from ragen.agent import AgentConfig

check_verl_version(verl.__version__)
_AGENT_KEYS = {f.name for f in fields(AgentConfig)}


class RagenAgentLoopOutput(AgentLoopOutput):
    """verl's ``AgentLoopOutput`` whose ``rm_scores`` carry ragen's per-turn placement.

    verl's own ``as_dict`` puts ``reward_score`` (the episode total) on the last response token. verl 0.9.1's
    default trainer (``trainer.use_v1=true``, TransferQueue) stores ``as_dict()``'s ``rm_scores`` per trajectory
    and trains on them (``AgentLoopWorkerTQ._agent_loop_postprocess``), so here each turn's reward sits on the
    turn's last model token instead (``extra_fields["ragen_token_rewards"]``, same sum). verl's legacy trainer
    (``trainer.use_v1=false``) does not call ``as_dict``: it needs ``manager.RagenAgentLoopManager``.
    """

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        rewards = self.extra_fields.get("ragen_token_rewards")
        if rewards is not None and "rm_scores" in out:
            out["rm_scores"] = torch.tensor(list(rewards), dtype=torch.float32)
        return out


def to_agent_loop_output(ep: VerlEpisode, *, with_logprobs: bool = True) -> Any:
    """verl's ``AgentLoopOutput`` of ``ep`` (``convert.VerlEpisode``): a :class:`RagenAgentLoopOutput`, whose
    ``as_dict`` puts the per-turn rewards into ``rm_scores``. Per-turn rewards ride in ``extra_fields``:
    ``turn_scores`` (verl's key, one reward per turn), ``ragen_token_rewards`` (see ``place_turn_rewards``),
    ``ragen_reward_positions``; ``reward_extra_info`` carries the episode metrics (``ragen_<name>``)."""
    return RagenAgentLoopOutput(
        prompt_ids=ep.prompt_ids,
        response_ids=ep.response_ids,
        response_mask=ep.response_mask,
        response_logprobs=ep.response_logprobs if with_logprobs else None,
        reward_score=ep.reward_score,
        num_turns=ep.num_turns,
        metrics=AgentLoopMetrics(),
        extra_fields={
            "turn_scores": list(ep.turn_rewards),
            "ragen_token_rewards": list(ep.token_rewards),
            "ragen_reward_positions": list(ep.reward_positions),
            "reward_extra_info": {f"ragen_{k}": v for k, v in ep.metrics.items()},
        },
    )


def agent_config(overrides: dict[str, Any], prompt_length: int, response_length: int) -> AgentConfig:
    """ragen's ``AgentConfig`` for one row: the row's overrides, ``layout="trajectory"`` (verl trains one sequence
    per episode) and ``max_model_len = prompt_length + response_length`` (verl's budget for one sequence)."""
    unknown = sorted(set(overrides) - _AGENT_KEYS)
    if unknown:
        raise ValueError(f"extra_info.ragen_agent has unknown keys {unknown}; valid: {sorted(_AGENT_KEYS)}")
    if overrides.get("layout", "trajectory") != "trajectory" or overrides.get("max_context_window") is not None:
        raise ValueError("the verl agent loop trains one sequence per episode: keep layout=trajectory and "
                         "max_context_window=None in extra_info.ragen_agent")
    return AgentConfig(**{**overrides, "max_model_len": prompt_length + response_length})


@functools.cache
def _episode_threads(n: int) -> ThreadPoolExecutor:
    """Threads that run episodes (each mostly waits on ``generate``); not the loop's default executor, whose
    min(32, cpus + 4) threads would cap how many episodes of a batch are in flight."""
    return ThreadPoolExecutor(max_workers=n, thread_name_prefix="ragen-episode")


@register("ragen")
class RagenAgentLoop(AgentLoopBase):
    """One ragen episode per dataset row (see the module docstring)."""

    max_concurrent_episodes = 256  # per verl agent-loop worker process

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        spec = spec_from_row(kwargs)
        prompt_length = int(self.rollout_config.prompt_length)
        response_length = int(self.rollout_config.response_length)
        agent = agent_config(spec.agent, prompt_length, response_length)
        loop = asyncio.get_running_loop()
        batch = await loop.run_in_executor(
            _episode_threads(self.max_concurrent_episodes),
            functools.partial(run_episode, self.server_manager.generate, loop, self.tokenizer, agent, spec,
                              sampling_params),
        )
        ep = episode_to_agent_loop_output(batch, 0)
        if len(ep.prompt_ids) > prompt_length or len(ep.response_ids) > response_length:
            raise ValueError(
                f"ragen episode of {spec.env} seed {spec.seed}: prompt {len(ep.prompt_ids)} / response "
                f"{len(ep.response_ids)} tokens exceed rollout.prompt_length={prompt_length} / "
                f"response_length={response_length}; raise them or lower ragen_agent max_turn / max_new_tokens"
            )
        return to_agent_loop_output(ep, with_logprobs=bool(sampling_params.get("logprobs", True)))
