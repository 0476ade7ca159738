"""Command-line overrides checked before Hydra composes: "did you mean" for misspelled keys and config choices.

Hydra answers a key the config lacks with ``Key 'lrr' is not in struct`` and a suggestion to append it with
``+actor.lrr=1`` (which the schema then rejects), and an unknown group choice with a list of options. Here each
such override gets one line naming the closest valid key or choice (``difflib``), and the command exits with
status 2 before Hydra runs. The rules follow Hydra's own: ``group=choice`` is a group override when ``group`` is a
config group (a folder under ``config/``, or a ConfigStore group), else ``key=value`` must name an existing key
(``+key=value`` adds one and ``++key=value`` sets or adds, so they are not checked here); ``~key`` must exist.
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

_ABSENT = object()
CUTOFF = 0.6  # difflib similarity below which no suggestion is made


@dataclass(frozen=True)
class ConfigOptions:
    """What the config folder offers: primary configs (``--config-name``) and each group's choices."""

    configs: list[str]
    groups: dict[str, list[str]]


def closest(word: str, candidates: list[str]) -> str | None:
    """The candidate most similar to ``word`` (difflib ratio >= ``CUTOFF``), or None."""
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=CUTOFF)
    return found[0] if found else None


def config_options(search: list[str] | None = None) -> ConfigOptions:
    """Primary configs and top-level groups with their choices, from the config folder (``config_dir()``), the
    ConfigStore and any ``hydra.searchpath=[...]`` override in ``search``."""
    with _loader() as loader:
        return _options(loader, search or [])


def override_problems(config_name: str, overrides: list[str]) -> list[str]:
    """One line per override that names no valid key / choice (or a ``config_name`` that does not exist), with the
    closest valid one; [] when all are valid or when Hydra will reject the command line for another reason
    (a syntax error: its own message is clearer than a guess)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ragen.trainer.config.compose import open_mapping_overrides

    try:  # an open mapping's new entry (algorithm.estimator_args.<name>=v) is an add, checked by its estimator
        parsed = [o for o in OverridesParser.create().parse_overrides(open_mapping_overrides(overrides))
                  if not o.is_sweep_override()]
    except Exception:  # noqa: BLE001 - a syntax error: Hydra reports it
        return []
    search = [o.input_line for o in parsed if o.get_key_element() == "hydra.searchpath"]
    with _loader() as loader:
        opts = _options(loader, search)
    if config_name not in opts.configs:
        near = closest(config_name, opts.configs)
        hint = f"did you mean --config-name {near}? " if near else ""
        return [f"--config-name {config_name}: no such config; {hint}(configs: {', '.join(opts.configs)})"]
    problems, keep, values = [], [], []
    for o in parsed:
        key, value = o.key_or_group, o.value()
        if key.startswith("hydra"):
            keep.append(o.input_line)
        elif key in opts.groups and not isinstance(value, dict):
            bad = [v for v in (value if isinstance(value, list) else [value])
                   if isinstance(v, str) and v not in opts.groups[key]]
            problems += [_choice_problem(o.input_line, key, v, opts.groups[key]) for v in bad]
            if not bad:
                keep.append(o.input_line)
        elif o.is_add() or o.is_force_add():
            keep.append(o.input_line)  # adds the key (the schema checks it later)
        else:
            values.append(o)
    if not values:
        return problems
    try:
        from ragen.trainer.config.compose import compose

        cfg = compose(config_name, keep)
    except Exception:  # noqa: BLE001 - the config itself does not compose: Hydra's message says why
        return problems
    return problems + [p for o in values if (p := _key_problem(cfg, o.input_line, o.key_or_group))]


def _choice_problem(line: str, group: str, choice: str, choices: list[str]) -> str:
    near = closest(choice, choices)
    hint = f"did you mean {group}={near}? " if near else ""
    return f"{line}: config group {group} has no option {choice!r}; {hint}(options: {', '.join(choices)})"


def _key_problem(cfg: Any, line: str, key: str) -> str | None:
    """None when ``key`` exists in the composed ``cfg``, else the line with the closest existing key."""
    from omegaconf import OmegaConf

    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=_ABSENT, throw_on_missing=False) if parent else cfg
    if not OmegaConf.is_dict(node) and node is not _ABSENT:
        return None  # a list index or a leaf's attribute: Hydra judges it
    if OmegaConf.is_dict(node) and leaf in [str(k) for k in node.keys()]:  # keys() includes required (???) keys
        return None
    if OmegaConf.is_dict(node):
        names = [str(k) for k in node.keys()]
        near = closest(leaf, names)
        where = parent or "the config"
        if near:
            return f"{line}: {where} has no key {leaf!r}; did you mean {f'{parent}.' if parent else ''}{near}?"
        return f"{line}: {where} has no key {leaf!r} (its keys: {', '.join(names)})"
    paths = [p for p in _paths(cfg) if not p.startswith("hydra")]
    near = closest(key, paths)
    return f"{line}: no key {key!r} in the config" + (f"; did you mean {near}?" if near else "")


def _paths(node: Any, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a composed config, nested sections included."""
    from omegaconf import OmegaConf

    for k in node.keys():
        path = f"{prefix}{k}"
        yield path
        child = OmegaConf.select(node, str(k), default=None, throw_on_missing=False)
        if OmegaConf.is_dict(child):
            yield from _paths(child, path + ".")


@contextlib.contextmanager
def _loader() -> Iterator[Any]:
    """Hydra's config loader over ``config_dir()`` (Hydra's global state is cleared again on exit)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from ragen.trainer.config.compose import config_dir

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        yield GlobalHydra.instance().config_loader()


def _options(loader: Any, search: list[str]) -> ConfigOptions:
    from hydra.core.object_type import ObjectType

    def listing(group: str, kind: Any) -> list[str]:
        return sorted(loader.get_group_options(group, results_filter=kind, overrides=search))

    groups = {g: listing(g, ObjectType.CONFIG) for g in listing("", ObjectType.GROUP) if g != "hydra"}
    configs = [c for c in listing("", ObjectType.CONFIG) if not c.startswith("_")]  # not Hydra's internal dummy
    return ConfigOptions(configs, groups)
