"""The TRL side of ``bench/peers/trl_grpo.py``: one ``GRPOTrainer`` run on ragen's bandit, in its own process.

    python bench/peers/trl_side.py SPEC.json     # started by trl_grpo.py, which reads the events file SPEC names

The spec (JSON) names the variant (``trl``: TRL's defaults, gradient checkpointing on and all rows in one
micro-batch; ``trl-nockpt``: gradient checkpointing off, TRL's gradient accumulation over micro-batches of
``micro`` rows), the ragen overrides the task is composed from (``bandit_task``), the step count, and for ``--learn``
the validation schedule. Each step appends a JSON line to the events file: its seconds (``on_step_begin`` to
``on_step_end``: generation, rewards, loss and backward, optimizer), the phases, prompt and completion tokens; each
validation its wall minutes since the orchestrator launched this process.

The GRPO settings are TRL's defaults except those the task fixes on both sides: 8 prompts x 8 generations, 16 new
tokens, lr 1e-5 constant (ragen's schedule), weight decay 0.01 and grad-norm clip 1.0 (ragen's), beta 0 (no
reference model), temperature 1.0, fp32 on the CPU, the prompts in ragen's order (no shuffling). Generation stops at
ragen's closing answer tag as ragen's engine does (``stop_strings``; transformers needs the tokenizer for that, so
``generate`` gets it), and the completion is cut after the token that closes the tag: TRL masks a completion only
after an end-of-sequence token, and the padding after a stop string is not one.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch  # libgomp reads OMP_WAIT_POLICY now: the orchestrator's choice for this side (trl_grpo.child_env)

OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY", "(unset: libgomp's default)")  # what libgomp read at import

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parents[1])]


def cut_at_stop(ids: list[int], tokenizer: Any, stops: tuple[str, ...]) -> tuple[list[int], bool]:
    """``ids`` up to the token that completes the first stop string (True), or unchanged (False)."""
    if not stops or not any(s in tokenizer.decode(ids) for s in stops):
        return list(ids), False
    for k in range(1, len(ids) + 1):
        if any(s in tokenizer.decode(ids[:k]) for s in stops):
            return list(ids[:k]), True
    return list(ids), False


class Clock:
    """Seconds per phase of the current step, and the tokens its batch held."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.phase: dict[str, float] = {"generate": 0.0, "generate_and_score": 0.0, "training_step": 0.0}
        self.marks: dict[str, float] = {}
        self.batch: dict[str, float] = {"prompt_tokens": 0.0, "completion_tokens": 0.0, "reward": 0.0,
                                        "success": 0.0, "format_ok": 0.0, "rows": 0.0}

    def timed(self, name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.phase[name] += time.perf_counter() - start
        return wrapper


def hf_generate(model: Any, tokenizer: Any, prompts: list[list[int]], sampling: Any) -> list:
    """ragen ``Sample``s for ``prompts`` from ``model.generate`` (validation): one left-padded batch, ragen's
    sampling parameters, stop ids and stop strings; each completion cut after its stop id or stop string."""
    from transformers import GenerationConfig

    from ragen.rollout.base import Sample

    pad = tokenizer.pad_token_id
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    greedy = sampling.temperature == 0
    gen = GenerationConfig(max_new_tokens=sampling.max_new_tokens, do_sample=not greedy, pad_token_id=pad,
                           temperature=None if greedy else sampling.temperature, top_p=sampling.top_p,
                           top_k=sampling.top_k, eos_token_id=list(sampling.stop_token_ids),
                           stop_strings=list(sampling.stop) or None)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen, tokenizer=tokenizer)
    samples = []
    for row in out[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in sampling.stop_token_ids), None)
        row, stopped = (row[:end], True) if end else cut_at_stop(row, tokenizer, tuple(sampling.stop))
        samples.append(Sample(row, [0.0] * len(row), "stop" if stopped else "length"))
    return samples


def grpo_config(spec: dict, out_dir: str, stops: tuple[str, ...]) -> Any:
    """TRL's ``GRPOConfig`` for ``spec`` (module docstring: which settings are TRL's defaults)."""
    from trl import GRPOConfig

    rows = spec["prompts"] * spec["samples"]
    micro = rows if spec["variant"] == "trl" else spec["micro"]
    extra = {} if spec["variant"] == "trl" else {"gradient_checkpointing": False}
    return GRPOConfig(
        output_dir=out_dir, per_device_train_batch_size=micro, gradient_accumulation_steps=rows // micro,
        num_generations=spec["samples"], max_completion_length=spec["new_tokens"], learning_rate=spec["lr"],
        lr_scheduler_type="constant", weight_decay=0.01, max_grad_norm=1.0, beta=0.0, temperature=1.0,
        max_steps=spec["steps"], bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
        shuffle_dataset=False, seed=spec["seed"], dataloader_pin_memory=False, disable_tqdm=True,
        generation_kwargs={"stop_strings": list(stops)}, **extra)


