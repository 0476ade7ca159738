"""ragen <-> verl (verl 0.9.1): ragen's envs as a verl agent loop, and verl's ``core_algos`` as an oracle in tests.

Pure parts (no verl import): ``convert`` (a ragen episode as verl's agent-loop fields) and ``episode`` (one
episode through ragen's agent proxy against an async ``generate``). ``agent_loop`` imports verl and registers
the ``ragen`` agent loop. Install: ``bash scripts/setup_verl.sh`` (see README.md here).
"""

from pathlib import Path

from ragen_external.verl.convert import VerlEpisode, episode_to_agent_loop_output, turn_level_rm_scores
from ragen_external.verl.episode import EpisodeSpec, make_dataset_rows, run_episode, spec_from_row

VERL_VERSION = "0.9.1"
# verl's actor_rollout_ref.rollout.agent.agent_loop_config_path: registers the ``ragen`` agent loop
AGENT_LOOP_CONFIG = str(Path(__file__).with_name("agent_loop.yaml"))

__all__ = [
    "AGENT_LOOP_CONFIG",
    "VERL_VERSION",
    "EpisodeSpec",
    "VerlEpisode",
    "episode_to_agent_loop_output",
    "make_dataset_rows",
    "run_episode",
    "spec_from_row",
    "turn_level_rm_scores",
]
