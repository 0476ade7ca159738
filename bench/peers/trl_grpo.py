"""ragen against TRL's ``GRPOTrainer`` on the same CPU task, one after the other: step time, tokens/s, peak memory,
and (``--learn``) wall time to validation success.

    bash scripts/setup_trl_bench.sh                  # once: TRL 1.16.0 into ./.bench-trl (never into .venv)
    python bench/peers/trl_grpo.py                   # speed: 1 warm-up + 3 timed steps per side
    python bench/peers/trl_grpo.py --steps 5 --profile
    python bench/peers/trl_grpo.py --learn --env bandit_sure --seeds 0 1 2 --max-steps 6

The task (``bandit_task``): ragen's bandit as ``train_ppo.sh`` runs it (``config/ppo_bandit.yaml``), GRPO, 8 prompts x
8 samples a step, at most 16 new tokens stopping at ``</answer>``, lr 1e-5, beta 0, temperature 1.0, fp32, 2 torch
threads, the default model (``smollm2-135m-instruct``) loaded with transformers; prompts, reward (ragen's parser,
the env's reward, the format penalty) and validation all come from ragen's agent proxy. Sides, each its own process
(so peak RSS, from ``wait4``, is per side):

* ``ragen``: ``python -m ragen.train --config-name ppo_bandit`` with the overrides printed at the start (one
  optimizer step per batch, micro-batches of 16 rows; no warm start);
* ``trl``: TRL's defaults (gradient checkpointing on, all 64 rows in one micro-batch);
* ``trl-nockpt``: no gradient checkpointing, TRL's gradient accumulation over micro-batches of ``--trl-micro`` rows.

Seconds per step: ragen's ``timing/step`` (rollout to weight sync, validation and checkpoints outside it); TRL's from
``on_step_begin`` to ``on_step_end`` (generation, rewards, loss, backward, optimizer). The first ``--warmup`` steps
are left out. Trained tokens per second: completion tokens in the loss (model-sampled tokens; the prompt, the forced
``<answer>`` prefix and padding excluded) per second of step time, on both sides; "all tokens" adds the prompt tokens.

``--learn``: per seed, both sides start from the same weights (``--warm-start sft``: ragen's recipe warm start,
``python -m ragen.sft``, run once per seed, its time reported apart; ``none``: the base model), train up to
``--max-steps`` steps and validate every ``--val-every`` steps (and before training) on ragen's validation seeds of the
bandit, sampled as the recipe validates; a side stops at the first validation >= ``--threshold`` and its time is the
wall time from its launch to that validation's result. Process settings: ragen applies its own (``OMP_WAIT_POLICY``
passive unless exported, glibc malloc tuning); TRL runs stock unless ``--trl-ragen-process``; an exported
``OMP_WAIT_POLICY`` reaches both. TRL absent: prints a skip line and exits 0.

``--env bandit_sure`` for ``--learn``: on ``train_ppo.sh``'s bandit the high arm pays 1.0 one time in 4 (0.25 expected,
against the low arm's sure 0.1), and GRPO's advantage scaled by each group's reward std (both sides' default) pushes
towards the low arm: at an even split of 8 samples its expected advantage sum per group is -0.36 for the high arm
(+0.26 without the scaling; the exact expectation over a group's 45 compositions, pinned by the test suite). Both
sides then unlearn the high arm, so time to success measures nothing there; with a high arm that always pays it
measures learning speed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TRL_DIR = ROOT / ".bench-trl"
sys.path[:0] = [str(HERE), str(ROOT)]

from bandit_task import ragen_overrides  # noqa: E402
from peer_report import LearnRun, SideRun, learn_table, machine, markdown, profile_table, speed_table  # noqa: E402

SIDES = ("ragen", "trl", "trl-nockpt")
LAUNCH_ENV = dict(os.environ)  # what the sides inherit (this orchestrator applies no process settings of its own)


def trl_version() -> str | None:
    """TRL's version from ./.bench-trl or the environment; None when it is not installed."""
    import importlib.metadata as md

    for dist in md.distributions(name="trl", path=[str(TRL_DIR), *sys.path]):
        return dist.version
    return None


