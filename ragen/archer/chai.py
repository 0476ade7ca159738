"""Online CHAI's action (the ArCHer paper's baseline; the reference code's ``CHAIAgent.get_action``): sample k
utterances per state and take the one with the highest target min(Q1, Q2).

The same choice serves acting in the env (train and validation rollouts) and the critic's V target (V is the value
of the agent that acts, so its target reads this agent's action: ``ragen.algorithms.archer.v_targets``).

Validation: the family validates at ``rollout.val_temperature`` (0, greedy, in every family config). k greedy
candidates would all be the same utterance, so CHAI has no choice to make there; its candidates are then drawn at
``agent.temperature`` with the validation rollout's fixed per-turn seeds instead (:func:`candidate_sampling`). The
choice is the argmax of the target critic over those seeded candidates, so a validation is deterministic: the same
policy and critic play the same games every time, and what changes between validations is the critic's choice.
(The reference code turns sampling off to evaluate, so there its CHAI's five candidates coincide and its evaluation
measures the fixed base policy.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torch import Tensor

from ragen.algorithms.archer import chai_select
from ragen.rollout.base import Sample, SamplingParams


def candidate_sampling(sampling: SamplingParams, temperature: float) -> SamplingParams:
    """The sampling of CHAI's candidates for a rollout that samples with ``sampling``: ``sampling`` itself, or
    when it is greedy (temperature 0: greedy validation) the same settings and seed at ``temperature``
    (``agent.temperature``), see the module docstring."""
    if sampling.temperature > 0:
        return sampling
    return dataclasses.replace(sampling, temperature=float(temperature))


def best_of_k(engine: Any, prompts: list[list[int]], sampling: SamplingParams, k: int,
              decode: Callable[[list[int]], str], score: Callable[[list[str], list[str]], Tensor]) -> list[Sample]:
    """For each prompt, the one of ``k`` samples (one ``engine.generate`` call on every prompt repeated ``k``
    times) with the highest ``score(states, actions)`` (the target critic's min-Q over decoded texts; first on
    ties). prompts: token ids per state; returns one sample per prompt.

    An engine that keeps each sequence's KV cache for the next turn (``HFEngine.retain_prefixes``) is told which
    samples were played, so the caches of the k - 1 discarded ones are freed at once: they are never extended, and
    they would hold (k - 1)/k of that cache's memory (~1.6 GB of 2 GB for 16 games x 5 candidates of ~450 tokens with
    the default 135M model)."""
    samples = engine.generate([p for p in prompts for _ in range(k)], sampling)
    cands = [samples[i * k:(i + 1) * k] for i in range(len(prompts))]
    states = [decode(p) for p in prompts]
    texts = [[decode(list(s.token_ids)) for s in c] for c in cands]
    picks = chai_select(states, texts, score)
    played = [c[j] for c, j in zip(cands, picks, strict=True)]
    retain = getattr(engine, "retain_prefixes", None)
    if retain is not None:
        retain([p + list(s.token_ids) for p, s in zip(prompts, played, strict=True)])
    return played
