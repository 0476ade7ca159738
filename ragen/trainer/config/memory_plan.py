"""The memory plan of a GPU run: what one GPU holds in each phase of a training step, from the model's sizes and a
few explicit numbers, before anything starts. ``ragen.trainer.config.memory_checks`` builds the inputs from the config
and refuses a plan that cannot fit; ``ragen train --check`` prints :func:`plan_lines`.

The plan is of GPU 0, the fullest: it holds rank 0 of every role (actor, critic, reference; ``ragen.trainer.
placement``) and, colocated, the rollout engine. Sizes in GiB (2**30 bytes); P = the policy's parameters, ws = a
role's world size, cb = compute bytes (2 for bf16, 4 for fp32), T = tokens per row, r = rows per micro-batch and
rank:

* weights: fp32 master weights, as the workers hold them (``ragen.workers.actor.weight_dtype``), sharded by FSDP2:
  4 P / ws.
  The reference is loaded and sharded the same way, in the compute precision (it has no optimizer: 2 or 4 bytes x P /
  ws_ref); the critic holds the backbone and a value head.
* AdamW moments: two fp32 tensors per trained parameter (all of them, or LoRA's adapters), sharded: 8 x trained
  / ws; the fp32 weights above are the master weights. Gradients: fp32, sharded (4 x trained / ws), alive from the
  first micro-batch's backward to the optimizer step, so during the whole update.
* gathered weights: FSDP2 all-gathers weights in the compute precision before a module runs; the root (embedding,
  final norm, output head) stays gathered through forward and backward, and prefetching keeps two decoder layers
  gathered, each with its unsharded gradient before the reduce-scatter: (root + 2 layers) x cb, twice in an update.
  World size 1 is not sharded: autocast keeps a compute-precision copy of every weight during a pass (P x cb, bf16).
* activations of one micro-batch (r x T tokens), at the peak of an update (the start of its backward): without
  gradient checkpointing each layer keeps ``ACTIVATION_FACTOR x (13 hidden + 4 intermediate) x cb`` bytes per token.
  The count is of what autograd saves in a Llama / Qwen2 layer: the two RMSNorms' fp32 copy of their input and their
  normalised and scaled outputs (8 hidden bytes each in bf16), the attention's q, k, v (key/value heads repeated to
  the query heads) and output and the output projection's input (10 hidden bytes), the MLP's gate, activation, up
  and product (8 intermediate bytes); under autocast (world size 1) the residual stream is fp32, which adds 4 hidden
  bytes. The factor is what autograd's backward adds on top (measured, below). With checkpointing each layer keeps
  ``CHECKPOINT_FACTOR x hidden x`` the residual stream's bytes per token (its input, and what the measurement shows
  is held beside it) and one layer at a time is recomputed with its full activations. A no-grad pass holds one
  layer's working set and the final hidden states.
* logits: ragen computes log-probs over chunks of ``actor.log_prob_chunk_size`` selected tokens; one chunk's logits
  (vocab per token) cost ``LOGIT_BYTES_GRAD`` bytes per entry in an update (bf16 logits, their fp32 copy, the
  log-softmax and its gradient; recomputed in backward with ``actor.checkpoint_lm_head``, else every chunk of the
  micro-batch is kept) and ``LOGIT_BYTES_NO_GRAD`` in a no-grad pass. Every token of a row is counted as selected.
* the engine: vLLM takes ``gpu_memory_utilization`` x the GPU on each of its GPUs when it rolls out (its weights,
  activations and KV cache live inside that share) and, asleep (sleep mode), keeps ``VLLM_ASLEEP_GIB``; the hf
  engine keeps its weights in the rollout dtype and a KV cache of ``sequences x max_model_len`` tokens on GPU 0 all
  the time, in the driver's process.
* ``CUDA_CONTEXT_GIB`` per worker process with a CUDA context on the GPU (each role's rank; the hf engine's driver).

Phases (:data:`PHASES`): ``rollout`` (the engine awake, the roles' weights and optimizer state resident),
``log-prob passes`` (old / reference log-probs and values: the engine asleep with sleep mode, the largest no-grad
pass), ``actor update`` and ``critic update``. The peak is the largest phase. With ``offload`` (the roles' weights
and optimizer state moved to CPU memory outside their own passes) a role's weights count only in its passes and its
optimizer state only in its update.

Calibration (``python bench/memory_plan.py`` prints predicted against measured): ``PolicyWorker.update`` of a
mini-batch of two micro-batches in a fresh process, the peak RSS during the second update minus the RSS before it
(an AMD EPYC CPU with native bf16, autocast, one rank); differences between cases of one model cancel what no term
models (0.1-0.26 GiB of allocator slack per process on this CPU), and repeated runs on the shared machine spread by
10-25%. The tiny model (hidden 64, 2 layers, vocab 49152), whose update memory is its logits: 512 more selected
tokens cost 22-26 bytes per logit entry (``LOGIT_BYTES_GRAD = 24``), 18 in the no-grad pass. SmolLM2-135M (hidden
576, intermediate 1536, 30 layers), rows of 512 tokens: without checkpointing 512 more tokens cost 1.15-1.3 x the
structural count of 51.3 bytes per token, layer and hidden unit (``ACTIVATION_FACTOR = 1.3``); with checkpointing a
layer keeps 6-9 x its fp32 input per token (``CHECKPOINT_FACTOR = 6``; with it the checkpointed cases' totals fall
within the slack the other cases leave). On GPUs (FSDP2, bf16 residual stream, fused attention kernels) the same
formulas are expected to overestimate rather than under.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ragen.models.shape import ModelShape

GIB = 2**30
MASTER_BYTES = 4  # fp32 weights the workers load and FSDP2 shards (also the AdamW master weights)
GRAD_BYTES = 4  # fp32 gradients (FSDP2 reduce dtype)
ADAM_BYTES = 8  # two fp32 moments per trained parameter
ACTIVATION_FACTOR = 1.3  # calibrated: measured per-layer activation bytes / structural count (module docstring)
CHECKPOINT_FACTOR = 6.0  # calibrated: bytes a checkpointed layer keeps per token / (hidden x residual bytes)
LOGIT_BYTES_GRAD = 24  # calibrated: bytes per logit entry of one chunk in an update
LOGIT_BYTES_NO_GRAD = 18  # calibrated: bytes per logit entry of one chunk in a no-grad pass
RESIDUAL_BYTES_UNSHARDED = 4  # autocast keeps the residual stream in fp32 (world size 1)
# Assumed, not measured here (no GPU): a process's CUDA context and allocator reserve (torch 2.x, CUDA 12), what a
# sleeping vLLM engine keeps (its CUDA context and graphs), vLLM's share not left to weights or KV cache (profiled
# activations, CUDA graphs).
CUDA_CONTEXT_GIB = 0.5
VLLM_ASLEEP_GIB = 1.0
VLLM_OVERHEAD_GIB = 2.0
GATHERED_LAYERS = 2  # decoder layers FSDP2 keeps gathered at once (the running one and the prefetched one)

ROLLOUT, LOGPROBS, ACTOR_UPDATE, CRITIC_UPDATE = "rollout", "log-prob passes", "actor update", "critic update"
PHASES = (ROLLOUT, LOGPROBS, ACTOR_UPDATE, CRITIC_UPDATE)
ALL = PHASES


@dataclass(frozen=True)
class RoleLoad:
    """One training role's rank on the GPU.

    ``params``: parameters it holds; ``trained``: those with gradients and AdamW state (all, or LoRA's adapters);
    ``world``: ranks sharing them; ``micro_rows`` / ``infer_rows``: rows per micro-batch of an update / of a no-grad
    pass on this rank; ``checkpointing``: gradient checkpointing; ``compute_bytes``: 2 (bf16) or 4 (fp32);
    ``logits``: whether its passes compute log-probs over the vocabulary (the policy) or a value head (the critic).
    """

    params: int
    trained: int
    world: int
    micro_rows: int
    infer_rows: int
    checkpointing: bool
    compute_bytes: int
    logits: bool = True


@dataclass(frozen=True)
class EngineLoad:
    """The rollout engine. ``kind``: ``vllm`` or ``hf``; ``colocated``: it shares the training GPUs (vLLM colocated,
    or the hf engine on GPU 0), else it has GPUs of its own; ``utilization``: vLLM's ``gpu_memory_utilization``;
    ``tensor_parallel``: vLLM's GPUs per engine; ``sleeps``: vLLM sleep mode; ``weight_bytes``: bytes per weight in
    the rollout dtype; ``kv_sequences``: sequences whose KV cache the hf engine holds at once."""

    kind: str
    colocated: bool = True
    utilization: float = 0.5
    tensor_parallel: int = 1
    sleeps: bool = True
    weight_bytes: int = 2
    kv_sequences: int = 1


@dataclass(frozen=True)
class MemoryInputs:
    """Everything the plan reads, as explicit numbers: the policy's ``shape``, the GPU's size ``gpu_gib``, rows of
    ``seq_len`` tokens, log-prob chunks of ``chunk`` tokens (``checkpoint_lm_head``: recomputed in backward), the
    roles (``critic`` None without a critic worker, ``ref_world`` None without a reference), the ``engine`` and
    ``offload`` (the roles' weights and optimizer state in CPU memory outside their own passes)."""

    shape: ModelShape
    gpu_gib: float
    seq_len: int
    chunk: int
    actor: RoleLoad
    checkpoint_lm_head: bool = True
    critic: RoleLoad | None = None
    ref_world: int | None = None
    engine: EngineLoad | None = None
    offload: bool = False


@dataclass(frozen=True)
class Term:
    """One line of the plan: ``gib`` on the GPU during each of ``phases``; ``what`` says how it is computed."""

    name: str
    gib: float
    what: str
    phases: tuple[str, ...]


@dataclass(frozen=True)
class MemoryPlan:
    """The terms, each phase's total (``phases``, GiB, only the phases the run has) and the GPU's size."""

    terms: tuple[Term, ...]
    phases: dict[str, float]
    gpu_gib: float
    engine_note: str = ""
    problems: tuple[str, ...] = field(default_factory=tuple)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: self.phases[p])

    @property
    def peak(self) -> float:
        return self.phases[self.peak_phase]

    @property
    def fits(self) -> bool:
        return self.peak <= self.gpu_gib and not self.problems


def _gib(n_bytes: float) -> float:
    return n_bytes / GIB


def _b(n: int) -> str:
    """A parameter count as text: 7.62B, 494M, 3.3k."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def residual_bytes(role: RoleLoad) -> int:
    """Bytes per element of the residual stream: fp32 under autocast (world size 1), else the compute precision."""
    return RESIDUAL_BYTES_UNSHARDED if role.world == 1 else role.compute_bytes


def layer_activation_bytes(shape: ModelShape, role: RoleLoad) -> float:
    """Bytes one token's activations take in one decoder layer without checkpointing: ``ACTIVATION_FACTOR`` x the
    tensors autograd keeps, (13 hidden + 4 intermediate) x cb, plus 4 hidden bytes for the two RMSNorms' fp32
    inputs where the residual stream itself is fp32 (autocast) rather than cast up (module docstring)."""
    saved = (13 * shape.hidden + 4 * shape.intermediate) * role.compute_bytes
    if residual_bytes(role) > role.compute_bytes:
        saved += 4 * shape.hidden
    return ACTIVATION_FACTOR * saved


def activation_bytes(shape: ModelShape, role: RoleLoad, seq_len: int) -> float:
    """Activations one micro-batch of ``role`` keeps for its backward at the peak (the start of backward)."""
    tokens = role.micro_rows * seq_len
    layer = layer_activation_bytes(shape, role)
    if not role.checkpointing:
        return tokens * shape.layers * layer
    return tokens * (shape.layers * CHECKPOINT_FACTOR * shape.hidden * residual_bytes(role) + layer)


def _activation_text(shape: ModelShape, role: RoleLoad, seq_len: int) -> str:
    per_token = layer_activation_bytes(shape, role) / 1024
    rows = f"{role.micro_rows} rows x {seq_len} tokens"
    if role.checkpointing:
        return (f"{rows}, checkpointed: {shape.layers} layers x {CHECKPOINT_FACTOR:g} x {shape.hidden} x "
                f"{residual_bytes(role)} B + one layer recomputed ({per_token:.0f} KiB) per token")
    return f"{rows} x {shape.layers} layers x {per_token:.0f} KiB per token and layer"


def gathered_bytes(shape: ModelShape, role: RoleLoad, grad: bool) -> float:
    """Weights in the compute precision a pass gathers (and, in an update of all weights, their gradients)."""
    if role.world == 1:
        return shape.params * role.compute_bytes if role.compute_bytes < MASTER_BYTES else 0.0
    full = shape.root_params + GATHERED_LAYERS * shape.layer_params
    return full * role.compute_bytes * (2 if grad and role.trained >= role.params else 1)


def logit_bytes(shape: ModelShape, tokens: int, chunk: int, grad: bool, recompute: bool) -> float:
    """One chunk of logits (every chunk of the micro-batch in an update without ``checkpoint_lm_head``)."""
    kept = min(chunk, tokens) if (recompute or not grad) else tokens
    return kept * shape.vocab * (LOGIT_BYTES_GRAD if grad else LOGIT_BYTES_NO_GRAD)


def infer_bytes(shape: ModelShape, role: RoleLoad, seq_len: int) -> float:
    """A no-grad pass of ``infer_rows`` rows: one layer's working set (the residual stream and its normalised copy,
    the MLP's up projection, activation and product: (4 hidden + 3 intermediate) x cb per token) and the final
    hidden states the log-prob chunks read (fp32)."""
    working = (4 * shape.hidden + 3 * shape.intermediate) * role.compute_bytes
    return role.infer_rows * seq_len * (working + 4 * shape.hidden)


def _role_terms(name: str, shape: ModelShape, role: RoleLoad, inp: MemoryInputs, update: str) -> list[Term]:
    """The weights, AdamW state, gradients, gathered weights, activations and logits of one trained role."""
    ws, lora = role.world, role.trained < role.params
    held = (LOGPROBS, update) if inp.offload else ALL
    out = [
        Term(f"{name} weights", _gib(MASTER_BYTES * role.params / ws),
             f"fp32, {_b(role.params)} params / {ws} rank(s)", held),
        Term(f"{name} AdamW moments", _gib(ADAM_BYTES * role.trained / ws),
             f"2 x fp32 per trained param ({_b(role.trained)}{', LoRA adapters' if lora else ''}) / {ws} rank(s)",
             (update,) if inp.offload else ALL),
        Term(f"{name} gradients", _gib(GRAD_BYTES * role.trained / ws), f"fp32, {_b(role.trained)} / {ws} rank(s)",
             (update,)),
    ]
    precision = "bf16" if role.compute_bytes == 2 else "fp32"
    gathered = gathered_bytes(shape, role, grad=True)
    if gathered:
        what = (f"autocast's {precision} copy of the weights (world size 1: not sharded)" if ws == 1 else
                f"{precision}: root (embedding, norm, output head: {_b(shape.root_params)}) + {GATHERED_LAYERS} "
                f"layers{', with their gradients' if not lora else ''}")
        out.append(Term(f"{name} gathered weights", _gib(gathered), what, (update,)))
    out.append(Term(f"{name} activations", _gib(activation_bytes(shape, role, inp.seq_len)),
                    _activation_text(shape, role, inp.seq_len), (update,)))
    if role.logits:
        tokens = role.micro_rows * inp.seq_len
        kept = min(inp.chunk, tokens) if inp.checkpoint_lm_head else tokens
        how = "recomputed in backward" if inp.checkpoint_lm_head else "every chunk kept"
        out.append(Term(f"{name} logits", _gib(logit_bytes(shape, tokens, inp.chunk, True, inp.checkpoint_lm_head)),
                        f"{kept} tokens x {shape.vocab} vocab x {LOGIT_BYTES_GRAD} B ({how})", (update,)))
    return out


def _pass_term(name: str, shape: ModelShape, role: RoleLoad, inp: MemoryInputs) -> tuple[float, str]:
    """(bytes, description) of ``role``'s no-grad pass (log-probs or values)."""
    total = infer_bytes(shape, role, inp.seq_len) + gathered_bytes(shape, role, grad=False)
    tokens = role.infer_rows * inp.seq_len
    what = f"{name}: {role.infer_rows} rows x {inp.seq_len} tokens, one layer's working set"
    if role.logits:
        total += logit_bytes(shape, tokens, inp.chunk, False, True)
        what += f" + {min(inp.chunk, tokens)} tokens x {shape.vocab} vocab x {LOGIT_BYTES_NO_GRAD} B of logits"
    return total, what


def engine_terms(inp: MemoryInputs) -> tuple[list[Term], str, list[str]]:
    """(terms on GPU 0, a note on the engine's own budget, problems) of the rollout engine."""
    e, shape, gpu = inp.engine, inp.shape, inp.gpu_gib
    if e is None:
        return [], "", []
    if e.kind == "hf":
        weights = shape.params * e.weight_bytes
        kv = e.kv_sequences * inp.seq_len * shape.kv_bytes_per_token(e.weight_bytes)
        what = (f"hf engine on GPU 0: weights {_gib(weights):.2f} ({e.weight_bytes} B) + KV cache {_gib(kv):.2f} "
                f"({e.kv_sequences} sequences x {inp.seq_len} tokens)")
        return [Term("engine", _gib(weights + kv), what, ALL),
                Term("engine process", CUDA_CONTEXT_GIB, "CUDA context of the driver (the hf engine)", ALL)], "", []
    share = e.utilization * gpu
    weights = _gib(shape.params * e.weight_bytes / e.tensor_parallel)
    kv_heads = max(1, shape.kv_heads // e.tensor_parallel)
    per_token = 2 * shape.layers * kv_heads * shape.head_dim * e.weight_bytes
    kv = share - weights - VLLM_OVERHEAD_GIB
    tokens = int(max(0.0, kv) * GIB // per_token)
    note = (f"vllm budget {e.utilization} x {gpu:g} = {share:.2f} GiB per engine GPU: weights {weights:.2f} (/ "
            f"tensor_parallel_size {e.tensor_parallel}) + ~{VLLM_OVERHEAD_GIB:g} working + KV cache {max(0.0, kv):.2f} "
            f"= {tokens} tokens ({tokens // max(1, inp.seq_len)} sequences of {inp.seq_len})")
    problems = []
    if tokens < inp.seq_len:
        problems.append(f"the vLLM engine's share of a GPU, rollout.vllm.gpu_memory_utilization={e.utilization} x "
                        f"{gpu:g} GiB = {share:.2f} GiB, leaves KV cache for {tokens} tokens after its weights "
                        f"({weights:.2f} GiB at rollout.vllm.tensor_parallel_size={e.tensor_parallel}), fewer than one "
                        f"sequence of agent.max_model_len={inp.seq_len}: vLLM would refuse to start; raise "
                        "gpu_memory_utilization or tensor_parallel_size")
    if not e.colocated:
        return [], note + " (its own GPUs)", problems
    asleep = VLLM_ASLEEP_GIB if e.sleeps else share
    phases_awake = (ROLLOUT,) if e.sleeps else ALL
    out = [Term("vllm engine", share, f"gpu_memory_utilization {e.utilization} x {gpu:g} GiB while it rolls out",
                phases_awake)]
    if e.sleeps:
        out.append(Term("vllm engine asleep", asleep, "sleep mode: weights in CPU memory, KV cache freed",
                        (LOGPROBS, ACTOR_UPDATE, CRITIC_UPDATE)))
    return out, note, problems


def plan_memory(inp: MemoryInputs) -> MemoryPlan:
    """The plan of GPU 0 for ``inp`` (see the module docstring): terms, phase totals, problems of the engine."""
    shape, terms = inp.shape, []
    terms += _role_terms("actor", shape, inp.actor, inp, ACTOR_UPDATE)
    passes = [_pass_term("actor log-probs", shape, inp.actor, inp)]
    processes = ["actor"]
    if inp.critic is not None:
        critic_shape = replace(shape, tied=True)  # the policy's backbone; no output head (a value head instead)
        terms += _role_terms("critic", critic_shape, inp.critic, inp, CRITIC_UPDATE)
        passes.append(_pass_term("critic values", critic_shape, inp.critic, inp))
        processes.append("critic")
    if inp.ref_world is not None:
        ref = RoleLoad(shape.params, 0, inp.ref_world, 0, inp.actor.infer_rows, False, inp.actor.compute_bytes)
        ref_bytes = inp.actor.compute_bytes  # no optimizer: held in the compute precision (workers.actor.weight_dtype)
        terms.append(Term("reference weights", _gib(ref_bytes * shape.params / inp.ref_world),
                          f"{'bf16' if ref_bytes == 2 else 'fp32'}, {_b(shape.params)} params / {inp.ref_world} "
                          "rank(s), frozen",
                          (LOGPROBS,) if inp.offload else ALL))
        passes.append(_pass_term("reference log-probs", shape, ref, inp))
        processes.append("ref")
    largest = max(passes, key=lambda p: p[0])
    terms.append(Term("largest no-grad pass", _gib(largest[0]), largest[1], (LOGPROBS,)))
    terms.append(Term("CUDA contexts", CUDA_CONTEXT_GIB * len(processes),
                      f"{CUDA_CONTEXT_GIB:g} x {len(processes)} worker process(es) ({', '.join(processes)})", ALL))
    engine, note, problems = engine_terms(inp)
    terms += engine
    present = tuple(p for p in PHASES if p != CRITIC_UPDATE or inp.critic is not None)
    terms = [replace(t, phases=tuple(p for p in t.phases if p in present)) for t in terms]
    phases = {p: sum(t.gib for t in terms if p in t.phases) for p in present}
    return MemoryPlan(tuple(terms), phases, inp.gpu_gib, note, tuple(problems))


def plan_lines(plan: MemoryPlan, head: str) -> list[str]:
    """The plan as console lines: ``head`` (which GPU, its size and where the size comes from), one line per term,
    the engine's budget, the phase totals and the verdict."""
    out = [f"[ragen] memory    {head}"]
    width = max(len(t.name) for t in plan.terms)
    for t in plan.terms:
        where = "all phases" if set(t.phases) == set(plan.phases) else ", ".join(t.phases)
        out.append(f"[ragen]   {t.name:<{width}} {t.gib:7.2f} GiB  {t.what} [{where}]")
    if plan.engine_note:
        out.append(f"[ragen]   {plan.engine_note}")
    totals = ", ".join(f"{p} {v:.2f}" for p, v in plan.phases.items())
    share = 100 * plan.peak / plan.gpu_gib
    verdict = "fits" if plan.peak <= plan.gpu_gib else "DOES NOT FIT"
    out.append(f"[ragen]   per phase (GiB): {totals}; peak {plan.peak:.2f} GiB ({plan.peak_phase}) = {share:.0f}% of "
               f"{plan.gpu_gib:g} GiB: {verdict}")
    return out
