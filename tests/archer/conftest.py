"""The ArCHer tests reuse the trainer tests' helpers (``from trainer_helpers import ...``): their folder goes on
``sys.path`` here, as pytest does for a test file's own folder. (Not ``from tests.trainer...``: an installed package
may ship a top-level ``tests`` package, e.g. verl does, and shadow this repository's.)"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
