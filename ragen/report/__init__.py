"""The run report: self-contained HTML pages of a run folder (learning curves, config, timing per phase, and one
page per step with every validation episode and a training sample, each model token coloured by its advantage).

``python -m ragen.report RUN_DIR`` rebuilds ``RUN_DIR/report/`` from the saved files; the trainer refreshes it at
every validation (``trainer.report``). See :mod:`ragen.report.build` (pages), :mod:`ragen.report.episodes` (step
pages, colour scale) and :mod:`ragen.report.records` (what is saved per token, and its position convention).
"""

from ragen.report.build import build_report, pending_steps, report_steps
from ragen.report.records import Credit, episode_token_records, sample_indices

__all__ = ["Credit", "build_report", "episode_token_records", "pending_steps", "report_steps", "sample_indices"]
