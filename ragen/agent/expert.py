"""Expert responses: the agent proxy plays an env's expert instead of sampling the model (supervised warm start).

``ExpertResponder`` stands in for ``engine.generate`` in ``AgentProxy.rollout(..., responder=...)``: for each
active env it asks the env for its expert action (``env.expert_action()``, see ``ragen.env.base``), writes it as
the model would (``<think></think>`` when thinking is on, then ``<answer>action</answer>``, minus the forced
``response_prefix`` that is already part of the prompt) and returns its token ids. Everything else is the proxy's
own: prompts, chat template, observation text, turn limits, the parser, rewards, and the token masks of the batch.
So a warm start imitates exactly the tokens RL will later sample and train on (``response_mask``).

Where a turn may carry several actions (``max_actions_per_turn`` > 1, e.g. FrozenLake, Sokoban) the expert plans
that many: its next actions are read off a copy of the env stepped with the earlier ones (``copy.deepcopy``), and
the answer joins them with ``action_sep``, as a model is asked to; the plan stops where the copy's episode ends.
With probability ``noise`` an action is a random legal one instead, drawn from the env's ``action_list()`` (noisy
experts: the model also sees states off the optimal path and the expert's recovery from them). Random actions are
dealt like cards: each set of legal actions has its own shuffled deck, refilled when empty, so every legal action is
drawn equally often (stratified sampling, ``random_actions="dealt"``). With ``noise=1.0`` (a format-only warm start)
the demonstrations then carry no preference between actions by chance: on the two-armed bandit, independent draws
leave 64 demonstrations 26/38 or more uneven one time in six, and the warm-started policy's preference varied from
0.25 to 0.94 between seeds. The deck has a cost where a turn holds several actions: consecutive deals rarely repeat
an action, so on FrozenLake a demonstrated 4-move turn holds every move once (they cancel out; dealt random moves
win 9% of 3-turn episodes, independent ones 18%). ``random_actions="independent"`` draws each random action
uniformly on its own.

Ids end with the closing answer tag when the agent stops there (``stop_at_answer``; the proxy appends the
end-of-turn token with mask 0, as for sampled responses), else with the end-of-turn token. Log-probs are reported
as 0 (nothing was sampled).
"""

from __future__ import annotations

import copy
import random
from typing import Any

from ragen.agent.config import AgentConfig
from ragen.rollout.base import Sample, SamplingParams

RANDOM_ACTIONS = ("dealt", "independent")


class ExpertResponder:
    """``(slots, prompts, sampling) -> samples`` from each slot's env expert (module docstring)."""

    def __init__(self, tokenizer: Any, cfg: AgentConfig, eot_id: int, *, noise: float = 0.0, seed: int = 0,
                 random_actions: str = "dealt"):
        if not 0.0 <= noise <= 1.0:
            raise ValueError(f"expert noise must be in [0, 1] (share of random legal actions), got {noise}")
        if random_actions not in RANDOM_ACTIONS:
            raise ValueError(f"random_actions must be one of {', '.join(RANDOM_ACTIONS)}, got {random_actions!r}")
        self.independent = random_actions == "independent"
        self.tokenizer, self.cfg, self.eot_id, self.noise = tokenizer, cfg, int(eot_id), float(noise)
        self.rng = random.Random(seed)
        self.stats = {"expert_turns": 0, "noise_turns": 0}
        self._decks: dict[tuple[str, ...], list[str]] = {}

    def text(self, actions: str | list[str]) -> str:
        """The response text for ``actions`` after the forced prefix (what the model would have to write)."""
        cfg = self.cfg
        answer = actions if isinstance(actions, str) else f" {cfg.action_sep} ".join(actions)
        think = f"<{cfg.think_tag}></{cfg.think_tag}>" if cfg.think else ""
        full = f"{think}<{cfg.answer_tag}>{answer}</{cfg.answer_tag}>"
        if not full.startswith(cfg.response_prefix):
            raise ValueError(f"agent.response_prefix={cfg.response_prefix!r} is not a prefix of the expert response "
                             f"{full!r}; an expert warm start needs a prefix the answer format starts with")
        return full[len(cfg.response_prefix):]

    def action(self, env: Any) -> str:
        """The expert's action, or with probability ``noise`` a random legal one from ``env.action_list()`` (the
        expert's where the env lists none now; config validation refuses noise for envs without ``action_list``,
        whose ``legal_actions()`` only describes free-text actions)."""
        if self.noise > 0 and self.rng.random() < self.noise:
            listed = getattr(env, "action_list", None)
            legal = tuple(a for a in (listed() if callable(listed) else ()) if a.strip())
            if legal:
                self.stats["noise_turns"] += 1
                return self.rng.choice(legal) if self.independent else self._deal(legal)
        self.stats["expert_turns"] += 1
        return str(env.expert_action())

    def _deal(self, legal: tuple[str, ...]) -> str:
        """The next card of ``legal``'s shuffled deck (a fresh shuffle once all were dealt)."""
        deck = self._decks.setdefault(legal, [])
        if not deck:
            deck.extend(legal)
            self.rng.shuffle(deck)
        return deck.pop()

    def plan(self, env: Any, limit: int) -> list[str]:
        """Up to ``limit`` actions for one turn: each from the expert (or noise) on a copy of ``env`` stepped with
        the ones before; the env itself is not touched."""
        if limit <= 1:
            return [self.action(env)]
        sim, out = copy.deepcopy(env), []
        for _ in range(limit):
            out.append(self.action(sim))
            if sim.step(out[-1]).done:
                break
        return out

    def __call__(self, slots: list[Any], prompts: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        out = []
        for slot in slots:
            ids = self.tokenizer(self.text(self.plan(slot.env, slot.max_actions)),
                                 add_special_tokens=False)["input_ids"]
            if not self.cfg.stop_at_answer:
                ids = [*ids, self.eot_id]
            out.append(Sample(list(ids), [0.0] * len(ids), "stop"))
        return out
