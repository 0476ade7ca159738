"""Utilities shared by the trainers: metric tracking, checkpoints, seeding, timing, plotting."""

from ragen.utils.checkpoint import latest_checkpoint, resolve_resume, write_checkpoint
from ragen.utils.seeding import get_rng_state, seed_everything, set_rng_state
from ragen.utils.timing import timed

__all__ = [
    "get_rng_state",
    "latest_checkpoint",
    "resolve_resume",
    "seed_everything",
    "set_rng_state",
    "timed",
    "write_checkpoint",
]
