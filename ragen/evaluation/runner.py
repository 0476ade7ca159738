"""Compose the per-env configs, build one engine per model and roll out episodes on fixed seeds.

Episode ``i`` of env ``E`` is played on seed ``rollout.val_seed + i`` for every model, i.e. the trainer's
validation seeds (``AgentProxy.rollout("val")`` uses ``val_seed + g`` for group g; here each group is one
episode), so two models, or a model and the training curve of its run, are compared on the same episodes.
Episodes are played ``batch_size`` at a time: one proxy call runs a batch turn by turn, one engine call per turn.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragen.agent.batch import EpisodeRecord, RolloutBatch
from ragen.evaluation.models import ModelSpec
from ragen.trainer.config.schema import ConfigError, TrainConfig


@dataclass(frozen=True)
class EpisodeResult:
    """What evaluation keeps of one episode: its seed, outcome, summed reward and turn counts.

    ``reward`` is the sum of the turn rewards (the env's rewards plus the proxy's format penalties), the same
    episode reward the trainer logs as ``env/<name>/reward``. ``format_ok``: turns whose response parsed.
    """

    seed: int
    success: bool
    reward: float
    turns: int
    format_ok: int
    failed: bool = False

    @classmethod
    def from_record(cls, record: EpisodeRecord) -> EpisodeResult:
        return cls(seed=record.seed, success=bool(record.success), reward=float(sum(t.reward for t in record.turns)),
                   turns=len(record.turns), format_ok=sum(bool(t.format_ok) for t in record.turns),
                   failed=bool(record.failed))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def env_names_available() -> list[str]:
    """Env config names under ``config/env/`` and the plugin envs loaded so far (what ``--env`` accepts)."""
    import ragen.env
    from ragen.trainer.config.compose import config_dir

    return sorted({p.stem for p in (config_dir() / "env").glob("*.yaml")} | set(ragen.env.plugin_names()))


def env_config(config_name: str, overrides: list[str], env: str | None) -> TrainConfig:
    """The composed config ``config_name`` + ``overrides`` with ``env=<env>`` (None: the config's own env).

    Raises ``ConfigError`` naming the problem: an unknown env (listing ``config/env/``), an unknown config name,
    a malformed override, an env config the env rejects (``ragen.trainer.config.shared_checks.check_env``), agent
    settings ``AgentConfig`` rejects.
    """
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ragen.plugins import PluginError
    from ragen.trainer.config.compose import config_dir, load_train_config, prepare_composition
    from ragen.trainer.config.shared_checks import check_env

    try:  # plugin envs (entry points, imports=[...] among the overrides) before --env is checked
        prepare_composition(config_name, overrides)
    except PluginError as exc:
        raise ConfigError([str(exc)]) from None
    if env is not None and env not in env_names_available():
        raise ConfigError([f"--env {env!r}: no config/env/{env}.yaml; available: {', '.join(env_names_available())}"])
    if not (config_dir() / f"{config_name}.yaml").is_file():
        names = sorted(p.stem for p in config_dir().glob("*.yaml"))
        raise ConfigError([f"--config-name {config_name!r}: no {config_name}.yaml in {config_dir()}; "
                           f"available: {', '.join(names)}"])
    extra = [] if env is None else [f"env={env}"]
    try:
        cfg = load_train_config(config_name, list(overrides) + extra)
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError([f"cannot compose {config_name!r} with overrides {list(overrides) + extra}: "
                           f"{' '.join(str(exc).split())}"]) from None
    problems = check_env(cfg)
    try:  # the proxy builds it only after the model has loaded: check it now
        cfg.agent_config()
    except (TypeError, ValueError) as exc:
        problems.append(f"agent: {exc}")
    if problems:
        raise ConfigError(problems)
    return cfg


def saved_config(path: str, overrides: list[str], env: str | None) -> TrainConfig:
    """The config a run was trained with (its ``config.json``), with ``env=<env>`` (that env's own config file,
    None: the run's env) and ``key=value`` overrides on top; raises ``ConfigError`` naming the problem."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ragen.trainer.config.schema import build_config
    from ragen.trainer.config.shared_checks import check_env

    raw = json.loads(Path(path).read_text())
    if env is not None:
        raw["env"] = dataclasses.asdict(env_config("base", [], env).env)
    odd = [o for o in overrides if o.startswith(("+", "~"))]
    if odd:
        raise ConfigError([f"override {odd[0]!r}: with a run's saved config ({path}) only key=value overrides apply; "
                           "pass --config-name NAME to compose a config instead"])
    try:
        merged = OmegaConf.merge(OmegaConf.create(raw), OmegaConf.from_dotlist(list(overrides)))
    except OmegaConfBaseException as exc:
        raise ConfigError([f"cannot apply {list(overrides)} to {path}: {' '.join(str(exc).split())}"]) from None
    cfg = build_config(OmegaConf.to_container(merged, resolve=True))
    problems = check_env(cfg)
    if problems:
        raise ConfigError(problems)
    return cfg


def agent_for_eval(cfg: TrainConfig, temperature: float) -> Any:
    """The proxy's ``AgentConfig`` of ``cfg`` at ``temperature``.

    The layout is set to ``turn``: it only changes how the batch is collated (rows per turn instead of per
    episode), never what the model sees, and spares evaluation the trainer's warning about cut trajectory rows
    being masked out of training."""
    return dataclasses.replace(cfg.agent_config(), temperature=float(temperature), layout="turn")


def build_model(spec: ModelSpec, cfg: TrainConfig) -> tuple[Any, Any]:
    """(engine, tokenizer) of ``spec``, on the device, dtype and engine of ``cfg`` (``builders.build_engine``).

    A local model uses its folder's tokenizer (``ragen.evaluation.models`` checks it has one). An API model's
    prompts are sent as token ids, so its tokenizer is ``model.tokenizer_path`` or ``model.path`` of the config.
    """
    import torch

    from ragen.models import load_tokenizer
    from ragen.rollout import make_engine
    from ragen.trainer import builders

    if spec.kind == "openai":
        m = cfg.model
        tokenizer = load_tokenizer(m.tokenizer_path or m.path, cache_dir=m.cache_dir)
        key = os.environ.get(spec.api_key_env or "", "")
        engine = make_engine("openai", model=spec.path, base_url=spec.base_url, api_key=key, tokenizer=tokenizer)
        return engine, tokenizer
    if cfg.rollout.engine == "openai":
        raise ConfigError([f"rollout.engine=openai cannot load the local model {spec.label!r}; pass the served "
                           "model as openai:<model> with --base-url, or keep rollout.engine=hf (or vllm)"])
    threads = builders.driver_threads(cfg)
    if threads:
        torch.set_num_threads(threads)
    tokenizer = load_tokenizer(spec.path)
    return builders.build_engine(cfg, spec.path, tokenizer), tokenizer


def episode_results(batch: RolloutBatch) -> list[EpisodeResult]:
    """One result per episode of ``batch``, in slot order (rows of the turn layout are deduplicated with
    ``RolloutBatch.episode_index``)."""
    first: dict[int, EpisodeRecord] = {}
    for index, record in zip(batch.episode_index.tolist(), batch.episodes, strict=True):
        first.setdefault(int(index), record)
    return [EpisodeResult.from_record(first[i]) for i in sorted(first)]


def evaluate_env(engine: Any, tokenizer: Any, cfg: TrainConfig, *, n: int, temperature: float = 0.0,
                 batch_size: int = 32, progress: Callable[[int], None] | None = None) -> list[EpisodeResult]:
    """Play ``n`` episodes of ``cfg.env`` on seeds ``cfg.rollout.val_seed + i`` (i < n), ``batch_size`` per proxy
    call; ``progress(k)`` is called after each batch of k episodes. Results are ordered by seed."""
    from ragen.agent import AgentProxy, EnvGroupSpec

    if n < 1 or batch_size < 1:
        raise ValueError(f"need n >= 1 and batch_size >= 1, got n={n}, batch_size={batch_size}")
    env, agent, base = cfg.env, agent_for_eval(cfg, temperature), cfg.rollout.val_seed
    proxies: dict[int, AgentProxy] = {}  # by batch size: the last batch may be smaller
    results: list[EpisodeResult] = []
    for start in range(0, n, batch_size):
        k = min(batch_size, n - start)
        if k not in proxies:
            spec = EnvGroupSpec(env.name, dict(env.config), k, 1, env.max_turn, env.max_actions_per_turn)
            one = EnvGroupSpec(env.name, dict(env.config), 1, 1, env.max_turn, env.max_actions_per_turn)
            proxies[k] = AgentProxy(engine, tokenizer, agent, [one], [spec], seed=base, val_seed=base)
        proxy = proxies[k]
        proxy.val_seed = base + start  # group g of this batch plays seed base + start + g
        batch_results = episode_results(proxy.rollout("val"))
        expected = list(range(base + start, base + start + k))
        if [r.seed for r in batch_results] != expected:
            raise RuntimeError(f"episodes came back on seeds {[r.seed for r in batch_results]}, expected {expected}")
        results.extend(batch_results)
        if progress is not None:
            progress(k)
    return results


def release_memory() -> None:
    """Collect garbage, return freed heap pages to the OS and empty the CUDA cache after a model's engine is
    dropped, so the next model does not load on top of the last one's memory."""
    import gc

    import torch

    from ragen.utils.memory import release_free_memory

    gc.collect()
    release_free_memory()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def describe_env(cfg: TrainConfig, temperature: float) -> dict[str, Any]:
    """The env and agent settings an evaluation ran with (for the JSON report)."""
    env = cfg.env
    return {"name": env.name, "max_turn": env.max_turn, "max_actions_per_turn": env.max_actions_per_turn,
            "config": dict(env.config), "agent": dataclasses.asdict(agent_for_eval(cfg, temperature))}
