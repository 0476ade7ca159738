"""verl's agent-loop manager and worker with ragen's per-turn reward placement (verl 0.9.1, legacy trainer).

verl's ``AgentLoopWorker._postprocess`` batches the agent loops' outputs and writes ``rm_scores`` with each row's
``reward_score`` (for ragen: the episode total) on its last response token. Under GAE that is not what ragen
trains on when turns carry rewards: ragen puts turn k's reward on turn k's last model token, and the returns of
the earlier turns differ (README.md, "ragen envs in a verl run"). ``RagenAgentLoopWorker._postprocess`` calls
verl's and then moves the rows that carry ``ragen_token_rewards`` (``extra_fields`` -> ``non_tensor_batch``) to
ragen's placement (``convert.place_turn_rewards``); every other row, and everything else in the batch, is left
exactly as verl made it. ``RagenAgentLoopManager`` runs these workers (verl's manager uses its
``agent_loop_workers_class`` when a subclass sets one). Select it with::

    actor_rollout_ref.rollout.agent.agent_loop_manager_class=ragen_external.verl.manager.RagenAgentLoopManager

It is for verl's legacy trainer (``trainer.use_v1=false``: ``main_ppo_v0`` / ``RayPPOTrainer``). verl 0.9.1's
default trainer (``trainer.use_v1=true``) drives a TransferQueue manager with another interface and takes
``rm_scores`` from each output's ``as_dict``, which ``agent_loop.RagenAgentLoopOutput`` already places per turn:
there the manager line must be left out, and the manager refuses to start under it.
"""

from __future__ import annotations

from typing import Any

import ray
import verl
from omegaconf import DictConfig
from ragen_external.verl import check_verl_version
from ragen_external.verl.convert import place_turn_rewards
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker
from verl.protocol import DataProto

check_verl_version(verl.__version__)

TOKEN_REWARDS_KEY = "ragen_token_rewards"


class RagenAgentLoopWorker(AgentLoopWorker):
    """verl's agent-loop worker; its batches carry ragen's per-turn ``rm_scores`` on ragen rows."""

    def _postprocess(self, inputs: list[Any], input_non_tensor_batch: dict | None = None,
                     validate: bool = False) -> DataProto:
        out = super()._postprocess(inputs, input_non_tensor_batch=input_non_tensor_batch, validate=validate)
        rewards = out.non_tensor_batch.get(TOKEN_REWARDS_KEY)
        if rewards is None or "rm_scores" not in out.batch.keys():
            return out
        prompt_length = out.batch["prompts"].shape[1]
        response_lengths = out.batch["attention_mask"][:, prompt_length:].sum(dim=1)
        out.batch["rm_scores"] = place_turn_rewards(out.batch["rm_scores"], response_lengths, list(rewards))
        return out


class RagenAgentLoopManager(AgentLoopManager):
    """verl's agent-loop manager running ``RagenAgentLoopWorker`` actors (legacy trainer only, see above)."""

    agent_loop_workers_class = ray.remote(RagenAgentLoopWorker)

    def __init__(self, config: DictConfig, *args: Any, **kwargs: Any):
        if config.trainer.get("use_v1", False):
            raise ValueError(
                "actor_rollout_ref.rollout.agent.agent_loop_manager_class=ragen_external.verl.manager."
                "RagenAgentLoopManager is for verl's legacy trainer, but trainer.use_v1=true (verl's TransferQueue "
                "trainer drives another manager interface). Either drop the agent_loop_manager_class line (under "
                "use_v1 the ragen loop's outputs already place per-turn rewards) or set trainer.use_v1=false."
            )
        super().__init__(config, *args, **kwargs)
