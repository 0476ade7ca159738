"""Run one ragen episode through ragen's own agent proxy, sampling from an async ``generate`` (verl's server manager).

The proxy (``ragen.agent.AgentProxy``) is reused whole: env reset/step with failure isolation, the parser, the
append-only token context (``EpisodeContext``: next prompt = previous prompt + sampled ids + template separator
+ the new message rendered alone), turn rewards and the trajectory row (``build_batch``). Only the sampler
changes: the proxy's ``responder`` hook sends each turn's exact prompt ids to ``generate`` and hands the sampled
ids and log-probs back. No verl import: ``generate`` is any coroutine function with the keyword signature of
verl 0.9.1's ``LLMServerClient.generate(request_id, *, prompt_ids, sampling_params) -> TokenOutput``
(``token_ids``, ``log_probs``, ``stop_reason``).

The proxy is synchronous, the verl agent loop is a coroutine: ``run_episode`` is meant to run in a worker thread
(``asyncio.to_thread``) while ``loop`` (the agent loop's event loop) serves the ``generate`` calls.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ragen.agent import AgentConfig, AgentProxy, EnvGroupSpec, RolloutBatch
from ragen.rollout.base import Sample, SamplingParams

Generate = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class EpisodeSpec:
    """Which env and seed one verl dataset row plays (from its ``extra_info``, see ``spec_from_row``)."""

    env: str
    seed: int
    env_config: dict[str, Any] = field(default_factory=dict)
    agent: dict[str, Any] = field(default_factory=dict)  # AgentConfig overrides (max_turn, max_new_tokens, ...)


def spec_from_row(row: dict[str, Any]) -> EpisodeSpec:
    """The episode of a verl dataset row: ``extra_info = {"ragen_env": name, "ragen_seed": int,
    "ragen_env_config": JSON object?, "ragen_agent": JSON object?}`` (``make_dataset_rows`` writes them; the two
    objects are JSON strings so that parquet keeps them whatever their keys, dicts are accepted too)."""
    info = row.get("extra_info") or {}
    if "ragen_env" not in info or "ragen_seed" not in info:
        raise ValueError(
            "a ragen agent-loop row needs extra_info.ragen_env (an env name of ragen.env) and extra_info.ragen_seed; "
            "build the dataset with ragen_external.verl.make_dataset_rows"
        )
    return EpisodeSpec(str(info["ragen_env"]), int(info["ragen_seed"]), _obj(info.get("ragen_env_config")),
                       _obj(info.get("ragen_agent")))


def _obj(value: Any) -> dict[str, Any]:
    return dict(json.loads(value) if isinstance(value, str) else (value or {}))


def make_dataset_rows(env: str, seeds: list[int], env_config: dict | None = None,
                      agent: dict | None = None, agent_name: str = "ragen") -> list[dict[str, Any]]:
    """verl dataset rows (write them to parquet for ``data.train_files``): one per seed. ``prompt`` is a
    placeholder verl's dataset needs; the agent loop builds the real prompt from the env."""
    info = {"ragen_env": env, "ragen_env_config": json.dumps(env_config or {}), "ragen_agent": json.dumps(agent or {})}
    return [
        {"prompt": [{"role": "user", "content": f"{env} seed {s}"}], "data_source": f"ragen/{env}",
         "agent_name": agent_name, "extra_info": {**info, "ragen_seed": int(s)}}
        for s in seeds
    ]  # fmt: skip


def to_verl_sampling(sampling: SamplingParams, base: dict[str, Any]) -> dict[str, Any]:
    """verl's sampling dict for one proxy call: verl's own settings (``base``: temperature, top_p, ...) plus the
    proxy's per-call budget and stops, as keywords of vLLM's ``SamplingParams`` (verl's vLLM server passes them
    on): the stop string is kept in the output, as ragen's engines keep it (the closing answer tag is the turn's
    last model token, where its reward sits)."""
    out = dict(base)
    out.update(max_tokens=sampling.max_new_tokens, stop_token_ids=list(sampling.stop_token_ids), logprobs=True)
    if sampling.stop:
        out.update(stop=list(sampling.stop), include_stop_str_in_output=True)
    return out


def _sample(output: Any, max_tokens: int, stop_ids: tuple[int, ...]) -> Sample:
    ids = [int(t) for t in output.token_ids]
    lps = [float(x) for x in output.log_probs] if output.log_probs else [0.0] * len(ids)
    if getattr(output, "stop_reason", None) == "aborted":
        reason = "abort"
    else:
        reason = "stop" if (ids and ids[-1] in stop_ids) or len(ids) < max_tokens else "length"
    return Sample(ids, lps, reason)


def run_episode(generate: Generate, loop: asyncio.AbstractEventLoop, tokenizer: Any, agent: AgentConfig,
                spec: EpisodeSpec, sampling_params: dict[str, Any]) -> RolloutBatch:
    """Play ``spec`` with ragen's proxy, each turn sampled by ``generate`` on ``loop``; a 1-row trajectory batch.

    Call from a thread other than ``loop``'s (it blocks on each ``generate``). One request id for the whole
    episode (verl's sticky session: the turns share a prefix, the server can reuse its cache).
    """
    request_id = uuid.uuid4().hex
    group = EnvGroupSpec(spec.env, spec.env_config, n_groups=1, group_size=1)
    proxy = AgentProxy(None, tokenizer, agent, train_envs=[group], val_envs=[], seed=spec.seed)

    def responder(slots: list, prompts: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        params = to_verl_sampling(sampling, sampling_params)
        samples = []
        for prompt in prompts:
            fut = asyncio.run_coroutine_threadsafe(
                generate(request_id=request_id, prompt_ids=list(prompt), sampling_params=dict(params)), loop)
            samples.append(_sample(fut.result(), sampling.max_new_tokens, sampling.stop_token_ids))
        return samples

    return proxy.rollout("train", responder=responder)
