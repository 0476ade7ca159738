"""Builders of the records tests feed to the code under test: ``TrainBatch`` and ``RolloutBatch`` rows from a short
description or at random with realistic shapes, and the tokenizers that stand in for a real one.

Imported as ``from factories import ...`` from any test folder (pytest puts ``tests/``, the folder of the root
conftest.py, on ``sys.path``). The layouts follow the records' docstrings (``ragen.agent.batch.RolloutBatch``,
``ragen.workers.data.TrainBatch``): every (B, T) tensor right-padded (pad id 0); ``attention_mask`` 1 on real
tokens; ``response_mask`` 1 on model tokens only; ``turn_ids`` k on turn k's model tokens, -1 elsewhere; a turn's
reward on its last model token. The ``turn`` layout's per-row bookkeeping (which episode and turn a row holds, which
rows are failed placeholders) is written by :func:`_layout_fields` only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ragen.agent.batch import EpisodeRecord, RolloutBatch
from ragen.workers.data import TrainBatch

VOCAB = 1000  # the worker tests' tiny models (worker_helpers.make_lm)
Segment = tuple[Sequence[int], int]  # (token ids, turn): turn -1 = prompt / observation tokens, k >= 0 = turn k's


# ----------------------------------------------------------------------------------------------------- tokenizers
class CharTokenizer:
    """One id per character (``ord``), a plain-text chat template: ``<role>content</role>`` per message."""

    eos_token_id = None
    pad_token_id = None

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        text += "<assistant>" if add_generation_prompt else ""
        return [ord(c) for c in text] if tokenize else text

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": self.encode(text)}

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


class IdTextTokenizer:
    """Ids <-> their numbers separated by spaces (``[1, 2, 3]`` <-> ``"1 2 3"``): texts that show which ids they
    came from, for tests that read states and actions as text (the ArCHer family's replay records)."""

    def encode(self, text, add_special_tokens=False):
        return [int(t) for t in text.split()]

    def decode(self, ids, skip_special_tokens=False):
        return " ".join(str(int(i)) for i in ids)


# ----------------------------------------------------------------------------------------------------- rows
def segment_rows(rows: Sequence[Sequence[Segment]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, turn_ids)``, each (B, T) long with T the longest row: row i is its segments
    concatenated, right-padded with 0 (attention 0, turn -1). ``turn_ids >= 0`` is the response mask."""
    width = max(sum(len(ids) for ids, _ in row) for row in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros(len(rows), width, dtype=torch.long)
    turns = torch.full((len(rows), width), -1, dtype=torch.long)
    for i, row in enumerate(rows):
        pos = 0
        for seg, turn in row:
            ids[i, pos:pos + len(seg)] = torch.as_tensor(list(seg), dtype=torch.long)
            attn[i, pos:pos + len(seg)] = 1
            turns[i, pos:pos + len(seg)] = turn
            pos += len(seg)
    return ids, attn, turns


def prompt_response(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> list[list[Segment]]:
    """One row per (prompt, response): the prompt's tokens, then the response's as turn 0."""
    return [[(p, -1), (r, 0)] for p, r in zip(prompts, responses, strict=True)]


def random_rows(B: int = 4, T: int = 24, seed: int = 0, vocab: int = VOCAB):
    """``(input_ids, attention_mask, response_mask)`` of B random rows: real lengths in [T/2, T] (row 0 full), ids in
    [3, vocab), response mask on the second half of each row's real tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (B, T), generator=g)
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    lengths[0] = T
    pos = torch.arange(T)[None]
    attn = (pos < lengths[:, None]).long()
    ids = ids * attn
    resp = ((pos >= lengths[:, None] // 2) & (attn > 0)).long()
    return ids, attn, resp


# ----------------------------------------------------------------------------------------------------- TrainBatch
def train_batch(rows: Sequence[Sequence[Segment]], **fields: torch.Tensor) -> TrainBatch:
    """A ``TrainBatch`` of :func:`segment_rows` (response mask on every model segment) with ``fields`` as given."""
    ids, attn, turns = segment_rows(rows)
    return TrainBatch(ids, attn, (turns >= 0).long(), **fields)


def random_train_batch(B: int = 4, T: int = 24, seed: int = 0, draw: Sequence[str] = (), draw_seed: int | None = None,
                       vocab: int = VOCAB, **fields: torch.Tensor) -> TrainBatch:
    """A ``TrainBatch`` of :func:`random_rows`; each field named in ``draw`` (in order, from one generator seeded
    ``draw_seed``, default ``seed + 1``) a standard normal draw on the response tokens, 0 elsewhere; ``fields`` as
    given."""
    ids, attn, resp = random_rows(B, T, seed, vocab)
    g = torch.Generator().manual_seed(seed + 1 if draw_seed is None else draw_seed)
    drawn = {name: torch.randn(B, T, generator=g) * resp for name in draw}
    return TrainBatch(ids, attn, resp, **drawn, **fields)


def padding_train_batch(B: int, T: int, **fields: torch.Tensor) -> TrainBatch:
    """B rows that hold no token but a first pad (attention 1 there, no response token): the rows the ``turn``
    layout pads a batch with (``ragen.trainer.layout.pad_rows``)."""
    attn = torch.zeros(B, T, dtype=torch.long)
    attn[:, 0] = 1
    return TrainBatch(torch.zeros(B, T, dtype=torch.long), attn, torch.zeros(B, T, dtype=torch.long), **fields)


# ----------------------------------------------------------------------------------------------------- RolloutBatch
def rollout_batch(rows: Sequence[Sequence[Segment]], turn_rewards: Sequence[Sequence[float]], *,
                  group_ids: Sequence[int] | torch.Tensor | None = None,
                  truncated: Sequence[bool] | torch.Tensor | None = None,
                  turn_rows: tuple[Sequence[int], Sequence[int]] | None = None,
                  failed: Sequence[bool] | None = None, episodes: Sequence[EpisodeRecord] = (),
                  **fields) -> RolloutBatch:
    """A ``RolloutBatch`` of :func:`segment_rows`. ``turn_rewards[i]`` are row i's episode's turn rewards (their
    count its ``num_turns``); each model turn k of the row gets ``turn_rewards[i][k]`` on its last token.
    ``group_ids`` default one group per row, ``truncated`` default none, ``sample_log_probs`` 0. ``turn_rows``
    (episode index, turn index per row) marks a ``turn``-layout batch, ``failed`` its placeholder rows of failed
    episodes. ``fields`` replace any derived field (e.g. ``token_rewards``) or set an optional one
    (``step_rewards``...)."""
    ids, attn, turns = segment_rows(rows)
    B, T = ids.shape
    K = max(1, max(len(r) for r in turn_rewards))
    rewards = torch.zeros(B, K)
    tokens = torch.zeros(B, T)
    for i, row_rewards in enumerate(turn_rewards):
        rewards[i, :len(row_rewards)] = torch.tensor(row_rewards, dtype=torch.float32)
        for k in turns[i][turns[i] >= 0].unique().tolist():
            tokens[i, int((turns[i] == k).nonzero()[-1])] = row_rewards[k]
    built = dict(
        input_ids=ids, attention_mask=attn, response_mask=(turns >= 0).long(), turn_ids=turns, token_rewards=tokens,
        sample_log_probs=torch.zeros(B, T), turn_rewards=rewards,
        group_ids=torch.arange(B) if group_ids is None else torch.as_tensor(group_ids),
        num_turns=torch.tensor([len(r) for r in turn_rewards]),
        truncated=torch.zeros(B, dtype=torch.bool) if truncated is None else torch.as_tensor(truncated),
        episodes=list(episodes), **_layout_fields(turn_rows, failed))
    return RolloutBatch(**{**built, **fields})


def _layout_fields(turn_rows: tuple[Sequence[int], Sequence[int]] | None,
                   failed: Sequence[bool] | None) -> dict[str, torch.Tensor]:
    """The per-row bookkeeping of a ``turn``-layout batch: ``RolloutBatch``'s typed (B,) fields."""
    out = {}
    if turn_rows is not None:
        out["episode_index"] = torch.as_tensor(turn_rows[0])
        out["turn_index"] = torch.as_tensor(turn_rows[1])
    if failed is not None:
        out["failed"] = torch.as_tensor(failed)
    return out


def random_rollout(n_groups: int = 2, group_size: int = 2, max_turns: int = 3, seed: int = 0,
                   vocab: int = VOCAB) -> RolloutBatch:
    """A trajectory-layout batch as a multi-turn rollout makes it: ``group_size`` episodes per group share the
    group's prompt (its own length per group); each episode plays 1..``max_turns`` turns of 1..5 model tokens with
    1..3 observation tokens between turns (ragged rows); turn rewards in {0, 0.5, 1}; the engine's log-probs
    (negative) on model tokens; the last group's first episode cut by the length budget (truncated)."""
    g = torch.Generator().manual_seed(seed)

    def draw(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    def tokens(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=g).tolist()

    rows, rewards, groups = [], [], []
    for group in range(n_groups):
        prompt = tokens(draw(3, 8))
        for _ in range(group_size):
            row, n = [(prompt, -1)], draw(1, max_turns)
            for k in range(n):
                row += [(tokens(draw(1, 3)), -1)] if k else []
                row.append((tokens(draw(1, 5)), k))
            rows.append(row)
            rewards.append([draw(0, 2) / 2 for _ in range(n)])
            groups.append(group)
    batch = rollout_batch(rows, rewards, group_ids=groups,
                          truncated=[i == (n_groups - 1) * group_size for i in range(len(rows))])
    batch.sample_log_probs = -torch.rand(batch.input_ids.shape, generator=g) * batch.response_mask
    return batch
