"""kill -9 of the real trainer (``python -m ragen.train``) during its checkpoint saves (the full campaign
is ``python bench/faults.py --trainer --kills 20``): every kill resumes from a complete checkpoint, losing at most the
step being saved. ~30 s for 3 kills (each kill is a trainer start), so it runs with the long tests (``-m learning``).
"""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.learning
def test_three_kills_of_the_real_trainer_resume_cleanly(tmp_path):
    spec = importlib.util.spec_from_file_location("faults_trainer", ROOT / "bench" / "faults_trainer.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    rep = mod.run_trainer_kills(tmp_path, kills=3, seed=1)
    assert rep.failures == []
    assert (rep.tried, rep.resumed) == (3, 3)
    assert set(rep.lost_steps) <= {0, 1} and sum(rep.lost_steps.values()) == 3
    assert 0.01 < rep.save_seconds < 30
