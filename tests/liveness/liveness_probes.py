"""Probes of the liveness walk: each turns a frozen ``TrainConfig`` into named tensors through the code the trainer
runs with it (imported as ``from liveness_probes import ...``).

* ``credit``: rollout filtering, then ``credit.step_credit`` (the PPO step's reward shaping and estimator, both
  layouts) on the fixed batch of ``liveness_inputs``: ``advantages``, ``returns``.
* ``loss``: ``credit`` and the rollout-correction weights (``credit.rollout_correction``), then
  ``ragen.workers.actor.policy_objective`` (the actor's micro-batch loss) at fixed log-probs: the ``loss`` and
  ``grad`` (its gradient w.r.t. the token log-probs).
* ``actor_optimizer`` / ``critic_optimizer``: the workers' ``Trainable`` (AdamW, lr schedule, grad clip, mini /
  micro batches, epochs) with the role's worker config (``derived.actor_worker_config``), two updates of a fixed
  linear model on a fixed regression batch of the train batch's size: its ``params`` after each update.
* ``rollout``: the trainer's agent proxies (``builders.build_proxies``) over a scripted engine on the default
  tokenizer: train and validation ``prompt_tokens`` / ``sampled_tokens`` / ``token_rewards``.
* ``rollout_real``: the same with the trainer's model folder and engine (``builders.prepare_model`` /
  ``build_engine``, the tiny random model): sampled tokens and their log-probs depend on temperature, dtype, seed.
* ``expert``: the train proxy played by the envs' experts (``ExpertResponder``, noise 0.5), so each env key shows in
  prompts (observations), answers or rewards; ``warm_start``: the batches ``run_warm_start`` feeds ``sft_update``.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import liveness_inputs as inputs
import torch

from ragen.trainer.config.schema import ConfigError, TrainConfig

# The configuration every probe starts from: the base config with the tiny model, small fixed batch sizes and fp32.
PROBE_BASE = (
    "model=tiny", "trainer.use_ray=false", "rollout.n_groups=2", "rollout.group_size=4", "rollout.val_n_groups=2",
    "actor.micro_batch_size=2", "critic.micro_batch_size=2",
    "actor.mixed_precision=fp32", "critic.mixed_precision=fp32", "rollout.dtype=float32", "agent.max_new_tokens=24",
    "trainer.loggers=[jsonl]", "trainer.progress_bar=false", "trainer.report=false", "trainer.resume=none",
    "actor.lr=1e-3", "critic.lr=1e-3", "actor.mini_batch_size=4", "critic.mini_batch_size=4",
)


class Configs:
    """Frozen configs of the walk: each context (Hydra overrides such as ``algorithm=grpo``) composed once over
    :data:`PROBE_BASE`, then one key set on a copy of its tree (interpolations kept: ``actor.temperature`` follows
    ``agent.temperature`` as in ``base.yaml``)."""

    def __init__(self, base: tuple[str, ...] = PROBE_BASE) -> None:
        self.base = base
        self._trees: dict[tuple[str, ...], Any] = {}

    def tree(self, context: tuple[str, ...]) -> Any:
        if context not in self._trees:
            from ragen.trainer.config.compose import compose

            by_key = {o.split("=", 1)[0]: o for o in [*self.base, *context]}  # a later override of a key wins
            self._trees[context] = compose("base", list(by_key.values()))
        return self._trees[context]

    def build(self, context: tuple[str, ...], key: str | None = None, value: Any = None) -> TrainConfig:
        """The frozen config of ``context`` with ``key`` set to ``value`` (raises ConfigError for a value the
        schema refuses), with the Python-only env arguments of :func:`with_python_only`."""
        from omegaconf import OmegaConf

        from ragen.trainer.config.compose import to_train_config

        tree = copy.deepcopy(self.tree(context))
        if key is not None:
            OmegaConf.update(tree, key, value, merge=False)
        return with_python_only(to_train_config(tree))


def lookup(cfg: TrainConfig, key: str) -> Any:
    """The value of dotted ``key`` in ``cfg`` (``env.config.size``: a dict entry, None when absent)."""
    obj: Any = cfg
    for part in key.split("."):
        obj = obj.get(part) if isinstance(obj, dict) else getattr(obj, part)
    return obj


def rejection(cfg_or_error: TrainConfig | ConfigError, overrides: tuple[str, ...] = ()) -> ConfigError | None:
    """The ConfigError that stops ``cfg`` before any worker starts (``validate``), or None when it passes.
    ``overrides``: what a command line would have set (the context and the row's key), for the rules that count
    only the keys a command sets (``ragen.trainer.config.unread_keys.explicit_keys``); the probe base's own settings
    stand for a recipe's."""
    if isinstance(cfg_or_error, ConfigError):
        return cfg_or_error
    from ragen.launch import validate
    from ragen.trainer.config.unread_keys import command_line_keys, explicit_keys

    try:
        with explicit_keys(command_line_keys(overrides)):
            validate(cfg_or_error)
    except ConfigError as exc:
        return exc
    return None


# ---------------------------------------------------------------------------------------------- pure probes


def credit(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    from ragen.trainer import credit as C
    from ragen.trainer.layout import layout_of

    batch, _ = C.filter_groups(inputs.batch(cfg.agent.layout), cfg.algorithm)
    x = batch.extra
    adv, ret, _ = C.step_credit(cfg.algorithm, layout_of(cfg).advantages, batch, x["values"], x["last_values"],
                                     x["old_log_probs"], x["ref_log_probs"])
    return {"advantages": adv, "returns": ret, "_batch": batch}


def loss(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The actor's loss on the probe batch, built as the trainer builds it: ``Layout.train_batch`` (the turn
    layout's episode ids as ``seq_ids``, ``ragen.trainer.layout``), rollout correction's weights or rejection mask,
    and the normalisers of ``Trainable.update`` (``mini_batch_counts``) over the batch as one mini-batch."""
    from ragen.trainer import credit as C
    from ragen.trainer.config.run_shape import actor_worker_config
    from ragen.trainer.layout import layout_of
    from ragen.workers.actor import policy_objective
    from ragen.workers.trainable import mini_batch_counts

    c = credit(cfg)
    batch = c.pop("_batch")
    x = batch.extra
    correction = C.rollout_correction(cfg.algorithm.rollout_correction, batch, x["old_log_probs"])
    tb = layout_of(cfg).train_batch(batch).with_fields(
        old_log_probs=x["old_log_probs"], ref_log_probs=x["ref_log_probs"], advantages=c["advantages"],
        is_weights=correction.is_weights, keep_mask=correction.keep_mask)
    [(num_tokens, num_seqs, seq_tokens)] = mini_batch_counts([tb], lambda b: b.actor_mask, torch.device("cpu"))
    tb = tb if seq_tokens is None else tb.with_fields(seq_tokens=seq_tokens)
    lp = x["log_probs"].clone().requires_grad_(True)
    value, _, _ = policy_objective(actor_worker_config(cfg), lp, x["entropy"], tb, num_tokens, max(num_seqs, 1e-9))
    value.backward()
    return {"loss": value.detach(), "grad": lp.grad.detach()}


def _optimizer(cfg: TrainConfig, role: str) -> dict[str, torch.Tensor]:
    """Two ``Trainable.update`` calls of a fixed Linear(4, 3) on a regression batch of ``train_batch_size`` rows."""
    from ragen.algorithms.losses import aggregate_loss
    from ragen.trainer.config.run_shape import actor_worker_config, critic_worker_config, train_batch_size
    from ragen.workers.data import TrainBatch
    from ragen.workers.trainable import MicroResult, Trainable

    wcfg = actor_worker_config(cfg) if role == "actor" else critic_worker_config(cfg)
    g = torch.Generator().manual_seed(7)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
    features, targets = torch.randn(16, 4, generator=g), torch.randn(16, 3, generator=g) * 5.0
    B, T = train_batch_size(cfg), 6
    ids = torch.randint(2, 16, (B, T), generator=g)
    resp = (torch.rand(B, T, generator=g) < 0.7).long()
    resp[:, 0] = 1
    tb = TrainBatch(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=resp)

    def micro(b: TrainBatch, num_tokens: float, num_seqs: float) -> MicroResult:
        err = (model(features[b.input_ids]) - targets[b.input_ids]).square().sum(-1)
        value = aggregate_loss(err, b.response_mask, wcfg.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs)
        return MicroResult(loss=value, token_sums={}, sums={})

    trainable = Trainable(model, wcfg, torch.device("cpu"), 1, prefix=role)
    out = {}
    for i in range(2):
        trainable.update(tb, lambda b: b.response_mask, micro)
        out[f"params_{i}"] = torch.cat([p.detach().flatten() for p in model.parameters()])
    return out


def actor_optimizer(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    return _optimizer(cfg, "actor")


def critic_optimizer(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    return _optimizer(cfg, "critic")


# ---------------------------------------------------------------------------------------------- rollout probes


@functools.cache
def tokenizer() -> Any:
    from ragen.models import load_tokenizer

    return load_tokenizer()


# Scripted answers (prompt index % 4), in the agent's tags: thinking + answer + trailing text (stop_at_answer cuts it),
# two actions (after a newline: the think block ends on a token boundary, so agent.history_thinking=strip cuts it), no
# tags at all (format penalty), and a long answer (the token budget cuts it).
SCRIPT = (
    "<{t}>the first arm</{t}><{ans}>{a}</{ans}> and some words after the answer",
    "<{t}>two moves</{t}>\n<{ans}>{a} || {b}</{ans}>",
    "I am not sure what to do here.",
    "<{t}>" + "let me think about this for a while " * 6 + "</{t}><{ans}>{b}</{ans}>",
)


class ScriptedEngine:
    """An engine answering prompt ``i`` of every call with ``SCRIPT[i % 4]`` (actions ``a`` / ``b`` of the env, the
    agent's think / answer tags), honouring ``max_new_tokens``, the stop token and stop strings as the real engines
    do; log-probs ``-0.01 * (j + 1)``."""

    def __init__(self, tok: Any, cfg: TrainConfig) -> None:
        a, b = ACTIONS.get(cfg.env.name, ("a", "b"))
        self.tok = tok
        self.texts = [s.format(t=cfg.agent.think_tag, ans=cfg.agent.answer_tag, a=a, b=b) for s in SCRIPT]

    def generate(self, prompts: list[list[int]], sampling: Any) -> list[Any]:
        from ragen.rollout.base import Sample

        out = []
        for i, _ in enumerate(prompts):
            ids = list(self.tok(self.texts[i % len(self.texts)], add_special_tokens=False)["input_ids"])
            ids.append(sampling.stop_token_ids[0])
            for n in range(1, len(ids) + 1):
                if any(s in self.tok.decode(ids[:n]) for s in sampling.stop):
                    ids = ids[:n]
                    break
            cut = ids[:sampling.max_new_tokens]
            reason = "length" if len(cut) < len(ids) else "stop"
            out.append(Sample(cut, [-0.01 * (j + 1) for j in range(len(cut))], reason))
        return out

    def update_weights(self, state_dict: Any) -> None:
        return None

    def sleep(self) -> None:
        return None

    def wake(self, tags: Any = None) -> None:
        return None


ACTIONS = {"bandit": ("phoenix", "dragon"), "frozen_lake": ("Left", "Down"), "sokoban": ("Up", "Left"),
           "delayed_choice": ("left", "gold"), "text_adventure": ("take lamp", "north"),
           "search_qa": ("<think>the answer may be Paris", "Paris"),  # search_qa: an unclosed think tag
           # twenty_questions: a question echoing the prompt's text, which the 135M llm oracle answers with a preamble
           # ("The answer to the question ... is No"): only a budget of more than a few tokens reaches the answer
           "twenty_questions": ("or a guess 'Is it a cat?'. Questions left: 3.", "Is it alive?")}


def batch_entries(batch: Any, prefix: str) -> dict[str, torch.Tensor]:
    """``<prefix>prompt_tokens`` / ``sampled_tokens`` (ids off / on the response mask, -1 elsewhere),
    ``token_rewards`` and ``sample_log_probs`` of a rollout batch."""
    resp, attn = batch.response_mask.bool(), batch.attention_mask.bool()
    return {f"{prefix}prompt_tokens": torch.where(attn & ~resp, batch.input_ids, -1),
            f"{prefix}sampled_tokens": torch.where(resp, batch.input_ids, -1),
            f"{prefix}token_rewards": batch.token_rewards, f"{prefix}sample_log_probs": batch.sample_log_probs}


def _proxies(cfg: TrainConfig, engine: Any, tok: Any) -> tuple[Any, Any]:
    from ragen.trainer.builders import build_proxies

    return build_proxies(cfg, engine, tok)


def rollout(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    tok = tokenizer()
    train, val = _proxies(cfg, ScriptedEngine(tok, cfg), tok)
    return {**batch_entries(train.rollout("train"), ""), **batch_entries(val.rollout("val"), "val_")}


def rollout_real(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    from ragen.trainer.builders import build_engine, prepare_model

    path, tok = prepare_model(cfg)
    engine = build_engine(cfg, path, tok)
    train, val = _proxies(cfg, engine, tok)
    return {**batch_entries(train.rollout("train"), ""), **batch_entries(val.rollout("val"), "val_")}


def expert(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    import ragen.env
    from ragen.agent.expert import ExpertResponder

    tok = tokenizer()
    train, _ = _proxies(cfg, ScriptedEngine(tok, cfg), tok)
    if not ragen.env.has_expert(cfg.env.name):
        return batch_entries(train.rollout("train"), "")
    responder = ExpertResponder(tok, cfg.agent_config(), train.fmt.eot_id, noise=0.5, seed=0)
    return batch_entries(train.rollout("train", responder=responder), "")


class _Recorder:
    """The actor group of a fake warm-start host: records each ``sft_update`` batch."""

    def __init__(self) -> None:
        self.batches: list[Any] = []

    def call(self, method: str, *args: Any, **kwargs: Any) -> dict[str, float]:
        if method == "sft_update":
            self.batches.append(args[0])
        return {}

    def call_rank0(self, method: str) -> dict:
        return {}


def warm_start(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The demonstrations ``run_warm_start`` hands the actor (``ids`` / ``mask`` of each ``sft_update`` batch)."""
    from ragen.trainer.warm_start import run_warm_start

    tok = tokenizer()
    train, _ = _proxies(cfg, ScriptedEngine(tok, cfg), tok)
    actor = _Recorder()
    run = type("Run", (), {})()  # what run_warm_start reads of a ragen.trainer.run.Run
    run.cfg, run.workers, run.tokenizer, run.log = cfg, {"actor": actor}, tok, (lambda m, s: None)
    run_warm_start(run, proxy=train, row_multiple=1, sync_engine=lambda: None, validate=lambda suffix: {})
    return {f"{name}_{i}": getattr(b, name) for i, b in enumerate(actor.batches)
            for name in ("input_ids", "response_mask")}


# ---------------------------------------------------------------------------------------------- python-only env args


class FakeGame:
    """A two-room text adventure (jericho's game interface) for ``text_adventure``'s keys without a game file."""

    def __init__(self, path: str, seed: int) -> None:
        self.room, self.lamp, self.moves = "hall", False, 0

    def seed(self, seed: Any = None) -> Any:
        return seed

    def reset(self) -> tuple[str, dict]:
        self.room, self.lamp, self.moves = "hall", False, 0
        return "A dusty hall.", {"moves": 0, "score": 0}

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        self.moves += 1
        if action == "take lamp" and not self.lamp:
            self.lamp = True
            return "Taken.", 5.0, False, {"moves": self.moves}
        if action == "north":
            self.room = "vault"
            return "A cold vault.", 0.0, False, {"moves": self.moves}
        return "Nothing happens.", 0.0, False, {"moves": self.moves}

    def get_valid_actions(self) -> list[str]:
        return ["north", "look", "inventory"] + ([] if self.lamp else ["take lamp"])

    def get_score(self) -> float:
        return 5.0 if self.lamp else 0.0

    def get_moves(self) -> int:
        return self.moves

    def game_over(self) -> bool:
        return False

    def victory(self) -> bool:
        return False

    def get_max_score(self) -> float:
        return 15.0

    def get_state(self) -> Any:
        return (self.room, self.lamp, self.moves)

    def get_world_state_hash(self) -> str:
        return f"{self.room}-{self.lamp}"

    def set_state(self, state: Any) -> None:
        self.room, self.lamp, self.moves = state


def with_python_only(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the env arguments YAML cannot hold: ``text_adventure`` gets the :class:`FakeGame` factory (so no
    game file is opened, in validation or in the rollout)."""
    if cfg.env.name != "text_adventure" or "game_factory" in cfg.env.config:
        return cfg
    env = dataclasses.replace(cfg.env, config={**cfg.env.config, "game_factory": FakeGame})
    return dataclasses.replace(cfg, env=env)


PROBES: dict[str, Callable[[TrainConfig], dict[str, torch.Tensor]]] = {
    "credit": credit, "loss": loss, "actor_optimizer": actor_optimizer, "critic_optimizer": critic_optimizer,
    "rollout": rollout, "rollout_real": rollout_real, "expert": expert, "warm_start": warm_start,
}


def run_probe_with(probe: Callable[[TrainConfig], dict[str, torch.Tensor]], cfg: TrainConfig
                   ) -> dict[str, torch.Tensor]:
    """``probe(cfg)`` with torch's global RNG and thread count restored afterwards (private ``_`` entries dropped)."""
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        out = probe(cfg)
    torch.set_num_threads(threads)
    return {k: v for k, v in out.items() if not k.startswith("_")}


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], entries: tuple[str, ...] | None,
              rtol: float = 1e-5, atol: float = 1e-7, outliers: float = 0.0) -> list[str]:
    """The entries (all when ``entries`` is None) whose tensors differ in shape, or beyond ``rtol`` / ``atol`` in more
    than a fraction ``outliers`` of their elements."""
    names = sorted(set(a) | set(b)) if entries is None else entries
    out = []
    for name in names:
        x, y = a.get(name), b.get(name)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            out.append(name)
        elif x.is_floating_point():
            close = torch.isclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
            if int((~close).sum()) > outliers * close.numel():
                out.append(name)
        elif not x.is_floating_point() and not torch.equal(x, y):
            out.append(name)
    return out
