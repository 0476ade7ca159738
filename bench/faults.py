"""Fault-injection figures: kill -9 during checkpoint writes, and model-garbage fuzz counts.

    python bench/faults.py                      # 40 kills spread over checkpoint writes + garbage fuzz counts
    python bench/faults.py --kills 0 --garbage 10000    # only the fuzz counts
    python bench/faults.py --kills 100 --seed 3 --skip-garbage
    python bench/faults.py --trainer --kills 20     # kill the real trainer (python -m ragen.train) instead

``--trainer``: the kills hit ``python -m ragen.train`` itself (``bench/faults_trainer.py``); the default mode below
kills a forked stand-in that saves through the same checkpoint code, ~100x faster per kill.

**Checkpoint kills.** A forked child process trains a tiny transformers model (Llama, 2 layers) with AdamW and
saves a real checkpoint after every step through ``ragen.utils.checkpoint.write_checkpoint`` (``actor/`` as
``save_pretrained`` safetensors + ``optimizer.pt``, ``trainer_state.pt``; ``keep_last=2``), resuming with the
``trainer.resume=auto`` logic (``resolve_resume``). The parent first times a few saves, then for each kill forks
a child, waits until it announces the start of a save, sleeps a stratified random fraction of 1.2 x the save's
duration (so the kills spread over the whole write, the rename and the pruning) and sends SIGKILL. After each kill
it resolves ``resume=auto`` like the trainer, loads the checkpoint and checks it: every tensor equals what the
child had at that step, the optimizer state and trainer step match, and the resumed step is at least the last save
the child reported finished (it loses at most the step being saved). It prints kills tried / resumed cleanly and
where the kills landed (writing, marked-not-renamed, installed-pruning, done).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

from ragen.utils.checkpoint import checkpoint_step, list_checkpoints, resolve_resume, write_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/fault_campaign.py, also when loaded by path
from fault_campaign import KEEP_LAST, KillReport, kill_phase, resumed_step  # noqa: E402

_MODEL: list = []  # built once per process and inherited by forked children (building one costs ~0.3 s)


def _tiny_llama(vocab: int = 4096, hidden: int = 64):
    """A 2-layer Llama (~0.4 M parameters, ~1.6 MB of weights, 3x that with the optimizer moments)."""
    if _MODEL:
        return _MODEL[0]
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        _MODEL.append(LlamaForCausalLM(cfg))
    return _MODEL[0]


def _set_step_weights(model, step: int) -> None:
    """Make every parameter a known function of ``step`` (so a loaded checkpoint can be checked exactly)."""
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.fill_(step + i / 1000.0)


def _save(tmp: Path, model, opt, step: int) -> None:
    from ragen.trainer.state import save_trainer_state

    model.save_pretrained(tmp / "actor")
    torch.save({"optimizer": opt.state_dict(), "steps": step}, tmp / "actor" / "optimizer.pt")
    save_trainer_state(tmp / "trainer_state.pt", step=step, rng={"torch": torch.get_rng_state()},
                       proxy={"next_seed": 1000 + step})


def child_main(root: Path, out_fd: int, max_steps: int = 10**6) -> None:
    """Train-and-save loop of the killed process: resume=auto, then one step + one checkpoint at a time,
    writing ``B <step>`` / ``E <step>`` lines to ``out_fd`` around each save."""
    torch.set_num_threads(1)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = _tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    resumed = resolve_resume("auto", root)
    step = checkpoint_step(resumed) if resumed is not None else 0
    for _ in range(max_steps):
        step += 1
        _set_step_weights(model, step - 1)
        model.zero_grad()
        sum(p.sum() for p in model.parameters()).backward()
        opt.step()  # moments exist; weights are then pinned to the step's known values
        _set_step_weights(model, step)
        os.write(out_fd, f"B {step} {time.perf_counter()}\n".encode())
        write_checkpoint(root, step, lambda tmp, s=step: _save(tmp, model, opt, s), keep_last=KEEP_LAST)
        os.write(out_fd, f"E {step} {time.perf_counter()}\n".encode())


def verify_checkpoint(path: Path) -> int:
    """Load a checkpoint written by the child like a resume would and check its content; returns its step."""
    from safetensors.torch import load_file

    step = checkpoint_step(path)
    weights = load_file(path / "actor" / "model.safetensors")
    model = _tiny_llama()
    names = [n for n, _ in model.named_parameters()]
    for i, name in enumerate(names):
        if not torch.all(weights[name] == step + i / 1000.0):
            raise AssertionError(f"{path}: tensor {name} does not hold step {step}'s values")
    optim = torch.load(path / "actor" / "optimizer.pt", weights_only=False)
    state = torch.load(path / "trainer_state.pt", weights_only=False)
    if optim["steps"] != step or state["step"] != step or state["proxy"]["next_seed"] != 1000 + step:
        raise AssertionError(f"{path}: optimizer/trainer state disagree with the marker's step {step}")
    if len(optim["optimizer"]["state"]) != len(names):
        raise AssertionError(f"{path}: optimizer state has {len(optim['optimizer']['state'])} entries")
    return step


def _fork_child(root: Path) -> tuple[int, int]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        os.close(r)
        code = 0
        try:
            child_main(root, w)
        except BaseException:  # noqa: BLE001 - report and exit without running the parent's cleanup
            import traceback

            traceback.print_exc()
            code = 1
        os._exit(code)
    os.close(w)
    return pid, r


def _read_lines(fd: int, buf: bytearray, until: str | None, timeout: float) -> list[list[str]]:
    """Read ``fd`` into ``buf`` until a line starting with ``until`` arrives (None: until EOF); returns lines."""
    import select

    lines: list[list[str]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf.extend(chunk)
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            lines.append(line.decode().split())
            if until is not None and lines[-1][0] == until:
                return lines
    if until is not None:
        raise TimeoutError(f"the checkpointing child sent no {until!r} line within {timeout}s")
    return lines


def calibrate(root: Path, saves: int = 3) -> float:
    """Median seconds of one save of the child's loop, run in this process first (which also imports everything
    a save needs, so forked children save as fast as a long-running trainer); the folder is emptied after."""
    import shutil

    r, w = os.pipe()
    child_main(root, w, max_steps=saves)
    os.close(w)
    stamps = {(k, int(s)): float(t) for k, s, t in _read_lines(r, bytearray(), None, 5.0)}
    os.close(r)
    shutil.rmtree(root)
    return sorted(stamps[("E", s)] - stamps[("B", s)] for s in range(1, saves + 1))[saves // 2]


def run_kills(root: Path, kills: int, seed: int = 0, save_seconds: float | None = None) -> KillReport:
    """kill -9 a checkpointing child ``kills`` times at stratified random moments of a save; check each resume."""
    rng = random.Random(seed)
    report = KillReport(save_seconds=save_seconds or calibrate(root))
    finished = 0  # the highest step whose save completed in any child so far
    fracs = [(i + rng.random()) / kills * 1.2 for i in range(kills)]
    rng.shuffle(fracs)
    for frac in fracs:
        pid, fd = _fork_child(root)
        buf = bytearray()
        lines = _read_lines(fd, buf, "B", 60.0)
        if rng.random() < 0.5:  # sometimes let one save finish in this child first
            lines += _read_lines(fd, buf, "B", 60.0)
        time.sleep(frac * report.save_seconds)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        lines += _read_lines(fd, buf, None, 1.0)  # what the child announced before it died
        os.close(fd)
        writing = max(int(s) for k, s, _ in lines if k == "B")
        done = [int(s) for k, s, _ in lines if k == "E"]
        report.tried += 1
        report.phases[kill_phase(root, writing)] += 1
        last_done = max(done, default=writing - 1)
        finished = max([finished, *done])
        try:
            step = resumed_step(root, verify_checkpoint, finished)
            for _, other in list_checkpoints(root):
                verify_checkpoint(other)
            if not last_done <= step <= writing:
                raise AssertionError(f"resumed step {step}, expected between {last_done} and {writing}")
            report.resumed += 1
            report.lost_steps[writing - step] += 1
        except Exception as exc:  # noqa: BLE001 - a failed resume is the figure being measured
            report.failures.append(f"kill at {frac:.2f} x save while writing step {writing}: {exc}")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="checkpoint folder (default: a temporary folder)")
    ap.add_argument("--skip-garbage", action="store_true", help="only the checkpoint kills")
    ap.add_argument("--garbage", type=int, default=10_000, help="fuzzed responses per parser")
    ap.add_argument("--trainer", action="store_true", help="kill the real trainer (bench/faults_trainer.py)")
    args = ap.parse_args(argv)
    ok = True
    if args.trainer:
        return trainer_kills(args)
    with tempfile.TemporaryDirectory() as tmp:
        if args.kills <= 0:
            return 0 if garbage_report(args.garbage, args.seed) else 1
        root = Path(args.out or tmp) / "checkpoints"
        t0 = time.perf_counter()
        rep = run_kills(root, args.kills, args.seed)
        print(f"checkpoint kills: tried {rep.tried}, resumed cleanly {rep.resumed} "
              f"(one save ~{rep.save_seconds * 1000:.0f} ms; {time.perf_counter() - t0:.1f} s)")
        print(f"  kills by phase: {dict(rep.phases)}; steps lost -> kills: {dict(sorted(rep.lost_steps.items()))}")
        for line in rep.failures:
            print(f"  FAILED {line}")
    ok = rep.resumed == rep.tried
    if not args.skip_garbage:
        ok = garbage_report(args.garbage, args.seed) and ok
    return 0 if ok else 1


def trainer_kills(args: argparse.Namespace) -> int:
    """``--trainer``: the kill campaign on ``python -m ragen.train``; 0 when every kill resumed cleanly."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from faults_trainer import report, run_trainer_kills

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        rep = run_trainer_kills(Path(args.out or tmp), args.kills, args.seed)
        print(report(rep, time.perf_counter() - t0))
    return 0 if rep.resumed == rep.tried and not rep.failures else 1


