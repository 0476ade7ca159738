"""The task both sides of ``bench/peers/trl_grpo.py`` train on: ragen's bandit as ``train_ppo.sh`` runs it.

Everything the peer sees comes from ragen's own code, so the two sides differ only in how they train:

* the config: ``config/ppo_bandit.yaml`` (the bandit recipe for the CPU) composed with the bench's overrides
  (:func:`ragen_overrides`), the same list the ragen side's command line gets;
* the prompts: ragen's agent proxy renders them (chat template, env instructions, forced ``<answer>`` prefix) for
  the seeds ragen's trainer would play at each step (:meth:`BanditTask.train_rows`), handed to the peer as text that
  tokenises back to exactly ragen's prompt ids (checked);
* the reward: the peer's completions are played through the proxy again (:meth:`BanditTask.rewards`): ragen's parser,
  the env's step reward for the parsed arm, ragen's format penalty for an unparseable answer;
* validation: ragen's validation proxy (its seeds, group size and sampling temperature) with the peer's model as the
  engine (:meth:`BanditTask.validate`); success is the proxy's ``env/<name>/success``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def ragen_overrides(prompts: int, samples: int, new_tokens: int, lr: float, threads: int) -> list[str]:
    """The Hydra overrides that make ``ppo_bandit`` the benchmark's task on both sides.

    GRPO with ``prompts`` groups of ``samples`` episodes a step, fp32 (actor and engine), ``threads`` torch threads,
    ``new_tokens`` new tokens, lr ``lr``, no warm start (the peer has none; ``--learn`` gives both sides the same
    warm-started weights instead), one optimizer step per batch (``actor.mini_batch_size`` = the whole batch, as TRL
    steps once per generation batch; micro-batches of 16 rows), loggers without wandb (TRL reports to nothing).
    """
    rows = prompts * samples
    return [
        "algorithm=grpo", f"rollout.n_groups={prompts}", f"rollout.group_size={samples}",
        f"agent.max_new_tokens={new_tokens}", f"actor.lr={lr:g}", "actor.mixed_precision=fp32", "rollout.dtype=float32",
        f"trainer.num_threads={threads}", "trainer.sft_warmup_steps=0", f"actor.mini_batch_size={rows}",
        f"actor.micro_batch_size={min(16, rows)}", "trainer.loggers=[console,jsonl]",
    ]


class BanditTask:
    """ragen's composed config, tokenizer, and train / validation proxies for ``overrides`` on ``ppo_bandit``.

    ``model_path``: the policy's local folder (the default alias resolved by ``ragen.models``, or the override's).
    """

    def __init__(self, overrides: list[str], config_name: str = "ppo_bandit") -> None:
        from ragen.trainer.builders import build_proxies, prepare_model
        from ragen.trainer.config.compose import load_train_config

        self.cfg = load_train_config(config_name, list(overrides))
        self.model_path, self.tokenizer = prepare_model(self.cfg)
        self.train_proxy, self.val_proxy = build_proxies(self.cfg, None, self.tokenizer)
        self.agent = self.train_proxy.cfg
        (self.spec,) = self.train_proxy.managers["train"].specs

    def _capture(self, proxy: Any, mode: str) -> list[tuple[int, list[int]]]:
        """(seed, prompt ids) of every episode of one ``proxy.rollout(mode)``; the responder ends each turn at once."""
        from ragen.rollout.base import Sample

        seen: list[tuple[int, list[int]]] = []

        def responder(slots: list, prompts: list[list[int]], sampling: Any) -> list:
            seen.extend((slot.seed, list(p)) for slot, p in zip(slots, prompts, strict=True))
            return [Sample([proxy.fmt.eot_id], [0.0], "stop") for _ in prompts]

        proxy.rollout(mode, responder=responder)
        return seen

    def prompt_text(self, ids: list[int]) -> str:
        """The text of prompt ``ids`` (special tokens kept), checked to tokenise back to exactly ``ids``."""
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        back = list(self.tokenizer(text=[text])["input_ids"][0])
        if back != list(ids):
            raise RuntimeError("the prompt text does not tokenise back to ragen's prompt ids; the peer would see "
                               "other tokens than ragen")
        return text

    def train_rows(self, steps: int) -> list[dict[str, Any]]:
        """One row per env group for ``steps`` training steps, in ragen's order: ``{"prompt": text, "seed": s}``.

        Row ``t * n_groups + g`` is group g of ragen's step t+1 (seed ``trainer.seed + t * n_groups + g``); the
        proxy's counters advance exactly as in a run, so a peer that takes rows in order plays ragen's seeds."""
        rows = []
        for _ in range(steps):
            group_seen: dict[int, list[int]] = {}
            for seed, ids in self._capture(self.train_proxy, "train"):
                group_seen.setdefault(seed, ids)
            rows += [{"prompt": self.prompt_text(ids), "seed": seed} for seed, ids in group_seen.items()]
        return rows

    def rewards(self, prompts: list[str], completion_ids: list[list[int]], seeds: list[int]) -> list[dict]:
        """ragen's outcome of each completion: ``{"reward", "success", "format_ok"}``, in the given order.

        The completions of one seed are played as one env group of a fresh proxy seeded there (the proxy's group
        seed is then that seed): its prompt must be the peer's prompt token for token, and its parser, env step and
        format penalty give the reward (the episode's total, as ragen's trajectory reward)."""
        from ragen.agent import AgentProxy, EnvGroupSpec
        from ragen.rollout.base import Sample

        out: list[dict | None] = [None] * len(seeds)
        by_seed: dict[int, list[int]] = {}
        for i, s in enumerate(seeds):
            by_seed.setdefault(int(s), []).append(i)
        spec = self.spec
        for seed, idx in by_seed.items():
            group = EnvGroupSpec(spec.name, dict(spec.config), 1, len(idx), spec.max_turn, spec.max_actions_per_turn)
            proxy = AgentProxy(None, self.tokenizer, self.agent, [group], [], seed=seed)

            def responder(slots: list, ids: list[list[int]], sampling: Any, idx: list[int] = idx) -> list:
                for i, p in zip(idx, ids, strict=True):
                    if list(self.tokenizer(text=[prompts[i]])["input_ids"][0]) != list(p):
                        raise RuntimeError(f"seed {seeds[i]}: the peer's prompt differs from ragen's")
                return [Sample(list(completion_ids[i]), [0.0] * len(completion_ids[i]), "stop") for i in idx]

            batch = proxy.rollout("train", responder=responder)
            for i, ep in zip(idx, batch.episodes, strict=True):
                out[i] = {"reward": float(sum(t.reward for t in ep.turns)), "success": bool(ep.success),
                          "format_ok": all(t.format_ok for t in ep.turns)}
        return [o for o in out if o is not None]

    def validate(self, generate: Callable[[list[list[int]], Any], list]) -> float:
        """Success rate of ragen's validation rollout with ``generate(prompt_ids, sampling) -> [Sample]`` as the
        engine (the validation proxy's seeds, group size, temperature, token budget and stop strings)."""
        batch = self.val_proxy.rollout("val", responder=lambda slots, prompts, sampling: generate(prompts, sampling))
        return float(batch.metrics[f"env/{self.spec.name}/success"])

    def describe(self) -> dict[str, Any]:
        """What the run's validation is (for the printout): seeds, episodes, decoding."""
        ro = self.cfg.rollout
        temp = self.val_proxy.cfg.temperature
        return {"val_seeds": f"{ro.val_seed}..{ro.val_seed + ro.val_n_groups - 1}",
                "val_episodes": ro.val_n_groups * ro.val_group_size,
                "val_decoding": "greedy" if temp == 0 else f"sampled at temperature {temp:g}",
                "stop": list(self.agent.stop_strings), "format_penalty": self.agent.format_penalty}
