"""The learning table: does a trained policy read what the environment says? Claims with seeds, bounds and controls.

    python bench/learning_table.py --out runs/learning_table                 # every claim, seeds 0 1 2
    python bench/learning_table.py --out runs/learning_table --claims frozen_lake_3x3 --seeds 0 1 2
    python bench/learning_table.py --out runs/learning_table --plan           # bounds and commands, runs nothing
    python bench/learning_table.py --out runs/learning_table --report         # the table from finished runs

A claim is an env, a validation panel and a method; it holds when, over the seeds, mean - sd of the final
validation success is at least ``bound + margin`` (margin 0.15) and every control, run with the same config and
sample budget, stays below that threshold. ``bound`` is the best score of a policy that never reads the
observations on the same panel (``ragen.evaluation.open_loop``: exhaustive search over fixed plans; for guessing
games the share of games whose secret is among the panel's ``max_turn`` most frequent). Controls: the same run
with ``agent.observations=blind`` (every observation replaced by filler of the same token count: the policy cannot
read the state), or, for a claim about credit across turns, the same run without it (a turn-local discount).
For a credit claim the open-loop bound is stated but not the bar (a fixed plan is the task there): the bar is the
control's mean + margin.

Each run is one ``python -m ragen.train`` process (one at a time: on a 2-core machine parallel runs share the cores),
in ``OUT/<claim>/<method>/seed<s>``; finished runs are kept in ``OUT/results.jsonl`` and skipped on a re-run, so an
interrupted table continues. ``OUT/table.md`` and ``OUT/table.png`` (final success, mean and sd per method, the bound
and the bar drawn) are rewritten after every run. Opt-in: never part of the test suite.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARGIN = 0.15
COMMON = ("trainer.resume=none", "trainer.loggers=[console,jsonl]", "trainer.progress_bar=false")


# sequence-level rejection, the mode docs/async.md recommends for k >= 1 (a stale episode the current policy would no
# longer play leaves the loss whole; token-level weights keep the rest of its tokens at full weight)
ASYNC_K1 = ("trainer.async_rollout=true", "trainer.max_staleness=1", "algorithm.rollout_correction.mode=seq_mask")
ASYNC_K2 = ("trainer.async_rollout=true", "trainer.max_staleness=2", "algorithm.rollout_correction.mode=seq_mask")
# k = 2 on delayed_choice with the check's 5 steps trains on 3 batches of the initial policy (staleness 2 from step
# 3) and stays at its start; 5 + k steps give it as many batches of updated policies as k = 1 had (its control too).
ASYNC_K2_LONGER = (*ASYNC_K2, "trainer.total_steps=7")
PHOENIX_PAYS = ("env.config.low_arm=dragon", "env.config.high_arm=phoenix")


@dataclass(frozen=True)
class Method:
    """One row of a claim: a config and its overrides; ``control`` rows must stay under the claim's bar."""

    name: str
    config: str
    overrides: tuple[str, ...] = ()
    control: bool = False


@dataclass(frozen=True)
class Claim:
    """An env and panel (``panel``: the overrides every method of the claim shares) and its methods. ``kind``:
    ``reads`` (the bar is the open-loop bound + margin), ``credit`` (the bar is the best control + margin) or
    ``threshold`` (the bar is ``bar``, a learning check's fixed threshold).
    ``needs_gain``: the warm start is an expert's, so the claim is RL's gain over it (above the bar as well).
    ``bound_depth``: the longest fixed plan the bound searches (None: the turn budget, or less where the search
    would expand too many states); a stated depth where the full budget cannot be searched."""

    name: str
    what: str
    methods: tuple[Method, ...]
    panel: tuple[str, ...] = ()
    kind: str = "reads"
    needs_gain: bool = False
    bound_depth: int | None = None
    bar: float | None = None


BLIND = ("agent.observations=blind",)
BANDIT_METHODS = (
    Method("GRPO, synchronous", "bandit_learning_check"),
    Method("GRPO, async k=1, seq_mask", "bandit_learning_check", ASYNC_K1),
    Method("GRPO, async k=2, seq_mask", "bandit_learning_check", ASYNC_K2),
)
EXPERT_WARM_START = ("trainer.sft_warmup_steps=6", "sft.noise=0.0", "actor.lr=2e-5")
# GRPO whose baseline compares episodes on one map; groups without reward spread dropped (RAGEN-2's filter)
GRPO_GROUPS = ("algorithm=grpo", "rollout.n_groups=8", "rollout.group_size=4",
               "algorithm.rollout_filter=variance_share", "trainer.total_steps=40")