def garbage_report(n: int, seed: int) -> bool:
    """Print fuzz counts: ``n`` garbage responses through the parser (think on and off) and through each env of
    ``config/env`` (text_adventure needs a game file and is covered by the tests' fake game). True when clean."""
    from omegaconf import OmegaConf

    import ragen.env as E
    from ragen.agent.garbage import fuzz_env, fuzz_parser

    clean = True
    for think in (True, False):
        t0 = time.perf_counter()
        rep = fuzz_parser(n, seed, think=think)
        clean &= not rep.failures
        print(f"parser think={think}: {rep.responses} responses, {rep.format_ok} well-formed, "
              f"{len(rep.failures)} failures ({time.perf_counter() - t0:.1f} s)")
    for f in sorted((Path(__file__).resolve().parents[1] / "config" / "env").glob("*.yaml")):
        cfg = OmegaConf.load(f)
        if cfg.name == "text_adventure":
            continue
        t0 = time.perf_counter()
        rep = fuzz_env(E.make(cfg.name, **OmegaConf.to_container(cfg.config)), n, seed)
        clean &= not rep.failures
        print(f"env {cfg.name}: {rep.responses} responses, {rep.steps} steps ({rep.valid_actions} valid actions, "
              f"{rep.resets} episodes), {len(rep.failures)} failures ({time.perf_counter() - t0:.1f} s)")
        for line in rep.failures[:3]:
            print(f"  FAILED {line[:200]}")
    return clean


if __name__ == "__main__":
    from ragen.allocator import tune_process

    tune_process()  # the process settings of ragen's programs
    sys.exit(main())
