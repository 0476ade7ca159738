"""What a Hydra command is (``ragen train | archer | sft``): its names, default config, help texts and task.

Described here, apart from the code that runs one (``ragen.cli.hydra_app``) and the help that prints one
(``ragen.cli.help``), so both read the same description and neither imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HydraCommand:
    """One Hydra command. ``name``: the ``ragen`` subcommand; ``module``: its ``python -m`` module;
    ``config_name``: the default primary config; ``summary``: what it does (help text); ``examples``: (arguments,
    comment) pairs shown after the program name; ``outputs``: where it writes (help text); ``task``: called with
    Hydra's composed config."""

    name: str
    module: str
    config_name: str
    summary: str
    examples: tuple[tuple[str, str], ...]
    outputs: str
    task: Callable[[Any], None]