CLAIMS = (
    Claim("frozen_lake_3x3", "FrozenLake 3x3, 3 turns, greedy validation on 32 maps (train_ppo_multi_turn.sh)", (
        Method("token GAE", "ppo_multi_turn"),
        Method("token GAE, blind", "ppo_multi_turn", BLIND, control=True),
    )),
    Claim("frozen_lake_3x3_grpo", "the same task with GRPO over groups of 4 episodes that replay one map, the "
          "variance-share filter and 40 steps (the FrozenLake lever table's best row)", (
        Method("GRPO over groups", "ppo_multi_turn", GRPO_GROUPS),
        Method("GRPO over groups, blind", "ppo_multi_turn", (*GRPO_GROUPS, *BLIND), control=True),
    )),
    Claim("frozen_lake_3x3_bilevel", "the same task with bi-level GAE (train_ppo_bilevel.sh)", (
        Method("bi-level GAE", "ppo_bilevel"),
        Method("bi-level GAE, blind", "ppo_bilevel", BLIND, control=True),
    )),
    Claim("frozen_lake_3x3_expert", "FrozenLake 3x3 from an expert warm start (6 behaviour-cloning steps on the "
          "solver's plans, sft.noise 0), then the same RL: RL's gain over the warm-started policy", (
        Method("token GAE", "ppo_multi_turn"),
        Method("token GAE, blind", "ppo_multi_turn", BLIND, control=True),
    ), panel=EXPERT_WARM_START, needs_gain=True),
    Claim("twenty_questions_balanced", "Twenty Questions, 4 questions over 8 objects, 16 greedy validation games "
          "holding each object twice (env.config.secret_order=cycle); the ArCHer family at equal samples, filtered BC "
          "the critic-free one", (
        Method("ArCHer", "archer_twenty_questions"),
        Method("filtered BC", "filtered_bc_twenty_questions"),
        Method("CHAI", "chai_twenty_questions"),
        Method("ArCHer, blind", "archer_twenty_questions", BLIND, control=True),
    ), panel=("env.config.secret_order=cycle",), needs_gain=True),
    Claim("sokoban_expert", "Sokoban 6x6, one box, from an expert warm start (the solver's plans), then token GAE: "
          "RL's gain over the warm-started policy", (
        Method("token GAE", "ppo_multi_turn"),
        Method("token GAE, blind", "ppo_multi_turn", BLIND, control=True),
    ), panel=("env=sokoban", *EXPERT_WARM_START), needs_gain=True, bound_depth=6),
    Claim("delayed_choice", "delayed_choice: the first door decides a reward paid after the last turn", (
        Method("bi-level GAE", "credit_learning_check"),
        Method("bi-level GAE, turn-local (high_level_gamma 0)", "credit_learning_check",
               ("algorithm.high_level_gamma=0",), control=True),
    ), kind="credit"),
    Claim("delayed_choice_async", "delayed_choice trained asynchronously: the next batch is played while the "
          "trainer updates, tokens up to k policy versions old, seq_mask correction (docs/async.md); one control, "
          "at the larger sample budget (k=2, 7 steps)", (
        Method("bi-level GAE, async k=1, seq_mask", "credit_learning_check", ASYNC_K1),
        Method("bi-level GAE, async k=2, seq_mask, 7 steps", "credit_learning_check", ASYNC_K2_LONGER),
        Method("bi-level GAE, async k=2, seq_mask, 7 steps, turn-local (high_level_gamma 0)", "credit_learning_check",
               (*ASYNC_K2_LONGER, "algorithm.high_level_gamma=0"), control=True),
    ), kind="credit"),
    Claim("bandit_async", "the bandit's GRPO learning check (config/bandit_learning_check.yaml) with phoenix "
          "paying, synchronous and asynchronous at k = 1, 2, seq_mask correction: sampled validation success on 64 "
          "seeds must reach the check's 0.8 (which arm the format-only warm start prefers varies by seed)",
          BANDIT_METHODS, panel=PHOENIX_PAYS, kind="threshold", bar=0.8),
    Claim("archer_delayed_choice", "ArCHer on delayed_choice after a format-only warm start (config/"
          "archer_delayed_choice.yaml)", (
        Method("ArCHer", "archer_delayed_choice"),
        Method("ArCHer, turn-local (gamma 0)", "archer_delayed_choice", ("archer.gamma=0",), control=True),
    ), kind="credit"),
)


