"""Typed configuration of the agent proxy: how turns are run and which env groups are rolled out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragen.agent.layout import row_layout

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

    @property
    def stop_strings(self) -> tuple[str, ...]:
        """Stop strings of every engine call: the closing answer tag when ``stop_at_answer`` (else none)."""
        return (f"</{self.answer_tag}>",) if self.stop_at_answer else ()

    def __post_init__(self) -> None:
        if self.max_turn < 1:
            raise ValueError(f"AgentConfig.max_turn must be >= 1, got {self.max_turn}")
        if self.max_actions_per_turn < 1:
            raise ValueError(f"AgentConfig.max_actions_per_turn must be >= 1, got {self.max_actions_per_turn}")
        if not self.action_sep:
            raise ValueError("AgentConfig.action_sep must be a non-empty string such as '||'")
        if self.max_context_window is not None and self.max_context_window < 0:
            raise ValueError(f"AgentConfig.max_context_window must be None or >= 0, got {self.max_context_window}")
        if self.max_new_tokens < 1:
            raise ValueError(f"AgentConfig.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.max_model_len <= self.max_new_tokens:
            raise ValueError(
                f"AgentConfig.max_model_len ({self.max_model_len}) must exceed max_new_tokens ({self.max_new_tokens})"
            )
        if self.temperature < 0:  # 0 = greedy (validation); training needs > 0, checked by ActorConfig
            raise ValueError(f"AgentConfig.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        rows = row_layout(self.layout)  # a ValueError names the layouts
        if self.reminder not in REMINDERS:
            raise ValueError(f"AgentConfig.reminder must be one of {REMINDERS}, got {self.reminder!r}")
        if self.history_thinking not in HISTORY_THINKING:
            raise ValueError(f"AgentConfig.history_thinking must be one of {HISTORY_THINKING}, got "
                             f"{self.history_thinking!r}")
        if self.history_thinking not in rows.history_thinking:
            raise ValueError("AgentConfig.history_thinking='strip' needs layout='turn' (a trajectory row holds every "
                             "turn's thinking, which later prompts leave out)")
        if self.observations not in OBSERVATIONS:
            raise ValueError(f"AgentConfig.observations must be one of {OBSERVATIONS}, got {self.observations!r}")
        if self.env_step_timeout is not None and not self.env_step_timeout >= 0:
            raise ValueError(f"AgentConfig.env_step_timeout must be None or >= 0 seconds, got {self.env_step_timeout}")
        if not self.think_tag or not self.answer_tag:
            raise ValueError("AgentConfig.think_tag and answer_tag must be non-empty tag names")


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
