"""The agent proxy: runs env groups turn by turn against an engine and returns a ``RolloutBatch``.

Per turn, one ``engine.generate`` call covers every active env (finished, failed and over-budget envs are
not generated for). Each response is parsed (``parse_response``); a well-formed answer's actions (at most
the per-env ``max_actions_per_turn``, the rest ignored) are executed in order, stopping early when the
episode ends; the turn reward is the sum of their rewards. A malformed response executes no action: the
turn reward is ``format_penalty``, the env state is unchanged, the turn still counts towards ``max_turn``,
and the next prompt says the previous answer was not understood.

Failed envs (exception in the env) keep a row in the batch so shapes and group sizes stay fixed, but the
row trains nothing: its ``response_mask`` and ``token_rewards`` are zeroed and ``turn_ids`` set to -1;
``RolloutBatch.failed`` (B,) bool flags them, ``env/<name>/failed`` and ``rollout/env_errors`` count them, and
each is logged with its env, seed and error (env calls past ``env_step_timeout`` and malformed step results fail too).
A sample the engine ends with a finish reason in ``DROPPED_REASONS`` (vLLM's abort / error) fails its slot the
same way (``agent/engine_dropped`` counts them); vLLM's "repetition" ends a real sample (kept;
``agent/repetition_stops``). Trainers using group-relative estimators may also drop the row's whole group with
``batch.select``.

Rows are right-padded with ``tokenizer.pad_token_id`` (the end-of-turn id when the tokenizer has none).
Generation stops at the template's end-of-turn token, or at the closing answer tag (``stop_at_answer``); a
response that does not end with the end-of-turn token (stopped at the tag, or cut by the token budget) is closed
with that token as a non-model token (response_mask 0). ``agent/time/*`` metrics split rollout time into generation
and everything else; ``agent/prompt_tokens`` counts the prompt tokens sent to the engine. With
``agent.history_thinking=strip`` each episode's later prompts leave out its earlier thinking (``ragen.agent.context``;
``agent/think_stripped_tokens`` counts the ids cut, ``agent/think_kept_unaligned`` the turns kept whole).

Env calls (resets, steps, legal actions) of the slots of a batch run concurrently, up to ``agent.env_workers`` at
once (``EnvManager.map``); parsing, prompts and everything the tokenizer touches stay in the calling thread, in slot
order, so the batch is the same for any number of workers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ragen.agent.batch import RolloutBatch, TurnRecord
from ragen.agent.blind import blind_text
from ragen.agent.collate import build_batch
from ragen.agent.config import AgentConfig, EnvGroupSpec
from ragen.agent.context import ChatFormat, EpisodeContext
from ragen.agent.env_manager import EnvManager, EnvSlot, TurnOutcome
from ragen.agent.layout import row_layout
from ragen.agent.parser import ParsedResponse, clean_text, parse_response
from ragen.rollout.base import DROPPED_REASONS, VERSION_KEY, Sample, SamplingParams

_LOG = logging.getLogger(__name__)
Responder = Callable[[list[EnvSlot], list[list[int]], SamplingParams], list[Sample]]


class AgentProxy:
    """Rolls out ``train_envs`` / ``val_envs`` with ``engine`` (see the module docstring)."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        agent: AgentConfig,
        train_envs: list[EnvGroupSpec],
        val_envs: list[EnvGroupSpec],
        *,
        seed: int = 0,
        val_seed: int = 123456,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.cfg = agent
        self.rows = row_layout(agent.layout)  # how finished episodes become rows (ragen.agent.layout)
        self.fmt = ChatFormat(tokenizer, agent.system_prompt, agent.response_prefix)
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_id = int(self.fmt.eot_id if pad is None else pad)
        self.managers = {"train": EnvManager(train_envs, agent)}
        if val_envs:
            self.managers["val"] = EnvManager(val_envs, agent)
        self.seed = int(seed)
        self.val_seed = int(val_seed)
        self.train_calls = 0

    def state_dict(self) -> dict[str, int]:
        """The seed counters (everything needed to resume the same train seed sequence)."""
        return {"seed": self.seed, "val_seed": self.val_seed, "train_calls": self.train_calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed = int(state["seed"])
        self.val_seed = int(state["val_seed"])
        self.train_calls = int(state["train_calls"])

    def rollout(self, mode: str = "train", responder: Responder | None = None) -> RolloutBatch:
        """One batch of episodes: ``"train"`` advances the seeds each call, ``"val"`` uses fixed seeds.

        ``responder(slots, prompts, sampling) -> samples`` answers instead of ``engine.generate`` (e.g.
        ``ragen.agent.expert.ExpertResponder``: the envs' experts for a warm start); all else is unchanged.
        """
        if mode not in self.managers:
            valid = sorted(self.managers)
            raise ValueError(f"unknown rollout mode {mode!r}; valid modes: {valid} (val needs val_envs)")
        manager = self.managers[mode]
        if mode == "train":
            base, counter = self.seed, self.train_calls
            self.train_calls += 1
        else:
            base, counter = self.val_seed, 0
        start = time.perf_counter()
        stats = {"generate_s": 0.0, "truncations": 0, "overflow": 0, "cutoffs": 0, "calls": 0, "dropped": 0,
                 "repetition": 0, "prompt_tokens": 0}
        manager.reset(manager.group_seeds(base, counter))
        described = manager.map(_describe_or_error, manager.slots)
        contexts: list[EpisodeContext | None] = [self._open(slot, d) for slot, d in zip(manager.slots, described,
                                                                                         strict=True)]
        for turn in range(max(slot.max_turn for slot in manager.slots)):
            if not self._turn(manager, contexts, turn, base * 1_000_003 + counter * 101 + turn, stats, responder):
                break
        for slot in manager.slots:
            assert slot.record is not None
            # cut by a length budget while the episode went on (bootstrap); max_turn is a true end (the prompt
            # states the turns left), and so is the env's done
            slot.record.truncated = slot.stopped and not slot.done and not slot.failed
        boot = [ctx.bootstrap_prompt(self.cfg.max_context_window, self.cfg.max_model_len, self.cfg.max_new_tokens)
                if ctx is not None and slot.record.truncated else []
                for slot, ctx in zip(manager.slots, contexts, strict=True)]
        batch = build_batch(manager.slots, contexts, self.pad_id, self.rows, self.cfg.max_model_len, boot)
        batch.metrics.update(self._agent_metrics(stats, time.perf_counter() - start))
        live = [ctx for ctx in contexts if ctx is not None]
        cuts = [c for ctx in live for c in ctx.think_cuts]
        batch.metrics["agent/think_stripped_tokens"] = float(sum(c for c in cuts if c))
        batch.metrics["agent/think_kept_unaligned"] = float(sum(c is None for c in cuts))
        batch.metrics["rollout/env_errors"] = float(_log_env_errors(manager.slots, mode))
        return batch

    def _open(self, slot: EnvSlot, described: tuple[str, str] | Exception | None) -> EpisodeContext | None:
        """The episode context with its first prompt, or None when the env failed (in reset, or in ``described``:
        what :func:`_describe_or_error` got from it)."""
        if slot.failed:
            return None
        if isinstance(described, Exception):
            slot.fail("instructions", described)
            return None
        assert described is not None
        instructions, legal = described
        strip = f"</{self.cfg.think_tag}>" if self.cfg.history_thinking == "strip" else None
        ctx = EpisodeContext(self.fmt, instructions, strip_tag=strip)
        ctx.add_user(self._user_text(slot, legal, 0, ""))
        return ctx

    def _turn(self, manager: EnvManager, contexts: list, turn: int, seed: int, stats: dict,
              responder: Responder | None = None) -> bool:
        """Generate for every active env and step it; False when no env was active."""
        cfg = self.cfg
        active, plans = [], []
        for i, slot in enumerate(manager.slots):
            ctx = contexts[i]
            if slot.done or slot.stopped or ctx is None or ctx.num_turns >= slot.max_turn:
                continue
            plan = ctx.plan(cfg.max_context_window, cfg.max_model_len, cfg.max_new_tokens)
            stats["truncations"] += int(plan.truncated)
            if plan.max_new_tokens < 1:
                stats["overflow"] += 1  # not even the history-free prompt fits: end the episode as truncated
                slot.stopped = True
                continue
            active.append(i)
            plans.append(plan)
        if not active:
            return False
        sampling = SamplingParams(
            temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
            max_new_tokens=max(p.max_new_tokens for p in plans), stop_token_ids=(self.fmt.eot_id,), seed=seed,
            stop=cfg.stop_strings,
        )  # fmt: skip
        t0 = time.perf_counter()
        prompts = [p.ids for p in plans]
        stats["prompt_tokens"] += sum(len(p) for p in prompts)
        if responder is None:
            samples = self.engine.generate(prompts, sampling)
        else:
            samples = responder([manager.slots[i] for i in active], prompts, sampling)
        stats["generate_s"] += time.perf_counter() - t0
        stats["calls"] += 1
        if len(samples) != len(plans):
            raise RuntimeError(f"engine returned {len(samples)} samples for {len(plans)} prompts")
        moves = []
        for i, plan, sample in zip(active, plans, samples, strict=True):
            if sample.finish_reason in DROPPED_REASONS:  # no valid sample: the episode fails and trains nothing
                stats["dropped"] += 1
                manager.slots[i].fail("engine", RuntimeError(f"engine finished the request: {sample.finish_reason}"))
                continue
            stats["repetition"] += int(sample.finish_reason == "repetition")
            ids = list(sample.token_ids)[: plan.max_new_tokens]
            log_probs = list(sample.log_probs)[: plan.max_new_tokens]
            stats["cutoffs"] += int(sample.finish_reason == "length" or len(sample.token_ids) > len(ids))
            contexts[i].use_plan(plan)
            contexts[i].add_response(ids, log_probs, sample.extra.get(VERSION_KEY, -1))
            moves.append(self._parse(manager.slots[i], contexts[i], ids))
        # the env calls of all slots at once (each touches its own slot); prompts are built in slot order after
        for move, (outcome, legal) in zip(moves, manager.map(_env_turn, moves), strict=True):
            self._record(move, outcome, legal)
        return True

    def _parse(self, slot: EnvSlot, ctx: EpisodeContext, ids: list[int]) -> _Move:
        """Parse the response into the turn's actions and note the state the policy saw (gigpo's anchor)."""
        cfg = self.cfg
        text = clean_text(self.fmt.response_prefix + self.fmt.decode(ids))
        parsed = parse_response(
            text, think=cfg.think, think_tag=cfg.think_tag, answer_tag=cfg.answer_tag, action_sep=cfg.action_sep
        )
        slot.obs_keys.append(self._seen(slot.observation))  # gigpo's anchor: the state as the policy saw it
        return _Move(slot, ctx, text, parsed, parsed.actions[: slot.max_actions])

    def _record(self, move: _Move, outcome: TurnOutcome, legal: str | Exception | None) -> None:
        """Record the stepped turn in its slot and add the next user message if the episode goes on (``legal``:
        what :func:`_env_turn` got from the env's ``legal_actions``; None when the episode ended)."""
        cfg, slot, ctx, parsed = self.cfg, move.slot, move.ctx, move.parsed
        penalty = 0.0 if parsed.format_ok else cfg.format_penalty
        reward = outcome.reward + penalty
        slot.actions_total += outcome.executed if parsed.format_ok else 1
        slot.actions_valid += outcome.valid
        slot.actions_effective += outcome.effective
        slot.turn_rewards.append(reward)
        slot.step_rewards.append(outcome.step_reward + penalty)  # the proxy's penalty is a per-turn (step) reward
        slot.tool_results.append(outcome.tool_result)
        slot.outcome_reward += outcome.outcome_reward
        slot.has_split = slot.has_split or outcome.has_split
        slot.observation = outcome.observation
        slot.done = slot.done or outcome.done
        record = slot.record
        assert record is not None
        record.success = record.success or outcome.success
        record.turns.append(
            TurnRecord(
                prompt_text=ctx.user_texts[-1], response_text=move.text, actions=move.actions, reward=reward,
                success=outcome.success, format_ok=parsed.format_ok, step_reward=outcome.step_reward,
            )
        )  # fmt: skip
        if legal is None:
            return
        if isinstance(legal, Exception):
            slot.fail("legal_actions", legal)
            return
        note = "" if parsed.format_ok else "Your previous answer could not be parsed; no action was taken.\n"
        ctx.add_user(self._user_text(slot, legal, ctx.num_turns, note))

    def _seen(self, observation: str) -> str:
        """The observation as the policy reads it: the env's text, or its filler under ``observations=blind``. The
        prompts and gigpo's anchor states (``obs_keys``) both use it, so a blind control groups turns by what it
        saw, never by the hidden state."""
        return blind_text(observation, self.tokenizer) if self.cfg.observations == "blind" else observation

    def _user_text(self, slot: EnvSlot, legal: str, turn: int, note: str) -> str:
        """The user message of ``turn`` (see :func:`user_text`)."""
        return user_text(self.cfg, self._seen(slot.observation), legal, turn, slot.max_turn, slot.max_actions, note)

    def _agent_metrics(self, stats: dict, total_s: float) -> dict[str, float]:
        gen = stats["generate_s"]
        return {
            "agent/context_truncations": float(stats["truncations"]),
            "agent/prompt_overflow": float(stats["overflow"]),
            "agent/length_cutoffs": float(stats["cutoffs"]),
            "agent/engine_dropped": float(stats["dropped"]),
            "agent/repetition_stops": float(stats["repetition"]),
            "agent/generate_calls": float(stats["calls"]),
            "agent/prompt_tokens": float(stats["prompt_tokens"]),
            "agent/time/rollout_s": total_s,
            "agent/time/generate_s": gen,
            "agent/time/outside_generate_frac": (total_s - gen) / total_s if total_s > 0 else 0.0,
        }


@dataclass
class _Move:
    """One slot's parsed response of a turn: what :func:`_env_turn` executes and ``_record`` records."""

    slot: EnvSlot
    ctx: EpisodeContext
    text: str
    parsed: ParsedResponse
    actions: list[str]


def _describe_or_error(slot: EnvSlot) -> tuple[str, str] | Exception | None:
    """The env's (instructions, legal actions), what it raised, or None for a slot that failed in reset. Runs in
    the env pool (``EnvManager.map``): it touches nothing but its slot's env."""
    if slot.failed:
        return None
    try:
        return EnvManager.describe(slot)
    except Exception as exc:  # noqa: BLE001 - any env bug must stay inside its slot
        return exc


def _env_turn(move: _Move) -> tuple[TurnOutcome, str | Exception | None]:
    """Step the slot's env with the move's actions and, when the episode goes on, ask its legal actions (the text,
    what the env raised, or None when the episode ended). Runs in the env pool (``EnvManager.map``): it touches
    only its own slot (a step failure fails it) and never the tokenizer."""
    slot = move.slot
    outcome = EnvManager.step(slot, move.actions)
    if slot.failed or outcome.done or move.ctx.num_turns >= slot.max_turn:
        return outcome, None
    try:
        return outcome, EnvManager.describe(slot)[1]
    except Exception as exc:  # noqa: BLE001 - any env bug must stay inside its slot
        return outcome, exc


def _log_env_errors(slots: list[EnvSlot], mode: str, shown: int = 5) -> int:
    """Log the failed episodes (env, seed, group, error; the first ``shown`` of them) and return their count."""
    failed = [s for s in slots if s.failed]
    for s in failed[:shown]:
        _LOG.warning("[ragen] %s rollout: env %s seed %d (group %d) failed and is masked: %s", mode, s.name, s.seed,
                     s.group_id, s.error)
    if len(failed) > shown:
        _LOG.warning("[ragen] %s rollout: %d more failed episodes", mode, len(failed) - shown)
    return len(failed)


def user_text(cfg: Any, observation: str, legal: str, turn: int, max_turn: int, max_actions: int,
              note: str = "") -> str:
    """The user message of ``turn``: observation, legal actions, actions left and the format reminder.

    ``cfg``: an ``AgentConfig`` or the trainer's agent section (``action_sep``, ``think``, ``think_tag``,
    ``answer_tag``, ``reminder`` are read). With ``reminder="first_turn"`` only turn 0 and a turn after an unparsed
    answer (``note``) state the turn budget and the answer format; other turns end with "N action(s) left."
    A function of the config and the env's texts, so config validation sizes prompts with the same text the proxy
    sends.
    """
    turns_left = max_turn - turn
    m = max_actions
    head = f"{note}Turn {turn + 1}. State:\n{observation}\nLegal actions: {legal}\n"
    if turn > 0 and cfg.reminder == "first_turn" and not note:
        return f"{head}{turns_left * m} action(s) left."
    sep = f", separated by '{cfg.action_sep}'" if m > 1 else ""
    think = f"<{cfg.think_tag}>your reasoning</{cfg.think_tag}>" if cfg.think else ""
    example = "action" if m == 1 else f"action1 {cfg.action_sep} action2"
    answer = f"<{cfg.answer_tag}>{example}</{cfg.answer_tag}>"
    return (
        f"{head}You have {turns_left * m} action(s) left ({turns_left} turn(s), at most {m} action(s) per turn{sep}).\n"
        f"Always respond in the format {think}{answer}."
    )
