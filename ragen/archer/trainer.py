"""The ArCHer-family driver (Zhou et al. 2024): ArCHer, online CHAI and online filtered BC.

With ``trainer.sft_warmup_steps`` > 0 the policy is first warm-started on the env's expert, as the PPO trainer's
(``ragen.trainer.warm_start``: expert episodes through the agent proxy, ``sft.noise``, BC with the actor's
``sft_update``, optimizer reset, engine weight sync, a validation logged at step 0 with ``val/after_warm_start``);
the paper starts ArCHer from a behaviour-cloned policy too. Then per iteration, named and timed like
``PPOTrainer.train_step``::

    rollout (agent proxy over the engine; CHAI re-ranks k candidates with the target critic, ``ragen.archer.chai``)
    -> store turns in the replay buffer
    -> critic update (archer, chai: ``critic_epochs`` mini-batches; the V target reads the agent's own fresh action:
       a policy sample for ArCHer, the best of k samples for CHAI)
    -> actor update once iteration >= warmup_iter (archer: token-level REINFORCE with A = min Q - min V on fresh
       actions; filtered_bc: BC on the buffer's turns of trajectories at or above the reward quantile of the
       buffer's trajectories)
    -> weight sync to the engine -> metrics, validation, checkpoint (buffer included)

Validation rolls out every family member at ``rollout.val_temperature`` (greedy in the family's configs); CHAI's
choice among k seeded candidates is deterministic there (``ragen.archer.chai``). With ``archer.offline_dialogues``
the warm start imitates recorded dialogues (``ragen.archer.dialogues``) instead of the env's expert.

NaN / inf never reaches the weights (as in the PPO trainer: ``ragen.trainer.numerics``): turns whose
reward or return is not finite never enter the replay buffer (where they would poison every later critic target),
an actor update whose advantages or sampling log-probs are not finite is skipped with its weight sync, a worker
skips an optimizer step whose gradient norm is not finite (``actor/skipped_steps``, ``critic/skipped_steps``),
and after ``trainer.max_consecutive_skips`` consecutive iterations with any of these the run stops naming the
tensor (``nonfinite/<tensor>`` counts in the metrics).

The policy and the critic live in worker groups like the PPO ones: ``trainer.actor_world_size`` /
``trainer.critic_world_size`` Ray actors (FSDP2 ranks; gloo on CPU), or in-process when ``trainer.use_ray=false``.
A critic update splits every mini-batch over the critic ranks (``ArcherCriticWorker``); its results equal world
size 1 (``tests/archer/test_archer_world_size.py``).
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from ragen.agent.batch import episode_records
from ragen.algorithms.archer import filter_cutoff, filtered_bc_keep, trajectory_rewards
from ragen.archer import chai, dialogues
from ragen.archer.buffer import ReplayBuffer, Transition
from ragen.archer.critic import ArcherCriticWorker, CriticSettings
from ragen.archer.transitions import policy_batch, transitions_from_batch
from ragen.archer.workers import ArcherPolicyWorker
from ragen.rollout.base import SamplingParams
from ragen.trainer import builders, layout, numerics
from ragen.trainer.config.archer_schema import uses_critic
from ragen.trainer.config.run_shape import actor_worker_config, world_size
from ragen.trainer.config.schema import TrainConfig
from ragen.trainer.run import Run
from ragen.trainer.state import rng_preserved
from ragen.trainer.warm_start import run_warm_start
from ragen.utils.memory import release_free_memory
from ragen.utils.timing import timed
from ragen.utils.tracking import write_jsonl


def critic_settings(cfg: TrainConfig) -> CriticSettings:
    """The critic worker's settings: the ``critic`` section's encoder / optimiser keys, the ``archer`` loop's
    targets (gamma, tau), mini-batch and micro-batch sizes and loss scale."""
    a, c = cfg.archer, cfg.critic
    return CriticSettings(encoder=c.encoder, max_length=c.encoder_max_length, hidden=c.head_hidden, lr=c.lr,
                          weight_decay=c.weight_decay, betas=tuple(c.betas), eps=c.eps, grad_clip=c.grad_clip,
                          gamma=a.gamma, tau=a.tau, freeze_encoder=c.freeze_encoder, batch_size=a.batch_size,
                          seed=c.seed, micro_batch_size=a.critic_micro_batch_size, loss_scale=a.loss_scale)


def make_critic_group(cfg: TrainConfig, num_threads: int | None) -> Any:
    """The critic's group: ``trainer.critic_world_size`` Ray actors (FSDP2 ranks), or the in-process worker."""
    return builders.make_group(cfg, ArcherCriticWorker, "critic", cfg=critic_settings(cfg), num_threads=num_threads)


