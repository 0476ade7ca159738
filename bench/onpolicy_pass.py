"""Time a GRPO step with the old-log-prob pass kept against skipped (an exactly on-policy update), in one run.

    python bench/onpolicy_pass.py [--steps 2] [--groups 2] [--group-size 4] [--max-new-tokens 16] [--threads 2]

One ``PPOTrainer`` (in-process workers, the hf engine, the default model unless ``--model``) on the bandit with
GRPO: ``--groups`` x ``--group-size`` rows, all in one mini-batch, one epoch, no rollout correction, no KL, no
report, so the trainer skips the pass (``ragen.trainer.credit.old_log_probs_reader``). The kept side forces the
pass on the same trainer; the two alternate step by step after one warm-up step (background load hits both alike)
and each reports its median step time and its step time without the rollout (the rollouts differ with the policy).
Prints ``kept / skipped`` for both.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model alias / folder (default: ragen.models.DEFAULT_MODEL)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per side after one warm-up step")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    from ragen.ppo.trainer import PPOTrainer
    from ragen.trainer.config.compose import load_train_config

    rows = args.groups * args.group_size
    out = tempfile.mkdtemp(prefix="onpolicy_pass_")
    overrides = ["algorithm=grpo", "trainer.use_ray=false", "trainer.val_before_train=false", "trainer.val_freq=0",
                 "trainer.report=false", "trainer.save_freq=0", "trainer.sft_warmup_steps=0",
                 "trainer.collapse_every=0", "trainer.loggers=[jsonl]", "trainer.progress_bar=false",
                 f"trainer.num_threads={args.threads}", f"trainer.total_steps={2 * args.steps + 1}",
                 f"trainer.output_dir={out}", f"rollout.n_groups={args.groups}",
                 f"rollout.group_size={args.group_size}", f"actor.mini_batch_size={rows}",
                 f"agent.max_new_tokens={args.max_new_tokens}",
                 *([f"model.path={args.model}"] if args.model else [])]
    trainer = PPOTrainer(load_train_config("base", overrides))
    skip = trainer._old_log_probs_reader
    trainer.setup()
    times: dict[str, list[tuple[float, float]]] = {"kept": [], "skipped": []}
    try:
        for i in range(2 * args.steps + 1):
            side = "kept" if i % 2 else "skipped"  # step 0 (skipped side) is the warm-up
            trainer._old_log_probs_reader = skip if side == "skipped" else (lambda rows, shared_head: "forced")
            m = trainer.train_step()
            trainer.run.complete_step()
            assert ("timing/old_log_probs" in m) == (side == "kept"), side
            if i:
                times[side].append((m["timing/step"], m["timing/step"] - m["timing/rollout"]))
                phases = ", ".join(f"{k[7:]} {v:.2f}" for k, v in m.items()
                                   if k.startswith("timing/") and k not in ("timing/step", "timing/rollout"))
                print(f"step {i} {side}: {m['timing/step']:.2f} s, without rollout {times[side][-1][1]:.2f} s "
                      f"({phases})")
    finally:
        trainer.shutdown()
    med = {side: [statistics.median(t[j] for t in ts) for j in (0, 1)] for side, ts in times.items()}
    print(f"{rows} rows, {args.max_new_tokens} new tokens, {args.threads} threads; medians of {args.steps} steps")
    for j, what in enumerate(("step", "step without rollout")):
        k, s = med["kept"][j], med["skipped"][j]
        print(f"{what}: kept {k:.2f} s, skipped {s:.2f} s, kept / skipped = {k / s:.2f}x")


if __name__ == "__main__":
    main()
