"""Rows that share a prompt are processed together (``TrainBatch.prompt_order``): the no-grad passes return their
outputs in the caller's row order, equal to unreordered passes, and the update's mini-batches hold one prompt."""

from __future__ import annotations

import torch
from factories import prompt_response, train_batch

from ragen.workers import ActorConfig, LocalWorkerGroup, PolicyWorker, TrainBatch
from ragen.workers.trainable import forward_in_chunks

A = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]  # two prompts of 18 tokens, differing at
B = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 99]  # the last one


def batch_of(prompts: list[list[int]], responses: list[list[int]]) -> TrainBatch:
    """Right-padded rows prompt + response; response_mask on the response."""
    return train_batch(prompt_response(prompts, responses))


def test_prompt_order_hand_example():
    b = batch_of([A, B, A, B, A], [[30], [31, 32], [33], [34], [35, 36, 37]])
    assert b.prompt_order() == [0, 2, 4, 1, 3]
    assert batch_of([A, B], [[30], [31]]).prompt_order() == [0, 1]  # no shared prompt: identity
    # a row without response tokens (padding row): its prompt is all its real tokens
    pad = TrainBatch(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long),
                     torch.zeros(1, 4, dtype=torch.long))
    assert pad.prompt_order() == [0]


def test_prompt_chunks_never_mix_a_shared_prompt_with_other_rows():
    C = A[:-1] + [50]
    D = A[:-1] + [51]
    b = batch_of([A, A, A, B, B, C, D, A], [[30]] * 8)
    chunks = b.select(b.prompt_order()).prompt_chunks(2)
    assert [c.input_ids[:, 17].tolist() for c in chunks] == [[22, 22], [22, 22], [99, 99], [50, 51]]
    # all prompts distinct: the plain chunks
    assert [c.batch_size for c in batch_of([A, B, C, D, A[:-2] + [7, 7]], [[30]] * 5).prompt_chunks(2)] == [2, 2, 1]


def test_forward_in_chunks_returns_rows_in_the_callers_order():
    b = batch_of([A, B, A, B, A, B, A], [[30], [31, 32], [33], [34], [35, 36, 37], [38], [39]])
    seen = []

    def fn(part: TrainBatch):
        seen.append(part.input_ids[:, 17].tolist())  # which prompt each chunk row has
        return part.input_ids.float() * 2, part.input_ids[:, 0].float() + part.attention_mask.sum(-1)

    doubled, lengths = forward_in_chunks(b, 3, torch.device("cpu"), fn)
    assert seen == [[22, 22, 22], [22], [99, 99, 99]]  # each chunk holds one prompt
    torch.testing.assert_close(doubled, b.input_ids.float() * 2)
    torch.testing.assert_close(lengths, 5 + b.attention_mask.sum(-1).float())


def test_log_probs_and_update_with_shared_prompts(model_dir):
    cfg = ActorConfig(lr=1e-3, mini_batch_size=2, micro_batch_size=2, mixed_precision="fp32")
    actor = LocalWorkerGroup(PolicyWorker, model_name_or_path=model_dir, cfg=cfg)
    b = batch_of([A, B, A, B], [[30, 31], [32], [33], [34, 35, 36]])
    together = actor.call("compute_log_probs", b)
    for i in range(4):  # each row alone: no reordering, no packing
        alone = actor.call("compute_log_probs", b.select([i]))
        torch.testing.assert_close(together[i : i + 1], alone, rtol=1e-4, atol=1e-5)
    rows = []
    real = actor.worker._sft_micro_loss

    def spy(micro, *a, **kw):
        rows.append(micro.input_ids[:, 17].tolist())
        return real(micro, *a, **kw)

    actor.worker._sft_micro_loss = spy
    actor.call("sft_update", b, lr=1e-3)
    assert rows == [[22, 22], [99, 99]]  # mini-batches of one prompt each
