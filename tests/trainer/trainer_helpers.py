"""Shared settings of the trainer's end-to-end tests: a tiny model and batches small enough for 2 CPU cores."""

import json
import math
from pathlib import Path

GROWTH_GB = 0.15  # allowed RSS growth of a process between the last two steps of a run (allocator noise)
PROCESSES = ("driver", "actor", "critic")


def tiny_overrides(out_dir: Path, steps: int = 2, warm_start: bool = False) -> list[str]:
    """Hydra overrides for a seconds-long run of the tiny random model: the ``tiny`` preset
    (``config/preset/tiny.yaml``: sizes, fp32), composed after the experiment's recipe, plus the run's folder and
    length. No warm start unless ``warm_start`` (then the config's own ``trainer.sft_warmup_steps`` holds)."""
    return ["+preset=tiny", f"trainer.output_dir={out_dir}", f"trainer.total_steps={steps}",
            *([] if warm_start else ["trainer.sft_warmup_steps=0"])]


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
    from ragen.trainer.config.compose import load_train_config

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