# ----------------------------------------------------------------------------------------------- bounds
def _compose(method: Method, panel: tuple[str, ...]):
    sys.path.insert(0, str(ROOT))
    from ragen.trainer.config.compose import load_train_config

    return load_train_config(method.config, [*method.overrides, *panel])


def open_loop_bound(cfg, depth: int | None = None) -> tuple[float, str]:
    """(best score without reading the observations, how it is reached) on ``cfg``'s validation panel: seeds
    ``rollout.val_seed + g`` for ``g < rollout.val_n_groups``; fixed plans of up to ``depth`` actions (default: the
    turn budget)."""
    import ragen.env as E
    from ragen.evaluation.open_loop import best_fixed_plan, top_guesses_bound

    env = cfg.env
    seeds = [cfg.rollout.val_seed + g for g in range(cfg.rollout.val_n_groups)]
    make: Callable = lambda: E.make(env.name, **env.config)  # noqa: E731
    if env.name in ("twenty_questions", "guess_my_city"):
        secrets = []
        for s in seeds:
            game = make()
            game.reset(s)
            secrets.append(game.secret.name)
        score, guesses = top_guesses_bound(secrets, env.max_turn)
        return score, f"guess {', '.join(guesses)} ({len(set(secrets))} distinct secrets in {len(seeds)} games)"
    actions = _action_set(make, seeds[0], env.max_turn)
    depth = depth or env.max_turn * env.max_actions_per_turn
    while True:
        try:
            bound = best_fixed_plan(make, seeds, actions, depth, markov=env.name != "delayed_choice")
            break
        except RuntimeError:  # too many joint states: a shallower search (stated in the table)
            depth -= 1
    return bound.score, f"{' '.join(bound.plan) or 'no plan'} wins {bound.wins}/{bound.n} (every plan of up to " \
                        f"{depth} actions)"


def _action_set(make: Callable, seed: int, turns: int) -> list[str]:
    """Every action the env lists as legal (``action_list``) in the states reachable from ``seed`` within ``turns``
    steps."""
    import copy

    seen: list[str] = []
    frontier = [make()]
    frontier[0].reset(seed)
    for _ in range(turns):
        nxt = []
        for env in frontier:
            for a in env.action_list():
                if a and a not in seen:
                    seen.append(a)
                child = copy.deepcopy(env)
                if a and not child.step(a).done:
                    nxt.append(child)
        frontier = nxt[:256]
    return seen


# ----------------------------------------------------------------------------------------------- runs
def command(method: Method, panel: tuple[str, ...], seed: int, out: Path) -> list[str]:
    return [sys.executable, "-m", "ragen.train", "--config-name", method.config, *method.overrides, *panel,
            f"trainer.seed={seed}", f"trainer.output_dir={out}", *COMMON]


def val_success(folder: Path) -> list[tuple[int, float, bool]]:
    """(step, success averaged over the validation envs, after the warm start) of every validation record."""
    out = []
    path = folder / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.is_file() else []:
        rec = json.loads(line)
        keys = [k for k in rec if k.startswith("val/env/") and k.endswith("/success")]
        if keys:
            out.append((int(rec.get("step", 0)), sum(rec[k] for k in keys) / len(keys),
                        bool(rec.get("val/after_warm_start"))))
    return out


