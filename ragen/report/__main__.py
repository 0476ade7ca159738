"""``python -m ragen.report RUN_DIR [RUN_DIR ...]`` = ``ragen report``: rebuild each run folder's ``report/`` from its
saved files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragen.allocator import tune_process
from ragen.report.build import build_report, report_steps

DESCRIPTION = """Rebuild the HTML report of one or more run folders from their saved files (metrics.jsonl,
val_rollouts/, train_samples/): RUN_DIR/report/index.html with the learning curves and a page per step
(step_N.html) showing the episodes with their tokens and credit. Training writes the report itself at every
validation (trainer.report=true); this rebuilds it, e.g. after a crash or for an older run."""

EXAMPLES = """examples:
  {prog} runs/frozen_lake_gae                  # writes runs/frozen_lake_gae/report/
  {prog} runs/bandit_gae runs/bandit_grpo      # several run folders"""


def main(argv: list[str] | None = None, prog: str = "python -m ragen.report") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=EXAMPLES.format(prog=prog),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIR",
                        help="run folder(s) (trainer.output_dir)")
    args = parser.parse_args(argv)
    status = 0
    for run_dir in args.run_dirs:
        if not (run_dir / "metrics.jsonl").exists() and not report_steps(run_dir):
            print(f"{run_dir}: no metrics.jsonl, val_rollouts/ or train_samples/ (not a run folder?)", file=sys.stderr)
            status = 1
            continue
        index = build_report(run_dir)
        print(f"{index} ({len(report_steps(run_dir))} step page(s))")
    return status


if __name__ == "__main__":
    tune_process()
    raise SystemExit(main())
