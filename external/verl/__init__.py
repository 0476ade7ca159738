"""ragen <-> verl (verl 0.9.1): ragen's envs as a verl agent loop, and verl's ``core_algos`` as an oracle in tests.

Pure parts (no verl import): ``convert`` (a ragen episode as verl's agent-loop fields) and ``episode`` (one
episode through ragen's agent proxy against an async ``generate``). ``agent_loop`` imports verl and registers
the ``ragen`` agent loop; ``manager`` (imports verl and ray) is verl's agent-loop manager whose workers put
per-turn rewards into ``rm_scores`` for verl's legacy trainer. Both warn once when verl is not 0.9.x.
Install: ``bash scripts/setup_verl.sh`` (see README.md here).
"""

import warnings
from pathlib import Path

from ragen_external.verl.convert import (
    VerlEpisode,
    episode_to_agent_loop_output,
    place_turn_rewards,
    turn_level_rm_scores,
)
from ragen_external.verl.episode import EpisodeSpec, make_dataset_rows, run_episode, spec_from_row

VERL_VERSION = "0.9.1"
SUPPORTED_VERL_SERIES = "0.9"  # verl releases this bridge accepts without a warning (0.9.x)
# verl's actor_rollout_ref.rollout.agent.agent_loop_config_path: registers the ``ragen`` agent loop
AGENT_LOOP_CONFIG = str(Path(__file__).with_name("agent_loop.yaml"))

_warned_versions: set[str] = set()


def check_verl_version(installed: str) -> bool:
    """True when ``installed`` (``verl.__version__``) is a 0.9.x release; otherwise warn (once per version per
    process) naming the installed and the supported version: the bridge subclasses and calls verl internals
    (``AgentLoopWorker._postprocess``, ``AgentLoopOutput.as_dict``) that other releases may change."""
    parts = str(installed).split(".")
    if parts[:2] == SUPPORTED_VERL_SERIES.split("."):
        return True
    if installed not in _warned_versions:
        _warned_versions.add(installed)
        warnings.warn(
            f"ragen_external.verl is written against verl {VERL_VERSION} ({SUPPORTED_VERL_SERIES}.x); verl {installed} "
            f"is installed: the agent loop and its reward placement may not match it (bash scripts/setup_verl.sh "
            f"installs {VERL_VERSION})",
            stacklevel=2,
        )
    return False


__all__ = [
    "AGENT_LOOP_CONFIG",
    "SUPPORTED_VERL_SERIES",
    "VERL_VERSION",
    "EpisodeSpec",
    "VerlEpisode",
    "check_verl_version",
    "episode_to_agent_loop_output",
    "make_dataset_rows",
    "place_turn_rewards",
    "run_episode",
    "spec_from_row",
    "turn_level_rm_scores",
]