def run_folder(root: Path, claim: Claim, method: Method, seed: int) -> Path:
    """``root/<claim>/<method>/seed<s>``, the method's name cut to letters, digits, ``.``, ``-`` and ``_`` (the path
    is a Hydra override value, where ``(``, ``,`` or a space would not parse)."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", method.name).strip("_")
    return root / claim.name / name / f"seed{seed}"


def run_one(claim: Claim, method: Method, seed: int, root: Path) -> dict:
    folder = run_folder(root, claim, method, seed)
    cmd = command(method, claim.panel, seed, folder)
    print(f"[table] {claim.name} / {method.name} / seed {seed}: {' '.join(cmd[1:])}", flush=True)
    start = time.monotonic()
    with open(root / "runs.log", "a") as log:
        code = subprocess.call(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    vals = val_success(folder)
    warm = [v for _, v, after in vals if after]
    return {"claim": claim.name, "method": method.name, "seed": seed, "exit_code": code,
            "minutes": round((time.monotonic() - start) / 60, 2), "curve": [[s, v] for s, v, _ in vals],
            "start": warm[-1] if warm else (vals[0][1] if vals else None),
            "final": vals[-1][1] if vals else None, "folder": str(folder)}


def load_results(root: Path) -> list[dict]:
    """The finished runs (exit code 0), the latest record of each (claim, method, seed), in seed order (the report's
    "per seed" column reads seed 0, 1, 2 whatever order the runs finished in). A run that crashed after a
    validation (a full disk, the memory monitor) is left out: its last validation is not the run's final one."""
    path = root / "results.jsonl"
    latest = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        r = json.loads(line)
        if r["exit_code"] == 0:
            latest[(r["claim"], r["method"], r["seed"])] = r
    return [latest[key] for key in sorted(latest)]


# ----------------------------------------------------------------------------------------------- report
def _stats(values: list[float]) -> tuple[float, float]:
    return (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0) if values else (0.0, 0.0)


@dataclass(frozen=True)
class Verdict:
    """A claim's bar and outcome: ``holds`` is None until every method has 3+ finished seeds."""

    bar: float
    holds: bool | None
    line: str


def verdicts(claim: Claim, bound: float, rows: dict[str, list[dict]]) -> Verdict:
    """The claim's verdict from its finished runs: every method (not control) has mean - sd >= bar (and, for a claim
    from a warm start that already reads, ``needs_gain``, a per-seed RL gain final - start with mean - sd > 0), and
    every control's mean stays under the bar."""
    finals = {m.name: [r["final"] for r in rows.get(m.name, []) if r["final"] is not None] for m in claim.methods}
    controls = [statistics.fmean(finals[m.name]) for m in claim.methods if m.control and finals[m.name]]
    if claim.kind == "threshold":
        bar = claim.bar
    else:
        bar = bound + MARGIN if claim.kind == "reads" else (max(controls) + MARGIN if controls else float("nan"))
    parts, oks = [], []
    for m in claim.methods:
        vals = finals[m.name]
        if len(vals) < 3:
            parts.append(f"{m.name}: {len(vals)} of 3+ seeds run")
            oks.append(None)
            continue
        mean, sd = _stats(vals)
        if m.control:
            oks.append(mean < bar)
            parts.append(f"{m.name}: control {'stays under' if oks[-1] else 'REACHES'} the bar")
            continue
        ok = mean - sd >= bar
        text = f"mean - sd {mean - sd:.2f}"
        if claim.needs_gain:
            gains = [r["final"] - r["start"] for r in rows[m.name] if r["final"] is not None and r["start"] is not None]
            g_mean, g_sd = _stats(gains)
            ok = ok and len(gains) >= 3 and g_mean - g_sd > 0
            text += f"; RL gain over the warm start {g_mean:+.2f} ± {g_sd:.2f}"
        oks.append(ok)
        parts.append(f"{m.name}: {'holds' if ok else 'not met'} ({text})")
    holds = None if None in oks else all(oks)
    return Verdict(bar, holds, "; ".join(parts))


