"""Agent proxy: parse model responses, build token-level contexts, run env groups turn by turn.

Public API::

    from ragen.agent import AgentConfig, EnvGroupSpec, AgentProxy, parse_response, ParsedResponse
    proxy = AgentProxy(engine, tokenizer, AgentConfig(), train_envs=[EnvGroupSpec("bandit", {}, 4, 2)], val_envs=[])
    batch = proxy.rollout("train")   # RolloutBatch (ragen.agent.batch)
"""

from ragen.agent.batch import EpisodeRecord, RolloutBatch, TurnRecord
from ragen.agent.config import AgentConfig, EnvGroupSpec
from ragen.agent.context import ChatFormat, EpisodeContext
from ragen.agent.parser import ParsedResponse, parse_response
from ragen.agent.rollout import AgentProxy

__all__ = [
    "AgentConfig",
    "AgentProxy",
    "ChatFormat",
    "EnvGroupSpec",
    "EpisodeContext",
    "EpisodeRecord",
    "ParsedResponse",
    "RolloutBatch",
    "TurnRecord",
    "parse_response",
]