def make_callback(task: Any, clock: Clock, spec: dict, emit: Any) -> Any:
    """A ``TrainerCallback`` that times each step's phases and, with ``spec["learn"]``, validates every k steps."""
    from transformers import TrainerCallback

    learn = spec.get("learn")

    class BenchCallback(TrainerCallback):
        trainer: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if learn and learn["val_before_train"]:
                self._validate(0, control)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.reset()
            clock.marks["begin"] = time.perf_counter()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.marks["pre_optimizer"] = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.marks["optimizer"] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            end, m, p, b = time.perf_counter(), clock.marks, clock.phase, clock.batch
            total = end - m["begin"]
            phases = {"generate_s": p["generate"], "score_s": p["generate_and_score"] - p["generate"],
                      "loss_backward_s": p["training_step"] - p["generate_and_score"],
                      "optimizer_s": m["optimizer"] - m["pre_optimizer"]}
            phases["other_s"] = total - sum(phases.values())
            rows = max(b["rows"], 1.0)
            emit({"event": "step", "step": state.global_step, "seconds": total, **phases,
                  "prompt_tokens": b["prompt_tokens"], "completion_tokens": b["completion_tokens"],
                  "reward_mean": b["reward"] / rows, "success": b["success"] / rows,
                  "format_ok": b["format_ok"] / rows})
            if learn and (state.global_step % learn["val_every"] == 0 or state.global_step == state.max_steps):
                self._validate(state.global_step, control)

        def _validate(self, step: int, control: Any) -> None:
            from trl.models.utils import unwrap_model_for_generation

            t = self.trainer
            start = time.perf_counter()
            with unwrap_model_for_generation(t.model_wrapped, t.accelerator,
                                             gradient_checkpointing_kwargs=t.args.gradient_checkpointing_kwargs) as m:
                success = task.validate(lambda prompts, sampling: hf_generate(m, task.tokenizer, prompts, sampling))
            minutes = (time.time() - spec["launch_time"]) / 60
            emit({"event": "val", "step": step, "success": success, "minutes": minutes,
                  "seconds": time.perf_counter() - start})
            if success >= learn["threshold"]:
                control.should_training_stop = True

    return BenchCallback()


def reward_function(task: Any, clock: Clock) -> Any:
    """TRL reward function: ragen's reward for each completion (``BanditTask.rewards``); counts the batch's tokens."""

    def ragen_bandit_reward(prompts: list[str], completions: list[str], completion_ids: list[list[int]],
                            seed: list[int], **kwargs: Any) -> list[float]:
        outcomes = task.rewards(prompts, completion_ids, seed)
        b = clock.batch
        b["prompt_tokens"] += sum(len(task.tokenizer(text=[p])["input_ids"][0]) for p in prompts)
        b["completion_tokens"] += sum(len(c) for c in completion_ids)
        b["rows"] += len(prompts)
        for o in outcomes:
            b["reward"] += o["reward"]
            b["success"] += o["success"]
            b["format_ok"] += o["format_ok"]
        return [o["reward"] for o in outcomes]

    return ragen_bandit_reward


def build_trainer(spec: dict, task: Any, clock: Clock, emit: Any, out_dir: str) -> Any:
    """The instrumented ``GRPOTrainer`` over ragen's prompts for ``spec["steps"]`` steps."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    stops = tuple(task.agent.stop_strings)
    tokenizer = task.tokenizer

    class StopAtAnswerGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose completions end with the token that closes ragen's answer tag (module docstring)."""

        def _generate_single_turn(self, *args: Any, **kwargs: Any) -> Any:
            ids, logprobs = super()._generate_single_turn(*args, **kwargs)
            return [cut_at_stop(c, tokenizer, stops)[0] for c in ids], logprobs

    model = AutoModelForCausalLM.from_pretrained(task.model_path, dtype=torch.float32)
    model.generate = clock.timed("generate", functools.partial(model.generate, tokenizer=tokenizer))
    dataset = Dataset.from_list(task.train_rows(spec["steps"]))
    callback = make_callback(task, clock, spec, emit)
    trainer = StopAtAnswerGRPOTrainer(model=model, reward_funcs=[reward_function(task, clock)],
                                      args=grpo_config(spec, out_dir, stops), train_dataset=dataset,
                                      processing_class=tokenizer, callbacks=[callback])
    callback.trainer = trainer
    trainer._generate_and_score_completions = clock.timed("generate_and_score",
                                                          trainer._generate_and_score_completions)
    trainer.training_step = clock.timed("training_step", trainer.training_step)
    return trainer


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    torch.set_num_threads(spec["threads"])
    from bandit_task import BanditTask

    events = open(spec["events"], "a")

    def emit(record: dict) -> None:
        events.write(json.dumps(record) + "\n")
        events.flush()
        print(json.dumps(record), flush=True)

    task = BanditTask(spec["overrides"])
    emit({"event": "start", "variant": spec["variant"], "model": Path(task.model_path).name,
          "threads": torch.get_num_threads(), "omp_wait_policy": OMP_WAIT_POLICY,
          **task.describe()})
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="trl_bench_") as out_dir:
        trainer = build_trainer(spec, task, clock, emit, out_dir)
        trainer.train()
    emit({"event": "done", "minutes": (time.time() - spec["launch_time"]) / 60})


if __name__ == "__main__":
    from ragen.allocator import tune_allocator

    tune_allocator()  # ragen's malloc settings unless the orchestrator turned them off (stock: RAGEN_TUNE_MALLOC=0)
    main()
