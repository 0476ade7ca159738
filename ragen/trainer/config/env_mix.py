"""Several envs in one run: ``rollout.train_envs`` / ``rollout.val_envs`` (RAGEN's env tags with a group count each).

An entry is ``{name: NAME, n_groups: N}`` (NAME: a file ``config/env/NAME.yaml``, or a plugin env with its own
defaults), optionally with ``max_turn``, ``max_actions_per_turn`` and ``config`` (merged over the env's ``config``).
Each env keeps its own instructions, turn limits and seeds (group g of an env plays seed ``base + rollout * n_groups
+ g`` whatever the other envs, so validation seeds are ``rollout.val_seed + g`` for every env, as in
``ragen.eval``); metrics are per env (``env/<name>/success``). Empty lists keep the single-env run: ``train_envs:
[]`` trains on ``env`` with ``rollout.n_groups`` groups; ``val_envs: []`` validates on the training envs with
``rollout.val_n_groups`` groups each. E.g. train on Sokoban, validate on Sokoban and FrozenLake to measure
transfer::

    rollout.train_envs='[{name: sokoban, n_groups: 4}]'
    rollout.val_envs='[{name: sokoban, n_groups: 8}, {name: frozen_lake, n_groups: 8}]'
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from ragen.trainer.config.schema import ConfigError, EnvSection, TrainConfig

ENTRY_KEYS = ("name", "n_groups", "max_turn", "max_actions_per_turn", "config")


@dataclass(frozen=True)
class EnvGroup:
    """One env of a run and how many groups of it a batch holds (``n_groups`` x ``rollout.group_size`` or
    ``rollout.val_group_size`` episodes)."""

    env: EnvSection
    n_groups: int


def _env_file(name: str) -> dict[str, Any]:
    """The env section ``config/env/<name>.yaml`` composes to (a variant file merged over the env file its
    ``defaults`` name, as Hydra does), or a plugin env's declared defaults."""
    from omegaconf import OmegaConf

    import ragen.env
    from ragen.trainer.config.compose import config_dir

    path = config_dir() / "env" / f"{name}.yaml"
    if not path.is_file() and name in ragen.env.plugin_names():  # a plugin env: its own declared defaults
        return ragen.env.default_config(name)
    if not path.is_file():
        names = sorted(p.stem for p in (config_dir() / "env").glob("*.yaml"))
        raise ConfigError([f"no config/env/{name}.yaml; available: {', '.join(names)}"])
    node = OmegaConf.load(path)
    parents = [e for e in node.pop("defaults", None) or [] if e != "_self_"]  # a variant: its env's file, then its own
    return OmegaConf.to_container(OmegaConf.merge(*[_env_file(str(e)) for e in parents], node), resolve=True)


def _entry(key: str, i: int, raw: Any) -> EnvGroup:
    """``rollout.<key>[i]`` as an :class:`EnvGroup`; a :class:`ConfigError` naming the entry and the fix."""
    where = f"rollout.{key}[{i}]"
    if not isinstance(raw, dict) or "name" not in raw or "n_groups" not in raw:
        raise ConfigError([f"{where}={raw!r} must be a mapping with name and n_groups, "
                           "e.g. {name: frozen_lake, n_groups: 2}"])
    unknown = sorted(set(raw) - set(ENTRY_KEYS))
    if unknown:
        raise ConfigError([f"{where} has unknown key(s) {unknown}; valid keys: {', '.join(ENTRY_KEYS)}"])
    n = raw["n_groups"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError([f"{where}.n_groups={n!r} must be an integer >= 1"])
    try:
        base = _env_file(str(raw["name"]))
    except ConfigError as exc:
        raise ConfigError([f"{where}.name: {p}" for p in exc.problems]) from None
    config = {**dict(base.get("config") or {}), **dict(raw.get("config") or {})}
    fields = {k: raw[k] if raw.get(k) is not None else base.get(k, default)
              for k, default in (("max_turn", 1), ("max_actions_per_turn", 1))}
    try:
        env = EnvSection(name=str(base.get("name", raw["name"])), config=config, **fields)
    except (TypeError, ValueError) as exc:
        raise ConfigError([f"{where}: {exc}"]) from None
    return EnvGroup(env, n)


def _groups(cfg: TrainConfig, key: str) -> list[EnvGroup]:
    entries = getattr(cfg.rollout, key)
    groups = [_entry(key, i, raw) for i, raw in enumerate(entries)]
    names = [g.env.name for g in groups]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError([f"rollout.{key} names env(s) {repeated} more than once; give each env one entry "
                           "(its metrics are keyed by the env name)"])
    return groups


def train_groups(cfg: TrainConfig) -> list[EnvGroup]:
    """The envs of a training batch: ``rollout.train_envs``, or ``env`` with ``rollout.n_groups`` groups."""
    return _groups(cfg, "train_envs") or [EnvGroup(cfg.env, cfg.rollout.n_groups)]


def val_groups(cfg: TrainConfig) -> list[EnvGroup]:
    """The envs of validation: ``rollout.val_envs``, or each training env with ``rollout.val_n_groups`` groups."""
    return _groups(cfg, "val_envs") or [EnvGroup(g.env, cfg.rollout.val_n_groups) for g in train_groups(cfg)]


def n_train_groups(cfg: TrainConfig) -> int:
    """Groups per training batch, all envs together."""
    return sum(g.n_groups for g in train_groups(cfg))


def max_turns(cfg: TrainConfig) -> int:
    """The most turns an episode of the training envs can have (rows per episode in the ``turn`` layout)."""
    return max(g.env.max_turn for g in train_groups(cfg))


def per_env_configs(cfg: TrainConfig) -> list[TrainConfig]:
    """``cfg`` once per distinct env of the run (train and validation), with ``env`` set to it: the per-env
    checks of ``ragen.trainer.config.ppo_checks`` run on each."""
    seen, out = set(), []
    for group in train_groups(cfg) + val_groups(cfg):
        key = (group.env.name, repr(sorted(group.env.config.items())), group.env.max_turn,
               group.env.max_actions_per_turn)
        if key not in seen:
            seen.add(key)
            out.append(dataclasses.replace(cfg, env=group.env))
    return out
