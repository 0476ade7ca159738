"""``python -m ragen.report RUN_DIR [RUN_DIR ...]``: rebuild each run folder's ``report/`` from its saved files."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ragen.report.build import build_report, report_steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ragen.report", description=__doc__)
    parser.add_argument("run_dirs", nargs="+", type=Path, help="run folder(s) (trainer.output_dir)")
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
    raise SystemExit(main())
