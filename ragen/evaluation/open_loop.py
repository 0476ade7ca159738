"""The best score a policy can get without reading the observations: the bound a learning claim must beat.

A policy that ignores what the environment says plays the same actions on every episode of a validation panel, so
its best score is that of the best fixed plan. These functions compute it exactly on a panel of seeds:

* :func:`best_fixed_plan`: exhaustive search over fixed action sequences up to a depth (the turn budget times the
  actions per turn), for deterministic envs with a small action set (FrozenLake, Sokoban, delayed_choice). Depth-
  first, branching on every action at every step; two plans that leave every episode of the panel in the same
  state (same observation, same outcome) are the same from there on, so each joint state is expanded once.
* :func:`top_guesses_bound`: Twenty-Questions-like games, where an answer-ignoring policy asks a fixed sequence of
  guesses: the best it can do on a panel is win every game whose secret is among its ``max_turn`` guesses, i.e.
  the share of games whose secret is among the panel's ``max_turn`` most frequent secrets.

A balanced panel is one where the bound is well below what reading the observation can reach (for the guessing
games: more distinct secrets than turns, evenly spread).
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PlanBound:
    """The best fixed plan on a panel: ``wins`` of ``n`` episodes succeed with ``plan`` (``score = wins / n``),
    found by searching every plan of at most ``depth`` actions (``nodes`` joint states expanded)."""

    wins: int
    n: int
    plan: tuple[str, ...]
    depth: int
    nodes: int

    @property
    def score(self) -> float:
        return self.wins / self.n if self.n else 0.0


def best_fixed_plan(make_env: Callable[[], Any], seeds: Sequence[int], actions: Sequence[str], depth: int,
                    markov: bool = True, max_nodes: int = 2_000_000) -> PlanBound:
    """The fixed action sequence of at most ``depth`` actions that succeeds on the most episodes of ``seeds``.

    ``make_env()`` builds a fresh env (``ragen.env.make(name, **config)``); each seed's env is reset once and then
    copied (``copy.deepcopy``) at every branch, so the env must be deterministic given its state. An episode counts
    as won when a step reports ``info["success"]``; it stops at ``done``. ``markov``: the observation text
    identifies the state (FrozenLake and Sokoban render the whole board), so two plans that leave every episode
    with the same observations are merged (a move into a wall changes nothing and is never expanded); False
    searches every plan (envs with hidden state, e.g.
    delayed_choice). Raises when more than ``max_nodes`` joint states would be expanded (search a smaller depth).
    """
    start = []
    for seed in seeds:
        env = make_env()
        start.append((env, env.reset(int(seed)), False))
    best: list = [0, ()]
    seen: dict[tuple, int] = {}  # joint state -> the fewest actions it was reached with
    nodes = 0

    def visit(state: list, plan: tuple[str, ...]) -> None:
        nonlocal nodes
        wins = sum(won for _, _, won in state)
        if wins > best[0] or (wins == best[0] and len(plan) < len(best[1])):
            best[0], best[1] = wins, plan
        alive = sum(env is not None and not won for env, _, won in state)
        if len(plan) >= depth or not alive or wins + alive <= best[0]:
            return  # nothing left to gain below this node
        if markov:
            key = tuple((obs, won, env is None) for env, obs, won in state)
            if seen.get(key, depth + 1) <= len(plan):
                return  # reached before with as few actions: the same plans follow
            seen[key] = len(plan)
        nodes += 1
        if nodes > max_nodes:
            raise RuntimeError(f"more than {max_nodes} joint states at depth <= {depth}; search a smaller depth")
        for action in actions:
            visit([_step(s, action) for s in state], plan + (action,))

    visit(start, ())
    return PlanBound(wins=best[0], n=len(start), plan=best[1], depth=depth, nodes=nodes)


def _step(state: tuple, action: str) -> tuple:
    """One action on one episode's (env, observation, won); finished episodes stay as they are (env None)."""
    env, _, won = state
    if env is None:
        return state
    env = copy.deepcopy(env)
    res = env.step(action)
    if res.info.get("success"):
        return (None, "", True)
    if res.done:
        return (None, "", False)
    return (env, res.observation, False)


def top_guesses_bound(secrets: Sequence[str], max_turn: int) -> tuple[float, list[str]]:
    """(best score, the guesses) of a policy that ignores every answer in a guessing game with ``max_turn`` turns:
    it can name ``max_turn`` secrets, so it wins exactly the games whose secret is among the panel's ``max_turn``
    most frequent ones (ties broken by name, so the result is deterministic)."""
    counts = Counter(secrets)
    guesses = [s for s, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:max_turn]]
    return (sum(counts[g] for g in guesses) / len(secrets) if secrets else 0.0), guesses
