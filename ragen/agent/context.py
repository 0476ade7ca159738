"""Token-level context building: chat-template rendering without re-rendering the conversation.

docs/design.md (building prompts turn by turn): the prompt of turn k+1 is the prompt of turn k, plus the exact ids the
engine sampled, plus the template's separator after its end-of-turn token, plus only the new user message
rendered on its own (with the generation prompt). Nothing about a model family is hard-coded: the
end-of-turn token, the separator and the per-message rendering are all derived from the tokenizer's chat
template (``ChatFormat``).

``EpisodeContext`` holds one episode's full token sequence (the ``trajectory`` layout row) and builds each
turn's prompt from its history view, keeping the last ``max_context_window`` turns and dropping older history when
the prompt would not leave room for the response inside ``max_model_len``. When history is cut, the prompt
starts with a fresh first message (instructions + the observation of the oldest kept turn) followed by
the kept turns' exact tokens; the trajectory row still holds the full, uncut sequence (docs/design.md, the
two layouts: use ``layout="turn"`` when the exact per-turn prompts matter for training).

The history view is the full sequence (``agent.history_thinking=keep``: append-only, a model sees its own earlier
thinking) or, with ``strip_tag`` (``history_thinking=strip``), the sequence with each earlier turn's thinking cut
as a reasoning model's template renders it (``ragen.agent.thinking``): later prompts then differ from the full
sequence, so only the ``turn`` layout, whose rows are the exact prompts, trains on what the model saw.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ragen.agent.thinking import think_cut

_MARK_USER = "\u2063u\u2063"
_MARK_ASSISTANT = "\u2063ASSISTANT_CONTENT\u2063"


class ChatFormat:
    """What a tokenizer's chat template looks like at the token level.

    Derived once by rendering tiny conversations:
      * ``eot_id``: the end-of-turn token that closes an assistant message (first special token after the
        assistant content; falls back to ``tokenizer.eos_token_id`` when the template emits none);
      * ``separator_ids``: what the template puts after that token before the next message (e.g. ``"\\n"``);
      * ``first_prompt(text)``: [system?, user(text)] with the generation prompt;
      * ``next_message(text)``: only a new user message plus the generation prompt, as rendered after an
        assistant message.
    """

    def __init__(self, tokenizer: Any, system_prompt: str | None = None, response_prefix: str = "") -> None:
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"tokenizer {type(tokenizer).__name__} has no chat template; the agent proxy needs one "
                "(set tokenizer.chat_template, or use an instruct model such as the default smollm2-135m-instruct)"
            )
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        # Text forced at the start of every assistant turn (e.g. "<answer>"), placed after the generation
        # prompt as prompt tokens: the model continues from it, the parser reads prefix + response.
        self.response_prefix = response_prefix
        self._prefix_ids: list[int] = []
        system = [] if system_prompt is None else [{"role": "system", "content": system_prompt}]
        self._base: list[dict[str, str]] = system
        self._prefix_text = self._render(
            [{"role": "user", "content": _MARK_USER}, {"role": "assistant", "content": _MARK_ASSISTANT}], False
        )
        pos = self._prefix_text.rfind(_MARK_ASSISTANT)
        if pos < 0:
            raise ValueError("the chat template dropped the assistant content; cannot derive its end-of-turn token")
        tail_ids = self.encode(self._prefix_text[pos + len(_MARK_ASSISTANT) :])
        specials = set(getattr(tokenizer, "all_special_ids", []) or [])
        cut = next((i for i, t in enumerate(tail_ids) if t in specials), None)
        if cut is None:
            if tokenizer.eos_token_id is None:
                raise ValueError("the chat template emits no end-of-turn special token and the tokenizer has no eos")
            self.eot_id = int(tokenizer.eos_token_id)
            self.separator_ids = tail_ids
        else:
            self.eot_id = int(tail_ids[cut])
            self.separator_ids = tail_ids[cut + 1 :]
        self._prefix_ids = self.encode(response_prefix) if response_prefix else []

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            self._base + messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, expected str")
        return text

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` without extra special tokens (the template text already holds BOS etc.)."""
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        """Text of a response with special tokens removed (what the parser sees)."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def decode_raw(self, ids: list[int]) -> str:
        """Text of ``ids`` with special tokens kept (every token shows in the text: token boundaries in text)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @property
    def prefix_ids(self) -> list[int]:
        """Ids of ``response_prefix``, the end of every prompt and the start of every assistant message."""
        return self._prefix_ids

    def first_prompt(self, user_text: str) -> list[int]:
        """Ids of [system?, user(user_text)] + generation prompt."""
        return self.encode(self._render([{"role": "user", "content": user_text}], True)) + self._prefix_ids

    def next_message(self, user_text: str) -> list[int]:
        """Ids of one new user message + generation prompt, as the template renders it after an assistant turn.

        The separator after the previous end-of-turn token is NOT included (see ``separator_ids``).
        """
        full = self._render(
            [
                {"role": "user", "content": _MARK_USER},
                {"role": "assistant", "content": _MARK_ASSISTANT},
                {"role": "user", "content": user_text},
            ],
            True,
        )
        if not full.startswith(self._prefix_text):
            raise ValueError(
                "the chat template re-renders earlier messages when a message is added; the proxy cannot build "
                "prompts incrementally with it (use a template whose rendering of earlier turns is stable)"
            )
        return self.encode(full[len(self._prefix_text) :]) + self._prefix_ids


