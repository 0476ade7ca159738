"""Supervised warm start before RL: behaviour cloning on the envs' experts, played through the agent proxy (or, for
an agent program, on its expert's answers recorded through the gateway: ``ragen.gateway.expert``).

A small model that never writes a parseable answer (the default model on FrozenLake: format_ok 0 at step 0)
gives RL no reward to assign. ``trainer.sft_warmup_steps`` steps run first, each:

1. ``sft_rollout``: one train batch (``rollout.n_groups`` x ``group_size`` episodes) played by the envs'
   experts (``ExpertResponder``; ``sft.noise`` of the turns take a random legal action) through the agent
   proxy itself, so prompts, template, observations, forced prefix and token masks are those RL sees;
2. ``sft_update``: ``sft.epochs`` passes of ``bc_loss`` over the batch's model tokens (``response_mask``) at
   ``sft.lr`` (constant, or decaying linearly to 0 over the whole warm start: ``sft.lr_schedule``), with the
   actor's mini/micro batches (``PolicyWorker.sft_update``).

Then the actor's optimizer state is reset (RL starts with fresh Adam moments and its own, untouched lr
schedule), the engine gets the new weights, and a validation runs. Every record is logged at step 0:
``sft/...`` per warm-start step, and the validation after the warm start as ``val/...`` with
``val/after_warm_start = 1`` (the curve shows untrained -> after warm start at step 0, then RL).

Both trainers run it on their :class:`ragen.trainer.run.Run` with what is theirs passed in (the proxy to imitate
through, the row multiple, the engine's weight sync, the validation): the PPO trainer
(``ragen.ppo.trainer``) and the ArCHer family's (``ragen.archer.trainer``). The warm start alone, with
no RL after it (``python -m ragen.sft`` = ``ragen sft``), is the same run on the config :func:`sft_config` makes:
``trainer.total_steps=0``, and ``DEFAULT_STEPS`` warm-start steps when the config has none. Its checkpoint
``<trainer.output_dir>/checkpoints/global_step_0`` holds an ``actor`` folder that is a transformers model: start
RL from it with ``model.path=<that folder>``, or run both in one job with ``trainer.sft_warmup_steps=N``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from ragen.agent.expert import ExpertResponder
from ragen.env.base import is_program
from ragen.trainer import numerics
from ragen.trainer.config.schema import TrainConfig
from ragen.trainer.layout import layout_of
from ragen.trainer.run import Run
from ragen.utils import console
from ragen.utils.checkpoint import reference_dir
from ragen.utils.timing import timed

DEFAULT_STEPS = 20  # warm-start steps of ``ragen sft`` when the config has trainer.sft_warmup_steps=0


def sft_config(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` as a warm-start-only job (``ragen sft``): no RL steps, ``DEFAULT_STEPS`` warm-start steps unless
    set."""
    steps = cfg.trainer.sft_warmup_steps or DEFAULT_STEPS
    trainer = dataclasses.replace(cfg.trainer, total_steps=0, sft_warmup_steps=steps)
    return dataclasses.replace(cfg, trainer=trainer)


def sft_rates(sft: Any, k: int, steps: int) -> dict[str, float]:
    """``sft_update``'s rate arguments for warm-start step ``k`` of ``steps``: ``sft.lr`` throughout, or with
    ``sft.lr_schedule=linear`` the part ``[k/steps, (k+1)/steps)`` of one linear decay from ``sft.lr`` to 0."""
    if sft.lr_schedule == "constant":
        return {"lr": sft.lr}
    return {"lr": sft.lr * (1 - k / steps), "lr_end": sft.lr * (1 - (k + 1) / steps)}


def rebase_reference(run: Run) -> None:
    """Make the KL reference the policy RL starts from (InstructGPT eq. 2; verl loads the reference from the actor's
    checkpoint): after the warm start, KL = 0 on the first RL batch, as when ``ragen sft`` and then
    ``model.path=<actor folder>`` run as two jobs. A LoRA actor (its own reference: adapters off) folds its adapters
    into the base and starts them again (``merge_adapters``); a reference worker group reads the actor's weights
    from ``reference_dir`` (written by the actor's ranks, read by the reference's: nothing goes through this
    process), which resume and restarts read again (``Run.read_checkpoint``)."""
    actor, ref = run.workers["actor"], run.workers.get("ref")
    if run.cfg.actor.lora:
        actor.call("merge_adapters")
    if ref is not None:
        folder = str(reference_dir(run.dir))
        actor.call("save", dir=folder, optimizer=False)
        ref.call("load", dir=folder)


def run_warm_start(run: Run, *, proxy: Any, row_multiple: int, sync_engine: Callable[[], Any],
                   validate: Callable[[str], dict[str, float]]) -> dict[str, float]:
    """Run ``trainer.sft_warmup_steps`` warm-start steps on the set-up ``run`` (its config, actor group with
    ``sft_update`` / ``reset_optimizer``, i.e. a ``PolicyWorker``, tokenizer and logger); returns the metrics of
    the validation after it. ``proxy``: the agent proxy whose train envs' experts are imitated (the train proxy;
    the ArCHer trainer may pass one over recorded dialogues); ``row_multiple``: the rows a turn-layout batch is
    padded to a multiple of; ``sync_engine()``: the actor's new weights into the engine; ``validate(suffix)``: the
    trainer's validation, its rollouts written to ``val_rollouts/step_0<suffix>.jsonl``."""
    cfg = run.cfg
    actor = run.workers["actor"]
    if is_program(cfg.env.name):  # the program's expert answers its calls through the gateway
        responder = proxy.expert_responder()
    else:
        responder = ExpertResponder(run.tokenizer, cfg.agent_config(), proxy.fmt.eot_id,
                                    noise=cfg.sft.noise, seed=cfg.trainer.seed,
                                    random_actions=cfg.sft.random_actions)
    steps, layout = cfg.trainer.sft_warmup_steps, layout_of(cfg)
    # a warm-start step whose every episode failed teaches nothing: stop at the first (naming the env's error)
    failed = numerics.FailedEpisodesGuard(min(cfg.trainer.max_failed_steps, 1), what="warm-start step")
    bar = tqdm(total=steps, desc="warm start", unit="step", file=console.err_stream(),
               disable=not cfg.trainer.progress_bar, dynamic_ncols=True)
    for k in range(steps):
        t: dict[str, float] = {}
        with timed("sft_rollout", t):
            batch = proxy.rollout("train", responder=responder)
        failed.record(k + 1, batch.episodes)
        tb = layout.padded(layout.train_batch(batch), row_multiple, proxy.pad_id)
        with timed("sft_update", t):
            metrics = actor.call("sft_update", tb, epochs=cfg.sft.epochs, **sft_rates(cfg.sft, k, steps))
        metrics.update({f"sft/{k2}": v for k2, v in batch.metrics.items() if k2.startswith("env/")})
        metrics.update({f"timing/{name}": v for name, v in t.items()})
        metrics["sft/step"] = float(k + 1)
        metrics["sft/noise_turns"] = float(responder.stats["noise_turns"])
        run.log(metrics, 0)
        bar.update(1)
        bar.set_postfix(nll=f"{metrics.get('sft/nll', float('nan')):.3f}")
    bar.close()
    actor.call("reset_optimizer")
    rebase_reference(run)
    sync_engine()
    val = validate("_after_warm_start")  # val_rollouts/step_0_after_warm_start.jsonl beside the untrained step_0
    val["val/after_warm_start"] = 1.0
    run.log(val, 0)
    return val
