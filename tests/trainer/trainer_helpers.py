"""Shared settings of the trainer's end-to-end tests: a tiny model and batches small enough for 2 CPU cores."""

import json
import math
from pathlib import Path

GROWTH_GB = 0.15  # allowed RSS growth of a process between the last two steps of a run (allocator noise)
PROCESSES = ("driver", "actor", "critic")


def tiny_overrides(out_dir: Path, steps: int = 2, warm_start: bool = False) -> list[str]:
    """Hydra overrides for a seconds-long run of the tiny random model.

    Precision is pinned to fp32 (not the ``auto`` default): results then do not depend on whether the CPU has
    native bf16, and an AVX2-only CPU never runs emulated bf16 (~60x slower than fp32). The critic is its own
    worker and validation greedy (base defaults; the bandit launch config changes both for its default-model run),
    and there is no warm start unless ``warm_start`` (then the config's own ``trainer.sft_warmup_steps`` holds).
    """
    return [*([] if warm_start else ["trainer.sft_warmup_steps=0"]),
        "model=tiny", f"trainer.output_dir={out_dir}", f"trainer.total_steps={steps}",
        "trainer.loggers=[console,jsonl]", "trainer.progress_bar=false", "agent.max_new_tokens=12",
        "rollout.n_groups=2", "rollout.group_size=2", "rollout.val_n_groups=2",
        "actor.mini_batch_size=4", "actor.micro_batch_size=2", "critic.mini_batch_size=4",
        "critic.micro_batch_size=2", "actor.lr=1e-3", "critic.lr=1e-3", "trainer.num_threads=1",
        "actor.mixed_precision=fp32", "critic.mixed_precision=fp32", "rollout.dtype=float32",
        "critic.share_backbone=false", "rollout.val_temperature=0.0",
    ]


def critic_free(overrides: list[str]) -> list[str]:
    """``overrides`` without the critic's settings, for a command line with a critic-free estimator: there every
    ``critic.*`` key typed on the command line is refused as doing nothing (``ragen.trainer.inert``)."""
    return [o for o in overrides if not o.startswith("critic.")]


def read_metrics(run_dir: Path) -> list[dict]:
    with (Path(run_dir) / "metrics.jsonl").open() as fh:
        return [json.loads(line) for line in fh if line.strip()]


def rss_without_growth(records: list[dict], processes: tuple[str, ...] = PROCESSES) -> dict[str, list[float]]:
    """Each process's ``memory/<process>_rss_gb`` per step (the records that log memory, in order); asserts that
    none grew by ``GROWTH_GB`` or more between the last two steps (a leak would: state kept alive across steps)."""
    rss = {p: [r[f"memory/{p}_rss_gb"] for r in records if "memory/driver_rss_gb" in r] for p in processes}
    for p, values in rss.items():
        assert len(values) >= 2 and values[-1] - values[-2] < GROWTH_GB, (p, values)
    return rss


def assert_all_finite(records: list[dict]) -> None:
    bad = [(r["step"], k, v) for r in records for k, v in r.items() if not math.isfinite(float(v))]
    assert not bad, f"non-finite metrics: {bad[:10]}"


def tiny_init_weights() -> dict:
    """The tiny model's initial weights (the folder every tiny run starts from)."""
    from safetensors.torch import load_file

    from ragen.trainer.builders import prepare_model
    from ragen.trainer.compose import load_train_config

    path, _ = prepare_model(load_train_config("base", ["model=tiny"]))
    weights = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        weights.update(load_file(f))
    return weights


def load_actor_weights(ckpt: Path) -> dict:
    from safetensors.torch import load_file

    weights = {}
    for f in sorted((Path(ckpt) / "actor").glob("*.safetensors")):
        weights.update(load_file(f))
    return weights


def gpu_overrides(out_dir: Path, device: str, tokenizer_dir: str, steps: int = 3, *extra: str) -> list[str]:
    """Overrides of a run of the ``trainer=gpu`` group on one device: one GPU, in-process workers, the hf engine,
    ``tiny_overrides`` sizes with every group kept (the GPU recipes keep the top 25% of 8 groups), no validation
    before the final one, the tokenizer from ``tokenizer_dir`` (a folder ``ragen.models.export_tokenizer`` wrote: the
    GPU machine has no packaged default model). ``device`` ``cpu`` runs the same config on CPU. ``extra`` overrides
    replace earlier values of the same keys."""
    base = [*tiny_overrides(out_dir, steps), "trainer=gpu", "trainer.n_gpus_per_node=1", f"trainer.device={device}",
            "rollout.engine=hf", "trainer.use_ray=false", "trainer.val_before_train=false", "trainer.val_freq=0",
            "algorithm.rollout_filter_ratio=1.0", f"model.tokenizer_path={tokenizer_dir}"]
    replaced = {e.split("=", 1)[0] for e in extra}
    return [o for o in base if o.split("=", 1)[0] not in replaced] + list(extra)