@dataclass
class PromptPlan:
    """One turn's engine input: ``ids``, the response budget, and whether history was cut to fit."""

    ids: list[int]
    max_new_tokens: int
    start_turn: int  # oldest turn whose tokens are in the prompt (0 = full history)
    truncated: bool  # history was dropped because of max_model_len (not because of the window)


@dataclass
class EpisodeContext:
    """One episode's token sequence and per-token labels, grown turn by turn.

    ``ids``/``log_probs``/``turn_ids`` cover the full sequence ``[prompt][turn 0][env][turn 1]...``;
    ``turn_ids`` is k on model tokens of turn k and -1 elsewhere (prompt, env tokens, appended end tokens).
    ``view`` is the history later prompts continue from (module docstring): ``ids`` itself, or with ``strip_tag``
    (a closing think tag, e.g. ``"</think>"``) ``ids`` with each closed turn's thinking cut; ``view_starts[k]`` is
    where turn k's assistant message (forced response prefix, then the response) starts in it.
    ``think_cuts[k]``: how many leading ids of turn k's assistant message the view leaves out (0: no closing tag or
    ``strip_tag`` None; None: kept whole, ``think_cut`` found no token boundary after the tag).
    """

    fmt: ChatFormat
    instructions: str
    strip_tag: str | None = None
    user_texts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    turn_ids: list[int] = field(default_factory=list)
    turn_starts: list[int] = field(default_factory=list)  # index in ``ids`` where turn k's response starts
    turn_prompts: list[list[int]] = field(default_factory=list)  # the exact prompt of each generated turn
    responses: list[tuple[list[int], list[float]]] = field(default_factory=list)  # sampled ids, log-probs
    turn_versions: list[int] = field(default_factory=list)  # policy version of each response (-1: not versioned)
    history_cut: bool = False  # some generated turn's prompt did not hold the full history (use_plan sets it)
    closed_len: int = 0  # len(ids) after the last response and its end-of-turn token (0 before the first turn)
    view: list[int] = field(default_factory=list)
    view_starts: list[int] = field(default_factory=list)
    think_cuts: list[int | None] = field(default_factory=list)
    _heads: dict[int, list[int]] = field(default_factory=dict)

    def head(self, turn: int) -> list[int]:
        """First-message prompt that starts at ``turn``'s observation (turn 0: the real episode start)."""
        if turn not in self._heads:
            self._heads[turn] = self.fmt.first_prompt(f"{self.instructions}\n\n{self.user_texts[turn]}")
        return self._heads[turn]

    def add_user(self, text: str) -> None:
        """Append the next user message (the first one becomes the episode's prompt)."""
        self.user_texts.append(text)
        new = self.head(0) if len(self.user_texts) == 1 else self.fmt.separator_ids + self.fmt.next_message(text)
        self._extend(new, -1)
        self.view.extend(new)

    def add_response(self, ids: list[int], log_probs: list[float], version: int = -1) -> None:
        """Append the sampled ids of the current turn, sampled under policy ``version`` (-1: an engine without
        versions, ``ragen.rollout.versioned``); close it with the end-of-turn token if it is missing. The history
        view gets the turn's assistant message, its thinking cut with ``strip_tag``."""
        turn = len(self.turn_starts)
        self.responses.append((list(ids), [float(x) for x in log_probs]))
        self.turn_versions.append(int(version))
        self.turn_starts.append(len(self.ids))
        self.ids.extend(ids)
        self.log_probs.extend(float(x) for x in log_probs)
        self.turn_ids.extend([turn] * len(ids))
        close = [] if ids and ids[-1] == self.fmt.eot_id else [self.fmt.eot_id]
        self._extend(close, -1)
        self.closed_len = len(self.ids)
        start = len(self.view) - len(self.fmt.prefix_ids)  # the prompt ends with the forced response prefix
        message = self.view[start:] + list(ids) + close
        cut = 0 if self.strip_tag is None else think_cut(self.fmt.decode_raw, message, self.strip_tag)
        self.think_cuts.append(cut)
        self.view[start:] = message[cut or 0:]
        self.view_starts.append(start)

    def _extend(self, ids: list[int], turn: int) -> None:
        self.ids.extend(ids)
        self.log_probs.extend([0.0] * len(ids))
        self.turn_ids.extend([turn] * len(ids))

    @property
    def num_turns(self) -> int:
        return len(self.turn_starts)

    def _history_from(self, start: int) -> list[int]:
        """The prompt that keeps turns ``start..`` of the history view: the view itself (``start == 0``), else a
        fresh first message at ``start``'s observation, then the view from turn ``start``'s assistant message
        (``start == num_turns``: the first message alone)."""
        if start == 0:
            return list(self.view)
        head = self.head(start)
        if start >= self.num_turns:
            return list(head)
        return head[: len(head) - len(self.fmt.prefix_ids)] + self.view[self.view_starts[start]:]

    def _prompt_len(self, start: int) -> int:
        """Length of :meth:`_history_from` ``(start)``, without building it."""
        if start == 0:
            return len(self.view)
        head = len(self.head(start))
        if start >= self.num_turns:
            return head
        return head - len(self.fmt.prefix_ids) + len(self.view) - self.view_starts[start]

    def plan(self, window: int | None, max_model_len: int, max_new_tokens: int) -> PromptPlan:
        """The prompt of the next turn: the last ``window`` turns of history that leave room for the response.

        History is dropped oldest-first while ``len(prompt) + max_new_tokens > max_model_len``, down to the
        history-free prompt ``head(k)`` (a fresh first message with only the latest observation). When even that
        does not fit, the response budget shrinks to what is left (possibly < 1: the caller then ends the episode
        as truncated). Pure: the caller records the plan it uses with :meth:`use_plan`.
        """
        k = self.num_turns
        first = 0 if window is None else max(0, k - window)
        start = first
        while start < k and self._prompt_len(start) + max_new_tokens > max_model_len:
            start += 1
        ids = self._history_from(start)
        budget = min(max_new_tokens, max_model_len - len(ids))
        return PromptPlan(ids=ids, max_new_tokens=budget, start_turn=start, truncated=start > first)

    def bootstrap_prompt(self, window: int | None, max_model_len: int, max_new_tokens: int) -> list[int]:
        """The state after the last response, as a prompt within the length budget: V of it is the bootstrap of an
        episode cut by the length budget (docs/design.md, position conventions; the same ids in both layouts).

        It is the next generation prompt cut by :meth:`plan`'s own rule (the last ``window`` turns, history dropped
        oldest-first until ``prompt + max_new_tokens`` fits ``max_model_len``, down to the history-free prompt).
        An episode is cut exactly when even the history-free prompt leaves no room for a response, so that prompt
        is then kept to its last ``max_model_len`` tokens: the generation prompt and the newest part of the
        observation, the text nearest the decision. Never longer than ``max_model_len``."""
        return self.plan(window, max_model_len, max_new_tokens).ids[-max_model_len:]

    def trained_ids(self, max_model_len: int) -> list[int]:
        """The ``trajectory`` layout row: the sequence up to the last response's end-of-turn token (a user message
        that was never answered, such as the observation that did not fit the budget, belongs to no trained state:
        its value enters through :meth:`bootstrap_prompt`), at most ``max_model_len`` tokens (a row longer than that
        held a cut history and trains nothing, or ends with an appended end-of-turn token past the budget)."""
        end = self.closed_len if self.num_turns else len(self.ids)
        return self.ids[: min(end, max_model_len)]

    def use_plan(self, plan: PromptPlan) -> None:
        """Record that the next turn is generated from ``plan`` (its exact prompt; whether it cut history)."""
        self.turn_prompts.append(plan.ids)
        self.history_cut = self.history_cut or plan.start_turn > 0