def report(root: Path, claims: tuple[Claim, ...], bounds: dict[str, tuple[float, str]]) -> str:
    results = load_results(root)
    lines = ["| claim | method | seeds | start (after any warm start) | final, mean ± sd | per seed | open-loop "
             "bound | bar | minutes |", "|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for claim in claims:
        rows: dict[str, list[dict]] = {}
        for r in results:
            if r["claim"] == claim.name:
                rows.setdefault(r["method"], []).append(r)
        bound, how = bounds[claim.name]
        verdict = verdicts(claim, bound, rows)
        bar = verdict.bar
        for m in claim.methods:
            got = rows.get(m.name, [])
            finals = [r["final"] for r in got if r["final"] is not None]
            starts = [r["start"] for r in got if r["start"] is not None]
            (mean, sd), (s_mean, s_sd) = _stats(finals), _stats(starts)
            label = f"{m.name} (control)" if m.control else m.name
            start = f"{s_mean:.2f} ± {s_sd:.2f}" if starts else "-"
            final = f"**{mean:.2f} ± {sd:.2f}**" if finals else "not run"
            bar_text = f"{bar:.2f}" if bar == bar else "-"  # nan: a credit claim's control has no finished seed
            lines.append(f"| {claim.name} | {label} | {len(finals)} | {start} | {final} | "
                         f"{', '.join(f'{v:.2f}' for v in finals)} | {bound:.2f} | {bar_text} | "
                         f"{sum(r['minutes'] for r in got if r['final'] is not None):.0f} |")
        outcome = {None: "open", True: "HOLDS", False: "NOT MET"}[verdict.holds]
        notes.append(f"- **{claim.name}** ({outcome}): {claim.what}. Open-loop bound {bound:.2f}: {how}. "
                     f"{verdict.line}.")
    return "\n".join(lines + [""] + notes) + "\n"


def plot(root: Path, claims: tuple[Claim, ...], bounds: dict[str, tuple[float, str]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = load_results(root)
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(claims)), 4))
    x = 0
    ticks, labels = [], []
    for claim in claims:
        first = x
        for m in claim.methods:
            finals = [r["final"] for r in results if r["claim"] == claim.name and r["method"] == m.name
                      and r["final"] is not None]
            mean, sd = _stats(finals)
            ax.bar(x, mean, yerr=sd, capsize=4, color="0.7" if m.control else "tab:blue")
            ticks.append(x)
            labels.append(("control: " if m.control else "") + m.name)
            x += 1
        bound = bounds[claim.name][0]
        ax.hlines([bound], first - 0.4, x - 0.6, colors="tab:red", linestyles="dashed")
        x += 0.6
    ax.set_xticks(ticks, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("final validation success (mean ± sd over seeds)")
    ax.set_title("Learning table (dashed: open-loop bound)")
    fig.tight_layout()
    fig.savefig(root / "table.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, required=True, help="folder of the runs, results.jsonl, table.md, table.png")
    p.add_argument("--claims", nargs="*", default=None, help=f"subset of: {' '.join(c.name for c in CLAIMS)}")
    p.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    p.add_argument("--methods", nargs="*", default=None, help="subset of the claims' method names (default: all)")
    p.add_argument("--plan", action="store_true", help="print the bounds and commands; run nothing")
    p.add_argument("--report", action="store_true", help="rewrite table.md / table.png from results.jsonl")
    args = p.parse_args(argv)
    claims = tuple(c for c in CLAIMS if args.claims is None or c.name in args.claims)
    unknown = set(args.claims or ()) - {c.name for c in CLAIMS}
    if unknown:
        p.error(f"unknown claim(s) {sorted(unknown)}; known: {[c.name for c in CLAIMS]}")
    args.out.mkdir(parents=True, exist_ok=True)
    bounds = {c.name: open_loop_bound(_compose(c.methods[0], c.panel), c.bound_depth) for c in claims}
    for c in claims:
        print(f"[table] {c.name}: open-loop bound {bounds[c.name][0]:.3f} ({bounds[c.name][1]})")
    done = {(r["claim"], r["method"], r["seed"]) for r in load_results(args.out)}
    todo = [(c, m, s) for c in claims for s in args.seeds for m in c.methods
            if (c.name, m.name, s) not in done and (args.methods is None or m.name in args.methods)]
    if args.plan:
        for c, m, s in todo:
            print(" ".join(command(m, c.panel, s, Path("<out>"))[1:]))
        return 0
    for c, m, s in [] if args.report else todo:
        result = run_one(c, m, s, args.out)
        with open(args.out / "results.jsonl", "a") as f:
            f.write(json.dumps(result) + "\n")
        print(f"[table] -> exit {result['exit_code']}, {result['minutes']} min, success {result['start']} -> "
              f"{result['final']}", flush=True)
        (args.out / "table.md").write_text(report(args.out, claims, bounds))
        plot(args.out, claims, bounds)
    (args.out / "table.md").write_text(report(args.out, claims, bounds))
    plot(args.out, claims, bounds)
    print((args.out / "table.md").read_text())
    return 0


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    raise SystemExit(main())