def child_env(args: argparse.Namespace, side: str) -> dict[str, str]:
    """The environment of a side's process: the launch environment, ``--threads`` for OpenMP / MKL, offline hub,
    and for a TRL side TRL's folder on PYTHONPATH and (stock) no ragen malloc tuning."""
    env = dict(LAUNCH_ENV)
    env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false",
               HF_HUB_OFFLINE="1", WANDB_MODE="offline", TRL_EXPERIMENTAL_SILENCE="1")
    paths = [str(ROOT)] + ([str(TRL_DIR)] if side != "ragen" and TRL_DIR.is_dir() else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [LAUNCH_ENV.get("PYTHONPATH")] if p])
    if side != "ragen":
        if args.trl_ragen_process:
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        else:
            env["RAGEN_TUNE_MALLOC"] = "0"
    return env


def run_child(cmd: list[str], env: dict[str, str], log: Path, poll: Callable[[], bool] | None = None,
              ) -> tuple[int, float, float]:
    """Run ``cmd`` (output to ``log``), calling ``poll`` every second; ``poll`` returning True ends the process
    (SIGTERM, SIGKILL after 60 s). Returns (exit code, wall seconds, peak RSS GB of the process and its children)."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        stop_at = None
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if poll is not None and stop_at is None and poll():
                proc.send_signal(signal.SIGTERM)
                stop_at = time.perf_counter()
            if stop_at is not None and time.perf_counter() - stop_at > 60:
                proc.kill()
            time.sleep(1.0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, time.perf_counter() - start, usage.ru_maxrss / 2**20  # KiB -> GiB


def jsonl_tail(path: Path) -> Callable[[], list[dict]]:
    """A reader returning the records appended to ``path`` since its last call."""
    seen = [0]

    def read() -> list[dict]:
        if not path.is_file():
            return []
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        new, seen[0] = lines[seen[0]:], len(lines)
        return [json.loads(line) for line in new]
    return read


def ragen_phases(rec: dict) -> dict[str, float]:
    """A ragen step's phases from its ``timing/*`` metrics (rollout split into the engine's generation and the
    rest; ``other``: the step minus all phases)."""
    t = {k[len("timing/"):]: v for k, v in rec.items()
         if k.startswith("timing/") and k not in ("timing/step", "timing/report") and not k.startswith("timing/val")}
    gen = rec.get("agent/time/generate_s", 0.0)
    out = {"generate": gen, "rollout_other": t.pop("rollout", 0.0) - gen}
    out.update(t)
    out["other"] = rec["timing/step"] - sum(out.values())
    return out


def ragen_cmd(args: argparse.Namespace, overrides: list[str], module: str = "ragen.train") -> list[str]:
    return [sys.executable, "-m", module, "--config-name", "ppo_bandit", *overrides]


def speed_ragen(args: argparse.Namespace, root: Path) -> SideRun:
    out = root / "ragen"
    overrides = task_overrides(args, args.seed) + [
        f"trainer.total_steps={args.warmup + args.steps}", "trainer.val_freq=0", "trainer.val_before_train=false",
        "trainer.save_freq=0", "rollout.val_n_groups=8", f"trainer.output_dir={out}", "trainer.resume=none",
        "trainer.progress_bar=false"]
    cmd = ragen_cmd(args, overrides)
    print("ragen:", shlex.join(cmd[1:]), flush=True)
    code, wall, rss = run_child(cmd, child_env(args, "ragen"), root / "ragen.log")
    run = SideRun("ragen", peak_rss_gb=rss, exit_code=code, wall_min=wall / 60)
    for rec in jsonl_tail(out / "metrics.jsonl")():
        if "timing/step" in rec:
            run.seconds.append(rec["timing/step"])
            run.prompt_tokens.append(rec.get("agent/prompt_tokens", 0.0))
            run.completion_tokens.append(rec.get("perf/response_tokens", 0.0))
            run.phases.append(ragen_phases(rec))
    return run


def trl_spec(args: argparse.Namespace, side: str, overrides: list[str], steps: int, seed: int, events: Path,
             learn: dict | None) -> dict:
    return {"variant": side, "overrides": overrides, "steps": steps, "threads": args.threads, "micro": args.trl_micro,
            "lr": args.lr, "new_tokens": args.new_tokens, "prompts": args.prompts, "samples": args.samples,
            "seed": seed, "learn": learn, "events": str(events), "launch_time": time.time()}


def run_trl(args: argparse.Namespace, spec: dict, root: Path, tag: str,
            on_event: Callable[[dict], bool] | None = None) -> tuple[list[dict], int, float, float]:
    """One TRL process for ``spec``; ``on_event`` sees each event as it appears (True: stop the process).
    Returns (events, exit code, wall seconds, peak RSS GB)."""
    spec_path = root / f"{tag}.spec.json"
    read, events = jsonl_tail(Path(spec["events"])), []

    def poll() -> bool:
        new = read()
        events.extend(new)
        return any(on_event(e) for e in new) if on_event else False

    spec["launch_time"] = time.time()
    spec_path.write_text(json.dumps(spec))
    code, wall, rss = run_child([sys.executable, str(HERE / "trl_side.py"), str(spec_path)], child_env(args, tag),
                                root / f"{tag}.log", poll)
    events.extend(read())
    return events, code, wall, rss


def speed_trl(args: argparse.Namespace, side: str, root: Path) -> SideRun:
    spec = trl_spec(args, side, task_overrides(args, args.seed), args.warmup + args.steps, args.seed,
                    root / f"{side}.events.jsonl", None)
    what = "defaults" if side == "trl" else f"no gradient checkpointing, micro-batches of {args.trl_micro}"
    print(f"{side}: TRL GRPOTrainer, {what}", flush=True)
    events, code, wall, rss = run_trl(args, spec, root, side)
    run = SideRun(side, peak_rss_gb=rss, exit_code=code, wall_min=wall / 60)
    for e in events:
        if e["event"] == "step":
            run.seconds.append(e["seconds"])
            run.prompt_tokens.append(e["prompt_tokens"])
            run.completion_tokens.append(e["completion_tokens"])
            run.phases.append({k[:-2]: v for k, v in e.items() if k.endswith("_s")})
    return run


def env_override(args: argparse.Namespace) -> list[str]:
    """``--env``: the bandit of ``train_ppo.sh`` (``bandit``, the recipe's) or the one whose high arm always pays."""
    return [] if args.env == "bandit" else [f"env={args.env}"]


def task_overrides(args: argparse.Namespace, seed: int, model_path: str | None = None) -> list[str]:
    """The task's overrides for ``seed`` (and start weights ``model_path``), the same list for both sides."""
    extra = [f"trainer.seed={seed}"] + env_override(args) + ([f"model.path={model_path}"] if model_path else [])
    if args.learn and args.val_episodes:
        extra.append(f"rollout.val_n_groups={args.val_episodes}")
    return ragen_overrides(args.prompts, args.samples, args.new_tokens, args.lr, args.threads) + extra


def warm_start(args: argparse.Namespace, seed: int, root: Path) -> tuple[str | None, float]:
    """ragen's recipe warm start for ``seed`` (``python -m ragen.sft``): (its actor folder, minutes).

    The recipe's own warm start (its 64 x 1 episodes a step, mini-batches of 16, ``sft.*``), pinned to fp32 and
    ``--threads``: with the benchmark's batch (8 x 8, one update a batch) it learns the format but leaves the arm
    preference where the prior is (validation success 0.03 on seed 0 against the recipe's 0.25-0.72)."""
    if args.warm_start == "none":
        return None, 0.0
    out = root / f"warm_start_s{seed}"
    overrides = ["actor.mixed_precision=fp32", "rollout.dtype=float32", f"trainer.num_threads={args.threads}",
                 f"trainer.seed={seed}", f"trainer.sft_warmup_steps={args.warm_start_steps}", *env_override(args),
                 "trainer.loggers=[console,jsonl]", f"trainer.output_dir={out}", "trainer.resume=none",
                 "trainer.progress_bar=false", "trainer.report=false"]
    code, wall, _ = run_child(ragen_cmd(args, overrides, "ragen.sft"), child_env(args, "ragen"),
                              root / f"warm_start_s{seed}.log")
    actor = out / "checkpoints" / "global_step_0" / "actor"
    if code or not (actor / "config.json").is_file():
        raise SystemExit(f"warm start for seed {seed} failed (exit {code}); see {root / f'warm_start_s{seed}.log'}")
    return str(actor), wall / 60


def learn_ragen(args: argparse.Namespace, seed: int, model: str | None, root: Path) -> LearnRun:
    out = root / f"ragen_s{seed}"
    overrides = task_overrides(args, seed, model) + [
        f"trainer.total_steps={args.max_steps}", f"trainer.val_freq={args.val_every}", "trainer.val_before_train=true",
        "trainer.save_freq=0", f"trainer.output_dir={out}", "trainer.resume=none", "trainer.progress_bar=false"]
    run, read, start = LearnRun("ragen", seed, cap=args.max_steps), jsonl_tail(out / "metrics.jsonl"), time.time()

    def poll() -> bool:
        for rec in read():
            vals = [v for k, v in rec.items() if k.startswith("val/env/") and k.endswith("/success")]
            if vals:
                run.curve.append((int(rec.get("step", 0)), (time.time() - start) / 60, sum(vals) / len(vals)))
                print(f"  ragen seed {seed}: step {run.curve[-1][0]}, {run.curve[-1][1]:.1f} min, val success "
                      f"{run.curve[-1][2]:.3f}", flush=True)
        return run.reached(args.threshold) is not None

    run.exit_code, wall, _ = run_child(ragen_cmd(args, overrides), child_env(args, "ragen"),
                                       root / f"ragen_s{seed}.log", poll)
    poll()
    run.wall_min = wall / 60
    return run


def learn_trl(args: argparse.Namespace, side: str, seed: int, model: str | None, root: Path) -> LearnRun:
    learn = {"val_every": args.val_every, "threshold": args.threshold, "val_before_train": True}
    spec = trl_spec(args, side, task_overrides(args, seed, model), args.max_steps, seed,
                    root / f"{side}_s{seed}.events.jsonl", learn)
    run = LearnRun(side, seed, cap=args.max_steps)

    def on_event(e: dict) -> bool:
        if e["event"] == "val":
            run.curve.append((e["step"], e["minutes"], e["success"]))
            print(f"  {side} seed {seed}: step {e['step']}, {e['minutes']:.1f} min, val success {e['success']:.3f}",
                  flush=True)
        return False  # the TRL process stops itself at the threshold

    _, run.exit_code, wall, _ = run_trl(args, spec, root, f"{side}_s{seed}", on_event)
    run.wall_min = wall / 60
    return run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sides", nargs="+", choices=SIDES, default=None,
                   help="default: all three for speed; ragen and trl-nockpt for --learn")
    p.add_argument("--steps", type=int, default=3, help="timed steps per side (speed)")
    p.add_argument("--warmup", type=int, default=1, help="untimed first steps per side (speed)")
    p.add_argument("--seed", type=int, default=42, help="speed runs' seed (ragen's trainer.seed of the recipe)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--trl-micro", type=int, default=16, help="trl-nockpt: rows per micro-batch")
    p.add_argument("--trl-ragen-process", action="store_true",
                   help="TRL gets ragen's process settings (passive OpenMP wait, glibc malloc tuning)")
    p.add_argument("--profile", action="store_true", help="print where each side's step time goes")
    p.add_argument("--learn", action="store_true", help="time to validation success instead of step time")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--max-steps", type=int, default=40, help="--learn: steps per side and seed before 'not reached'")
    p.add_argument("--val-every", type=int, default=2)
    p.add_argument("--threshold", type=float, default=0.8)
    p.add_argument("--val-episodes", type=int, default=None,
                   help="--learn: validation episodes (default: the recipe's 64); for smoke runs")
    p.add_argument("--env", choices=("bandit", "bandit_sure"), default="bandit",
                   help="bandit: the high arm pays 1.0 one time in 4 (train_ppo.sh's); bandit_sure: it always pays. "
                        "GRPO's per-group std scaling (both sides' default) favours the sure 0.1 arm on the first, "
                        "so --learn is meaningful on the second")
    p.add_argument("--warm-start", choices=("sft", "none"), default="sft")
    p.add_argument("--warm-start-steps", type=int, default=2, help="the bandit recipe's trainer.sft_warmup_steps")
    p.add_argument("--out", default=None, help="folder for runs and logs (default: a temporary folder)")
    args = p.parse_args(argv)
    if args.sides is None:
        args.sides = ["ragen", "trl-nockpt"] if args.learn else list(SIDES)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    version = trl_version()
    if version is None:
        print("skipped: TRL is not installed (bash scripts/setup_trl_bench.sh)")
        return
    import torch
    import transformers

    root = Path(args.out or tempfile.mkdtemp(prefix="ragen_trl_bench_"))
    root.mkdir(parents=True, exist_ok=True)
    info = machine()
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "TRL": version}
    command = "python bench/peers/trl_grpo.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    print(f"{info['cpu']}, {info['cores']} cores, avx512_bf16 {info['avx512_bf16']}; runs and logs in {root}",
          flush=True)
    notes = [f"Task: ragen's bandit (config/ppo_bandit.yaml), GRPO, {args.prompts} prompts x {args.samples} samples a "
             f"step, <= {args.new_tokens} new tokens stopping at </answer>, lr {args.lr:g}, beta 0, temperature 1.0, "
             f"fp32, {args.threads} threads; ragen overrides: "
             + " ".join(ragen_overrides(args.prompts, args.samples, args.new_tokens, args.lr, args.threads)),
             "TRL process settings: " + ("ragen's (passive OpenMP wait, malloc tuning)" if args.trl_ragen_process
                                         else "stock") + f"; OMP_WAIT_POLICY exported: "
             f"{LAUNCH_ENV.get('OMP_WAIT_POLICY', 'no')}"]
    if args.learn:
        body = run_learn(args, root)
    else:
        runs = [speed_ragen(args, root) if s == "ragen" else speed_trl(args, s, root) for s in args.sides]
        body = speed_table(runs, args.warmup) + (profile_table(runs, args.warmup) if args.profile else [])
        notes.append("Tokens/s: completion tokens in the loss (model-sampled; prompt, forced <answer> prefix and "
                     "padding excluded) per second of step time, the same definition on both sides.")
        for r in runs:
            if r.exit_code:
                notes.append(f"{r.name} exited with {r.exit_code}: see {root / (r.name + '.log')}")
    print("\n" + markdown(command, info, versions, body, notes))


def run_learn(args: argparse.Namespace, root: Path) -> list[str]:
    """Every seed: the shared warm start, then each side to the threshold or the step cap."""
    runs = []
    for seed in args.seeds:
        model, ws_min = warm_start(args, seed, root)
        start = f"ragen warm start ({ws_min:.1f} min)" if model else "base model"
        print(f"seed {seed}: start weights: {start}", flush=True)
        for side in args.sides:
            run = learn_ragen(args, seed, model, root) if side == "ragen" else learn_trl(args, side, seed, model, root)
            run.warm_start_min = ws_min
            runs.append(run)
    body = learn_table(runs, args.threshold)
    episodes = args.val_episodes or 64
    body.append(f"Validation: ragen's bandit validation (rollout.val_seed, {episodes} episodes), sampled at the "
                f"training temperature as the recipe validates, every {args.val_every} steps and before training; "
                f"success = env/bandit/success (the high-payout arm pulled). Start weights: "
                + ("ragen's recipe warm start per seed, shared by both sides" if args.warm_start == "sft"
                   else "the base model") + ".")
    return body


if __name__ == "__main__":
    main()