def drop_nonfinite(records: list[Transition], rewards: list[float]) -> tuple[list[Transition], list[float], int]:
    """(the turns whose reward, trajectory reward and return are finite, the finite episode totals, number of turns
    dropped): a NaN / inf reward in the replay buffer would poison every critic target it is sampled into."""
    keep = [r for r in records if math.isfinite(r.reward) and math.isfinite(r.traj_reward)
            and math.isfinite(r.mc_return)]
    return keep, [x for x in rewards if math.isfinite(x)], len(records) - len(keep)


class ArcherTrainer:
    """Trains the policy of a frozen :class:`TrainConfig` with ``cfg.algorithm.name``. What the run has (workers,
    engine, proxies, loggers, step, checkpoints) is its :class:`ragen.trainer.run.Run`, ``self.run``; the trainer
    holds the loop, the replay buffer and its counters."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.run = Run(cfg)
        self.skips = numerics.SkipGuard(cfg.trainer.max_consecutive_skips)
        self.buffer = ReplayBuffer(cfg.archer.capacity, seed=cfg.trainer.seed)
        self.episodes_seen = 0

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        """Model and run folder, Ray, the policy (and critic) groups, engine and proxies, then the resume."""
        cfg = self.cfg
        self.run.prepare()  # model folder (a bad model path fails before any write), run folder, seeds
        builders.start_ray(cfg)
        wt = builders.worker_threads(cfg)
        self.run.workers["actor"] = builders.make_group(
            cfg, ArcherPolicyWorker, "actor", model_name_or_path=self.run.model_path, cfg=actor_worker_config(cfg),
            role="actor", num_threads=wt, attn_implementation=cfg.model.attn_implementation)
        self.run.workers["critic"] = make_critic_group(cfg, wt) if uses_critic(cfg.algorithm.name) else None
        self.run.announce()  # the start-up block, as the dry run shows it
        self.run.engine = builders.build_engine(cfg, self.run.model_path, self.run.tokenizer)
        self.run.proxy, self.run.val_proxy = builders.build_proxies(cfg, self.run.engine, self.run.tokenizer)
        self.run.open(self.load_checkpoint)

    def shutdown(self) -> None:
        """Stop the run's worker groups and close its loggers (safe to call twice, or after a failed set-up)."""
        self.run.shutdown()

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        tr = self.cfg.trainer
        last: dict[str, float] = {}
        if tr.val_before_train and self.run.step == 0 and not self.run.warm_started:
            last = self.validate()
            self.run.log(last, 0)
        if tr.sft_warmup_steps > 0 and self.run.step == 0 and not self.run.warm_started:
            last = run_warm_start(self.run, proxy=self._warm_start_proxy(),
                                  row_multiple=self.row_multiple(), sync_engine=self.run.push_actor_weights,
                                  validate=self.validate)
            self.run.warm_started = True
            self.save_checkpoint()  # a crash in the ArCHer loop resumes after the warm start
        bar = tqdm(total=tr.total_steps, initial=self.run.step, desc=self.cfg.algorithm.name, unit="iter",
                   disable=not tr.progress_bar, dynamic_ncols=True)
        while self.run.step < tr.total_steps:
            metrics = self.train_step()
            metrics.update(self.run.memory_metrics())
            self.run.complete_step()
            if self.run.due(tr.val_freq):
                metrics.update(self.validate())
            self.run.log(metrics, self.run.step)
            if self.run.due(tr.save_freq):
                self.save_checkpoint()
            bar.update(1)
            bar.set_postfix(reward=f"{metrics.get('reward/mean', float('nan')):.3f}")
            last = metrics
        bar.close()
        self.run.plot()
        return last

    def train_step(self) -> dict[str, float]:
        """One iteration (see the module docstring); returns its metrics."""
        a, name, t = self.cfg.archer, self.cfg.algorithm.name, {}
        metrics: dict[str, float] = {}
        bad: dict[str, int] = {}  # non-finite inputs met this iteration (see the module docstring)
        start = time.perf_counter()
        with timed("rollout", t):
            batch = self.run.proxy.rollout("train", responder=self._chai_responder if name == "chai" else None)
            self._free_engine_memory()
        metrics.update(batch.metrics)
        with timed("store", t):
            records, rewards = transitions_from_batch(batch, self._decode, a.gamma, self.episodes_seen)
            self.episodes_seen += len(rewards)
            records, rewards, dropped = drop_nonfinite(records, rewards)
            if dropped:
                bad["rewards"] = dropped
            self.buffer.add(records)
        metrics.update(self._rollout_metrics(records, rewards))
        if uses_critic(name) and a.critic_epochs > 0 and len(self.buffer):
            with timed("critic_update", t):
                metrics.update(self._critic_update())
        if self.run.step >= a.warmup_iter and a.actor_epochs > 0 and name != "chai" and len(self.buffer):
            with timed("actor_update", t):
                metrics.update(self._actor_update(bad) if name == "archer" else self._bc_update())
        if bad:
            metrics.update(numerics.skip_metrics(bad))
        self.skips.record(self.run.step + 1, bad | numerics.gradient_skips(metrics))
        metrics.update({f"timing/{k}": v for k, v in t.items()})
        metrics["timing/step"] = time.perf_counter() - start
        return metrics

    # ------------------------------------------------------------------ phases
    def _free_engine_memory(self) -> None:
        """After a rollout or a sampling of buffer states: drop the KV caches the engine kept for a next turn
        (``HFEngine.retain_prefixes``; nothing extends a finished episode) and hand the freed pages back to the OS
        (``release_free_memory``). The ``hf`` engine lives in this process, and with the tuned allocator its freed
        caches and activations would otherwise stay resident through the critic and actor updates."""
        retain = getattr(self.run.engine, "retain_prefixes", None)
        if retain is not None:
            retain([])
        release_free_memory()

    def _one_off(self) -> Any:
        """A context for sampling replay-buffer states: the ``hf`` engine keeps no KV caches for a next turn there
        (``HFEngine.prefix_cache_paused``), since no later call extends these sequences."""
        return getattr(self.run.engine, "prefix_cache_paused", contextlib.nullcontext)()

    def _decode(self, ids: list[int]) -> str:
        return self.run.tokenizer.decode(ids, skip_special_tokens=True)

    def _sampling(self, prompts: list[list[int]], seed: int) -> SamplingParams:
        ag = self.cfg.agent_config()
        room = max(1, ag.max_model_len - max(len(p) for p in prompts))
        return SamplingParams(temperature=ag.temperature, top_p=ag.top_p, top_k=ag.top_k,
                              max_new_tokens=min(ag.max_new_tokens, room), stop_token_ids=(self.run.proxy.fmt.eot_id,),
                              stop=ag.stop_strings, seed=seed)

    def _fresh_actions(self, records: list[Transition], salt: int) -> list[Any]:
        """A new response of the current policy for each record's state (a_pi ~ pi(.|s)): engine samples."""
        prompts = [r.prompt_ids for r in records]
        with self._one_off():
            return self.run.engine.generate(prompts, self._fresh_sampling(prompts, salt))

    def _fresh_sampling(self, prompts: list[list[int]], salt: int) -> SamplingParams:
        return self._sampling(prompts, self.cfg.trainer.seed * 7919 + self.run.step * 31 + salt)

    def _agent_actions(self, records: list[Transition], salt: int) -> list[Any]:
        """The action the current agent takes in each record's state: ArCHer (and filtered BC) a sample of the
        policy; online CHAI its best of ``archer.chai_candidates`` samples by target min-Q (what it plays)."""
        if self.cfg.algorithm.name != "chai":
            return self._fresh_actions(records, salt)
        prompts = [r.prompt_ids for r in records]
        with self._one_off():
            return self._best_of_k(prompts, self._fresh_sampling(prompts, salt))

    def _best_of_k(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Any]:
        critic = self.run.workers["critic"]
        return chai.best_of_k(self.run.engine, prompts, sampling, self.cfg.archer.chai_candidates, self._decode,
                              lambda s, x: critic.call("target_min_q", states=s, actions=x))

    def _critic_update(self) -> dict[str, float]:
        a = self.cfg.archer
        sample = self.buffer.sample(a.critic_epochs * a.batch_size)
        pi = [self._decode(list(s.token_ids)) for s in self._agent_actions(sample, salt=1)]
        self._free_engine_memory()
        return self.run.workers["critic"].call(
            "update", states=[r.state for r in sample], actions=[r.action for r in sample],
            rewards=[r.reward for r in sample], next_states=[r.next_state for r in sample],
            dones=[r.done for r in sample], pi_actions=pi)

    def _actor_update(self, bad: dict[str, int]) -> dict[str, float]:
        """ArCHer's actor: per epoch, sample states, sample fresh actions, A from the online critic, REINFORCE.
        An epoch whose advantages or sampling log-probs hold NaN / inf is skipped (counted into ``bad``)."""
        a, actor = self.cfg.archer, self.run.workers["actor"]
        out: dict[str, float] = {}
        for epoch in range(a.actor_epochs):
            sample = self.buffer.sample(a.batch_size)
            fresh = self._fresh_actions(sample, salt=100 + epoch)
            self._free_engine_memory()
            ids = [list(s.token_ids) or [self.run.proxy.fmt.eot_id] for s in fresh]
            adv = self.run.workers["critic"].call("advantages", states=[r.state for r in sample],
                                              actions=[self._decode(x) for x in ids])
            log_probs = [list(s.log_probs) or [0.0] for s in fresh]
            nonfinite = numerics.nonfinite_counts({"advantages": adv, "sample_log_probs": torch.tensor(
                [x for lp in log_probs for x in lp], dtype=torch.float32)})
            if nonfinite:
                for k, v in nonfinite.items():
                    bad[k] = bad.get(k, 0) + v
                continue
            tb = policy_batch([r.prompt_ids for r in sample], ids, self.run.proxy.pad_id, advantages=adv,
                              log_probs=log_probs)
            m = actor.call("reinforce_update", tb, clip=a.ppo_clip, loss_scale=a.loss_scale)
            self.run.engine.update_weights(actor.call_rank0("full_state_dict"))
            for k, v in m.items():  # means over the epochs; skipped optimizer steps add up
                out[k] = out.get(k, 0.0) + (v if k.endswith("/skipped_steps") else v / a.actor_epochs)
            out["actor/advantage_std"] = out.get("actor/advantage_std", 0.0) + float(adv.std()) / a.actor_epochs
        return out

    def _bc_update(self) -> dict[str, float]:
        """Online filtered BC: imitate the buffer's turns of trajectories at or above the ``filter_quantile`` of the
        rewards of the trajectories in the buffer (the population the kept turns come from, so some always pass;
        the reference code filters every trajectory it ever collected: capacity >= all turns is the same).
        ``actor_epochs * batch_size`` kept turns (with model tokens) are drawn with replacement."""
        a, actor = self.cfg.archer, self.run.workers["actor"]
        records = [r for r in self.buffer.records() if r.action_ids]
        if not records:
            return {"bc/kept_turns": 0.0}
        traj = torch.tensor([r.traj_reward for r in records])
        cutoff = filter_cutoff(trajectory_rewards(torch.tensor([r.episode for r in records]), traj),
                               a.filter_quantile)
        keep = filtered_bc_keep(traj, cutoff).nonzero().flatten()
        out = {"bc/cutoff": cutoff, "bc/kept_turns": float(len(keep))}
        if len(keep) == 0:  # not reached: the best trajectory of the population passes its own quantile
            return out
        idx = torch.randint(len(keep), (a.actor_epochs * a.batch_size,), generator=self.buffer.generator)
        chosen = [records[int(keep[i])] for i in idx.tolist()]
        tb = policy_batch([r.prompt_ids for r in chosen], [r.action_ids for r in chosen], self.run.proxy.pad_id)
        out.update(actor.call("bc_update", tb, agg=a.bc_loss_agg, loss_scale=a.loss_scale))
        self.run.engine.update_weights(actor.call_rank0("full_state_dict"))
        return out

    def _chai_responder(self, slots, prompts: list[list[int]], sampling: SamplingParams) -> list[Any]:
        """Online CHAI acting: the best of k candidates by target min(Q1, Q2) (``ragen.archer.chai``; at greedy
        validation the candidates are drawn at ``agent.temperature`` with the rollout's fixed seeds)."""
        return self._best_of_k(prompts, chai.candidate_sampling(sampling, self.cfg.agent.temperature))

    def _warm_start_proxy(self) -> Any:
        """The agent proxy the warm start rolls out: the train proxy (the env's expert), or with
        ``archer.offline_dialogues`` one over the recorded dialogues replayed in the env's own texts."""
        path = self.cfg.archer.offline_dialogues
        if path is None:
            return self.run.proxy
        return dialogues.replay_proxy(self.cfg, path, self.run.engine, self.run.tokenizer)

    def row_multiple(self) -> int:
        """Rows of a turn-layout batch must divide into the actor's mini-batches and ranks (warm start's BC)."""
        return layout.row_multiple(self.cfg.actor.mini_batch_size, world_size(self.cfg, "actor"))

    def _rollout_metrics(self, records: list[Transition], rewards: list[float]) -> dict[str, float]:
        r = torch.tensor(rewards or [0.0])
        return {"reward/mean": float(r.mean()), "reward/max": float(r.max()), "reward/min": float(r.min()),
                "buffer/size": float(len(self.buffer)), "buffer/new_turns": float(len(records)),
                "rollout/num_turns_mean": len(records) / max(len(rewards), 1)}

    # ------------------------------------------------------------------ validation, logging, checkpoints
    def validate(self, suffix: str = "") -> dict[str, float]:
        """Roll out the validation seeds (CHAI: with its re-ranking), dump JSONL
        (``val_rollouts/step_N<suffix>.jsonl``), ``val/...`` metrics."""
        t: dict[str, float] = {}
        responder = self._chai_responder if self.cfg.algorithm.name == "chai" else None
        with rng_preserved(), timed("validation", t):
            batch = self.run.val_proxy.rollout("val", responder=responder)
            self._free_engine_memory()
        write_jsonl(self.run.dir / "val_rollouts" / f"step_{self.run.step}{suffix}.jsonl",
                           episode_records(batch))
        _, rewards = transitions_from_batch(batch, self._decode, self.cfg.archer.gamma)
        out = {f"val/{k}": v for k, v in batch.metrics.items()}
        out["val/reward/mean"] = float(torch.tensor(rewards or [0.0]).mean())
        out["timing/validation"] = t["validation"]
        return out

    def save_checkpoint(self) -> Path:
        """Actor, critic, replay buffer and trainer state (with ``episodes_seen``) into
        ``checkpoints/global_step_<step>``."""
        path = self.run.write_checkpoint(lambda tmp: self.buffer.save(tmp / "buffer.json"),
                                     episodes_seen=self.episodes_seen)
        tqdm.write(f"[ragen.archer] saved checkpoint {path}")
        return path

    def load_checkpoint(self, path: Path) -> None:
        """Restore the workers, engine weights, step, RNG and seed counters, then the replay buffer."""
        state = self.run.read_checkpoint(path, self.run.push_actor_weights)
        self.buffer = ReplayBuffer.load(Path(path) / "buffer.json")
        self.episodes_seen = int(state["episodes_seen"])
        tqdm.write(f"[ragen.archer] resumed from {path} at iteration {self.run.step}")
