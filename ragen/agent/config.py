"""Typed configuration of the agent proxy: how turns are run and which env groups are rolled out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ragen.agent.layout import ROW_LAYOUTS

REMINDERS = ("every_turn", "first_turn")
HISTORY_THINKING = ("keep", "strip")
OBSERVATIONS = ("shown", "blind")


@dataclass(frozen=True)
class AgentConfig:
    """How the proxy talks to the model.

    ``max_context_window`` keeps the last N turns of history in each prompt (None = all turns).
    ``max_model_len`` bounds prompt + response tokens of every engine call; when a prompt would not leave
    room for ``max_new_tokens``, history is dropped oldest-first (metric ``agent/context_truncations``).
    ``format_penalty`` is added to the reward of a turn whose response could not be parsed.
    ``layout``: ``"trajectory"`` = one row per episode, ``"turn"`` = one row per turn (docs/design.md, the two layouts).
    ``response_prefix``: text forced at the start of every response (e.g. ``"<answer>"`` with ``think=False``),
    appended to each prompt as prompt tokens (response_mask 0); the parser reads prefix + response. Small models
    that rarely open the answer tag on their own learn from format-valid turns this way.
    ``stop_at_answer``: generation stops at the closing answer tag (the token completing it is kept and is the
    turn's last model token, where its reward sits; the end-of-turn token appended after it has response mask 0),
    so nothing the model writes after its action is sampled, trained on or paid for.
    ``env_step_timeout``: seconds an env call (reset, step, legal actions) may take before the episode is failed
    (counted in ``rollout/env_errors``, masked); None or 0 = no limit.
    ``reminder``: ``"every_turn"`` = every user message ends with the turn budget and the answer format;
    ``"first_turn"`` = only the first (and one after an unparsed answer) does, others say only how many actions are
    left: the history already holds the first message (on 3x3 FrozenLake the reminder is 49 of a later turn's 88
    prompt tokens).
    ``history_thinking``: ``"keep"`` = prompts continue the full episode (a model sees its own earlier thinking);
    ``"strip"`` = each earlier turn's thinking (through its last ``</think_tag>``) is cut from later prompts, as
    reasoning models' chat templates render history (Qwen3: what the model sees at deployment;
    ``ragen.agent.thinking``). Needs ``layout="turn"``: a trajectory row holds every turn's thinking, which later
    prompts no longer do.
    ``observations``: ``"shown"`` = the env's observation text goes into each user message; ``"blind"`` = a control
    for learning claims: every observation (the first one included) is replaced by a constant filler text of the
    same token count (:func:`ragen.agent.blind.blind_text`), so prompts keep their length, turn structure and legal
    actions, but the policy cannot read the state. What a policy reaches blind, an open-loop policy can reach.
    ``env_workers``: at most this many threads step (and reset) the envs of a batch at once (never more than the
    batch's episodes), so envs whose calls wait on I/O (a search tool, a sandbox, a remote service) cost the slowest
    call of a turn instead of the sum of all calls; 1 = one env after another in the calling thread. Results are
    identical for any value (each env owns its state and RNG; what the shipped envs share is locked). A speed knob
    for I/O-bound envs only: pure-Python, CPU-bound envs gain nothing under the GIL. A plugin env whose instances
    share unsynchronised state must lock it or run with 1 (``ragen.agent.env_manager``).
    """

    max_turn: int = 5
    max_actions_per_turn: int = 1
    action_sep: str = "||"
    max_context_window: int | None = None
    max_model_len: int = 2048
    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    format_penalty: float = -0.1
    think: bool = True
    think_tag: str = "think"
    answer_tag: str = "answer"
    layout: str = "trajectory"
    system_prompt: str | None = None
    response_prefix: str = ""
    stop_at_answer: bool = True
    env_step_timeout: float | None = 60.0
    reminder: str = "every_turn"
    history_thinking: str = "keep"
    observations: str = "shown"
    env_workers: int = 32

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Stop strings of every engine call: the closing answer tag when ``stop_at_answer`` (else none)."""
        return (f"</{self.answer_tag}>",) if self.stop_at_answer else ()

    def __post_init__(self) -> None:
        problems = agent_problems(self)
        if problems:
            raise ValueError("; ".join(problems))


def _own_key(name: str) -> str:
    return f"AgentConfig.{name}"


def agent_problems(c: Any, key: Callable[[str], str] = _own_key) -> list[str]:
    """The value problems of an ``AgentConfig`` (or anything with its fields, ``c``), each naming the field by
    ``key(field)``: ``AgentConfig.<field>`` by default; the trainer's preflight names its config keys
    (``agent.layout``, ``env.max_turn``)."""
    out = []
    if c.max_turn < 1:
        out.append(f"{key('max_turn')} must be >= 1, got {c.max_turn}")
    if c.max_actions_per_turn < 1:
        out.append(f"{key('max_actions_per_turn')} must be >= 1, got {c.max_actions_per_turn}")
    if not c.action_sep:
        out.append(f"{key('action_sep')} must be a non-empty string such as '||'")
    if c.max_context_window is not None and c.max_context_window < 0:
        out.append(f"{key('max_context_window')} must be None or >= 0, got {c.max_context_window}")
    if c.max_new_tokens < 1:
        out.append(f"{key('max_new_tokens')} must be >= 1, got {c.max_new_tokens}")
    if c.max_model_len <= c.max_new_tokens:
        out.append(f"{key('max_model_len')} ({c.max_model_len}) must exceed max_new_tokens ({c.max_new_tokens})")
    if c.temperature < 0:  # 0 = greedy (validation); training needs > 0, checked by ActorConfig
        out.append(f"{key('temperature')} must be >= 0 (0 = greedy), got {c.temperature}")
    rows = ROW_LAYOUTS.get(c.layout)
    if rows is None:
        out.append(f"{key('layout')} must be one of {tuple(ROW_LAYOUTS)}, got {c.layout!r}")
    if c.reminder not in REMINDERS:
        out.append(f"{key('reminder')} must be one of {REMINDERS}, got {c.reminder!r}")
    if c.history_thinking not in HISTORY_THINKING:
        out.append(f"{key('history_thinking')} must be one of {HISTORY_THINKING}, got {c.history_thinking!r}")
    if rows is not None and c.history_thinking in HISTORY_THINKING and c.history_thinking not in rows.history_thinking:
        out.append(f"{key('history_thinking')}='strip' needs layout='turn' (a trajectory row holds every turn's "
                   "thinking, which later prompts leave out)")
    if c.observations not in OBSERVATIONS:
        out.append(f"{key('observations')} must be one of {OBSERVATIONS}, got {c.observations!r}")
    if c.env_step_timeout is not None and not c.env_step_timeout >= 0:
        out.append(f"{key('env_step_timeout')} must be None or >= 0 seconds, got {c.env_step_timeout}")
    if isinstance(c.env_workers, bool) or not isinstance(c.env_workers, int) or c.env_workers < 1:
        out.append(f"{key('env_workers')} must be an int >= 1, the threads that step envs at once (e.g. 32; 1 = "
                   f"one env after another), got {c.env_workers!r}")
    if not c.think_tag or not c.answer_tag:
        out.append(f"{key('think_tag')} and answer_tag must be non-empty tag names")
    return out


@dataclass(frozen=True)
class EnvGroupSpec:
    """``n_groups`` groups of ``group_size`` envs named ``name`` (built with ``ragen.env.make(name, **config)``).

    The envs of one group share a reset seed and a group id (the groups of group-relative estimators).
    ``max_turn`` / ``max_actions_per_turn`` override the AgentConfig values for these envs.
    """

    name: str
    config: dict[str, Any] = field(default_factory=dict)
    n_groups: int = 1
    group_size: int = 1
    max_turn: int | None = None
    max_actions_per_turn: int | None = None

    def __post_init__(self) -> None:
        if self.n_groups < 1 or self.group_size < 1:
            raise ValueError(
                f"EnvGroupSpec({self.name!r}): n_groups and group_size must be >= 1, "
                f"got {self.n_groups} and {self.group_size}"
            )
        for key in ("max_turn", "max_actions_per_turn"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ValueError(f"EnvGroupSpec({self.name!r}).{key} must be None or >= 1, got {value}")
