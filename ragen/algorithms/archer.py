"""Pure functions of the ArCHer family (Zhou et al. 2024, "ArCHer: Training Language Model Agents via
Hierarchical Multi-Turn RL", arXiv:2402.19446).

ArCHer is hierarchical: an *utterance-level* critic is trained off-policy with TD learning over whole turns
(state s = the conversation so far, action a = the model's whole response), and the *token-level* policy is
trained by policy gradient with the critic's advantage of the whole utterance as the reward of its tokens.
The same critic serves two baselines of the paper: online CHAI (act by re-ranking k sampled utterances with
the critic, no actor update) and online filtered BC (behaviour cloning on the best trajectories so far).

What each function implements, cited by name rather than by equation number (the numbering was not checked
against the paper's text): the paper's practical instantiation (its Figure 2: an utterance-level Q-function
learned by Bellman bootstrapping with TD errors, a token-level policy learned by policy gradient on the advantage
that critic induces) and the authors' reference code (github.com/YifeiZhou02/ArCHer, ``archer/algorithms/archer/
trainer.py``: ``ArcherTrainer.critic_loss`` / ``actor_loss``; ``archer/models/chai_agent.py``;
``archer/algorithms/online_filteredbc``):
  utterance-level Q TD objective: (Q_i(s, a) - r - gamma * (1 - d) * Vbar_i(s'))^2        -> :func:`q_targets`
  utterance-level V objective:    (V_i(s) - Qbar_i(s, a_pi))^2, a_pi ~ pi(.|s)             -> :func:`v_targets`
  token-level policy gradient:    -A(s, a_pi) * sum_tokens log pi(a_pi^t | s, a_pi^<t)     -> :func:`reinforce_loss`
  with A = min(Q1, Q2)(s, a_pi) - min(V1, V2)(s) of the online critic (clipped double Q)    -> :func:`advantage`
  target critic by Polyak averaging (tau)                                                   -> :func:`polyak_update`
  online CHAI (k samples, highest target min-Q), online filtered BC (reward quantile cut)  -> :func:`chai_pick`,
                                                                        :func:`filter_cutoff`, :func:`filtered_bc_loss`
Each tensor argument states its shape. Batches here are batches of *turns* (one row per (s, a) pair).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch
from torch import Tensor

from ragen.algorithms.losses import aggregate_loss, bc_loss


def q_targets(rewards: Tensor, dones: Tensor, next_v_target: Tensor, gamma: float) -> Tensor:
    """TD target of each Q head (the utterance-level Q objective): y_Q = r + gamma * (1 - d) * Vbar(s').

    rewards: (N,) turn reward r; dones: (N,) 1/True where s' is terminal (the episode ended by the env or by
    max_turn, so nothing is bootstrapped); next_v_target: (N,) Vbar_i(s') from the *target* critic (no gradient).
    Returns (N,) targets, detached.

    >>> q_targets(torch.tensor([-1.0]), torch.tensor([0.0]), torch.tensor([-2.0]), 0.95)  # -1 + 0.95 * -2
    tensor([-2.9000])
    """
    d = dones.float()
    return (rewards.float() + gamma * (1.0 - d) * next_v_target.float()).detach()


def v_targets(q_target_on_policy: Tensor) -> Tensor:
    """Target of each V head (the utterance-level V objective): y_V = Qbar_i(s, a_pi) for a fresh action a_pi ~ pi(.|s).

    q_target_on_policy: (N,) the target critic's Q_i of the state and the action the *current agent* takes there
    (not the stored action: V is the value of the agent that acts; ArCHer: a sample of its policy; online CHAI:
    its best of k samples by target min-Q, as the reference code's ``get_action`` of each agent). Returns (N,),
    detached.
    """
    return q_target_on_policy.float().detach()


def critic_loss(q1: Tensor, q2: Tensor, v1: Tensor, v2: Tensor, yq1: Tensor, yq2: Tensor,
                yv1: Tensor, yv2: Tensor, *, num_rows: float | None = None) -> Tensor:
    """Sum of the four mean-squared errors of the double critic (the Q and V objectives, one per head; the
    reference code backpropagates the same sum).

    q1, q2: (N,) online Q_i(s, a) of the stored action; v1, v2: (N,) online V_i(s); yq*, yv*: (N,) targets of
    :func:`q_targets` / :func:`v_targets` computed with the matching target head. ``num_rows`` divides the summed
    squared errors (default N, the mean): a micro-batch of a mini-batch of M rows passes M, so the micro-batches'
    losses (and gradients) add up to the mini-batch's. Returns a scalar.
    """
    denom = float(q1.shape[0]) if num_rows is None else float(num_rows)
    sq = ((q1 - yq1) ** 2).sum() + ((q2 - yq2) ** 2).sum() + ((v1 - yv1) ** 2).sum() + ((v2 - yv2) ** 2).sum()
    return sq / max(denom, 1.0)


def advantage(q1: Tensor, q2: Tensor, v1: Tensor, v2: Tensor) -> Tensor:
    """Utterance-level advantage of the actor (the token-level policy gradient's A): min(Q1, Q2)(s, a) -
    min(V1, V2)(s).

    All (N,) from the online critic; the minimum of the two heads curbs over-estimation (clipped double Q).
    Returns (N,), detached (the actor never differentiates through the critic).
    """
    return (torch.minimum(q1, q2) - torch.minimum(v1, v2)).detach()


@torch.no_grad()
def polyak_update(target: Iterable[Tensor], online: Iterable[Tensor], tau: float) -> None:
    """In place: target <- (1 - tau) * target + tau * online, parameter by parameter (soft target update).

    At tau = 0.1 a target at 0 tracking an online value of 1 moves 0 -> 0.1 -> 0.19.
    """
    if not 0.0 <= tau <= 1.0:
        raise ValueError(f"tau={tau} must be in [0, 1]")
    for t, o in zip(target, online, strict=True):
        t.mul_(1.0 - tau).add_(o.detach(), alpha=tau)


def monte_carlo_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """Discounted return-to-go of every turn of one episode: G_k = r_k + gamma * G_{k+1}, G_after_last = 0.

    rewards: the episode's turn rewards in order. Stored with each turn in the replay buffer (the paper's
    reference code keeps it for logging and for Monte-Carlo critic variants).

    >>> monte_carlo_returns([-1.0, -1.0, 0.0], 0.95)
    [-1.95, -1.0, 0.0]
    """
    out, g = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        g = float(rewards[k]) + gamma * g
        out[k] = g
    return out


def filter_cutoff(rewards_seen: Tensor, quantile: float) -> float:
    """Online filtered BC's bar: the ``quantile`` of the trajectory rewards (linear interpolation, as
    ``torch.quantile`` and the reference code's ``np.quantile``). Trajectories with reward >= the bar are imitated.

    rewards_seen: (M,) one reward per trajectory of the population the kept turns are drawn from
    (:func:`trajectory_rewards` of the replay buffer), M >= 1. Rewards 0..9 at quantile 0.9 give 8.1 (only 9 passes).
    """
    if rewards_seen.numel() == 0:
        raise ValueError("filter_cutoff needs at least one trajectory reward")
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile={quantile} must be in [0, 1]")
    return float(torch.quantile(rewards_seen.double(), quantile))


def trajectory_rewards(episodes: Tensor, traj_rewards: Tensor) -> Tensor:
    """(M,) one reward per distinct trajectory, in order of first appearance: the population of
    :func:`filter_cutoff` when the kept turns come from a set of turns (the replay buffer), so the bar is a
    quantile of exactly the trajectories those turns belong to (a trajectory counts once whatever its length).

    episodes: (N,) long, the trajectory id of each turn; traj_rewards: (N,) that trajectory's total reward.
    """
    seen: dict[int, float] = {}
    for e, r in zip(episodes.tolist(), traj_rewards.tolist(), strict=True):
        seen.setdefault(int(e), float(r))
    return torch.tensor(list(seen.values()), dtype=torch.float64)


def filtered_bc_keep(traj_rewards: Tensor, cutoff: float) -> Tensor:
    """(N,) bool: rows whose trajectory reward is at or above ``cutoff`` (:func:`filter_cutoff`).

    traj_rewards: (N,) the total reward of the trajectory each row (turn) belongs to.
    """
    return traj_rewards.double() >= cutoff - 1e-9


# ``archer.bc_loss_agg`` -> ``aggregate_loss`` mode
BC_AGG_MODES = {"token-mean": "token-mean", "utterance-sum": "seq-mean-token-sum"}


def filtered_bc_loss(log_probs: Tensor, mask: Tensor, *, agg: str = "token-mean", num_tokens: float | None = None,
                     num_seqs: float | None = None) -> Tensor:
    """Online filtered BC is behaviour cloning on the kept turns (``ragen.algorithms.losses.bc_loss``).

    log_probs: (B, T) token log-probs at temperature 1; mask: (B, T) 1 on the kept turns' model tokens.
    ``agg``: ``token-mean`` (NLL per demonstrated token over ``num_tokens``) or ``utterance-sum`` (each utterance's
    summed NLL, mean over ``num_seqs`` utterances: the reference code's ``plain_bc_loss``, -mean_i sum_t log pi).
    """
    if agg not in BC_AGG_MODES:
        raise ValueError(f"filtered BC loss aggregation {agg!r} is not one of {sorted(BC_AGG_MODES)}")
    return bc_loss(log_probs, mask, agg=BC_AGG_MODES[agg], num_tokens=num_tokens, num_seqs=num_seqs)


def reinforce_loss(log_probs: Tensor, advantages: Tensor, mask: Tensor, *, num_seqs: float | None = None,
                   old_log_probs: Tensor | None = None, clip: float | None = None,
                   token_baseline: Tensor | None = None) -> Tensor:
    """Token-level actor loss of ArCHer (its policy gradient): -A(s, a) * sum_t log pi(a^t | s, a^<t), mean over
    turns (the reference code's ``actor_loss`` without a baseline).

    log_probs: (B, T) log pi of each token (with grad); advantages: (B,) utterance advantage of each row
    (:func:`advantage`); mask: (B, T) 1 on the response tokens of the row; ``num_seqs`` normalises by the global
    number of rows of the mini-batch (default: rows of this call), so micro-batch splits do not change the loss.
    Options (off by default, the paper's stated extensions):
      ``old_log_probs`` (B, T) + ``clip``: PPO-style per-token ratio clipping of the same objective
      (loss -min(rho * A, clip(rho, 1 - clip, 1 + clip) * A) summed over tokens);
      ``token_baseline`` (B, T): a per-token baseline b_t subtracted from A (A_t = A - b_t).
    """
    m = mask.float()
    adv = advantages.float().unsqueeze(-1).expand_as(log_probs)
    if token_baseline is not None:
        adv = adv - token_baseline.float()
    if clip is None:
        per_token = -adv * log_probs
    else:
        if old_log_probs is None:
            raise ValueError("reinforce_loss: clip needs old_log_probs (the sampling policy's log-probs)")
        ratio = torch.exp(log_probs - old_log_probs.float())
        per_token = -torch.minimum(ratio * adv, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * adv)
    return aggregate_loss(per_token, m, "seq-mean-token-sum", num_seqs=num_seqs)


def chai_pick(scores: Tensor) -> Tensor:
    """Online CHAI's choice: for each state, the candidate with the highest critic score (first on ties).

    scores: (N, K) target min(Q1, Q2)(s_n, a_nk) of K sampled candidates per state. Returns (N,) long indices.
    """
    if scores.dim() != 2 or scores.shape[1] < 1:
        raise ValueError(f"chai_pick expects (N, K>=1) scores, got shape {tuple(scores.shape)}")
    return torch.argmax(scores, dim=1)


def chai_select(states: Sequence[str], candidates: Sequence[Sequence[str]],
                score: Callable[[list[str], list[str]], Tensor]) -> list[int]:
    """Index of the chosen candidate per state: ``score(states, actions) -> (M,)`` (the critic's target min-Q)
    is called once on every (state, candidate) pair, flattened state-major, then :func:`chai_pick`.

    states: N texts; candidates: N lists of K texts each (the same K for all).
    """
    k = len(candidates[0]) if candidates else 0
    if any(len(c) != k for c in candidates):
        raise ValueError("chai_select: every state needs the same number of candidates")
    flat_s = [s for s, c in zip(states, candidates, strict=True) for _ in c]
    flat_a = [a for c in candidates for a in c]
    scores = score(flat_s, flat_a).reshape(len(states), k)
    return chai_pick(scores).tolist()
