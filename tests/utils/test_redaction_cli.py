"""Secrets never reach a CLI run's folder: ``python -m ragen.train`` as a user starts it, with a secret in
the environment and in an override value; every file the run leaves (Hydra's files, train.log, metrics, config,
checkpoints, report, wandb's offline folder) is grepped for it. Also the redacting log pipe on its own."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ragen.utils import log_redactor

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
from trainer_helpers import tiny_overrides  # noqa: E402

pytestmark = pytest.mark.slow  # multi-process or minutes-long: bash scripts/test.sh -m slow

ROOT = Path(__file__).resolve().parents[2]
SECRET = "hf_FakeTokenValue42xyz"
KEY = "wk-0123456789abcdef0123456789abcdef"


# python -m ragen.train, whose run also prints the secret (as a library might) from inside the quiet console
WRAPPER = """
import os, sys
import ragen.launch as m
inner = m.run
def run(cfg):
    print("print", os.environ["HF_TOKEN"])
    os.write(2, ("fd2 " + os.environ["HF_TOKEN"] + "\\n").encode())
    return inner(cfg)
m.run = run
sys.argv[0] = "ragen.train"
from ragen.train import main
main()
"""


def _env(**extra: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "WANDB_MODE": "offline", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("WANDB_API_KEY", None)
    return {**env, **extra}


def _leaks(folder: Path, values: list[str]) -> list[tuple[str, str]]:
    return [(str(p), v) for p in folder.rglob("*") if p.is_file() for v in values if v.encode() in p.read_bytes()]


@pytest.mark.parametrize("loggers", ["[console,jsonl]",
                                     pytest.param("[console,jsonl,wandb]", marks=pytest.mark.learning)])
def test_cli_run_writes_no_secret(tmp_path, loggers):
    """A 1-step run whose experiment name is ``exp-$HF_TOKEN`` and which prints the token (Python and C level):
    no file under the working folder holds the token or the wandb key (where a secret would land unless redacted:
    Hydra's .hydra/ dumps, train.log, and wandb's run file, which records the command line). With wandb (offline)
    it takes ~20 s more, so that variant runs with the long tests (``-m learning``)."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-c", WRAPPER, "--config-name", "ppo_bandit", *tiny_overrides(out, 1),
           f"trainer.loggers={loggers}", "trainer.save_freq=1", f"trainer.experiment_name=exp-{SECRET}",
           "trainer.val_before_train=false"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=_env(HF_TOKEN=SECRET, WANDB_API_KEY=KEY), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert {"train.log", "metrics.jsonl", "config.json", "checkpoints/global_step_1/COMPLETE",
            "checkpoints/global_step_1/trainer_state.pt", "report/index.html"} <= files
    assert ("wandb" in loggers) == any(f.startswith("wandb/") for f in files), sorted(files)[:20]
    assert not any(f.startswith(".hydra/") for f in files)  # hydra.output_subdir: null
    assert not _leaks(tmp_path, [SECRET, KEY])  # the whole working folder: output, wandb, anything Hydra wrote
    assert SECRET not in proc.stdout + proc.stderr and KEY not in proc.stdout + proc.stderr
    log = (out / "train.log").read_text()
    assert "print <redacted:HF_TOKEN>\n" in log and "fd2 <redacted:HF_TOKEN>\n" in log


def test_config_error_leaves_no_hydra_dump(tmp_path):
    """A config error with a secret among the overrides exits 2 before the run, and Hydra wrote no unredacted dump (the
    ArCHer entry point; ``python -m ragen.train``'s run is the test above, every config's hydra keys the one
    below)."""
    for module in ("ragen.archer",):
        out = tmp_path / module
        proc = subprocess.run([sys.executable, "-m", module, f"trainer.output_dir={out}",
                               f"trainer.experiment_name=exp-{SECRET}", "env.max_turn=0"],
                              cwd=tmp_path, env=_env(HF_TOKEN=SECRET), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "env.max_turn" in proc.stderr
        assert not (out / ".hydra").exists()
    assert not _leaks(tmp_path, [SECRET])


@pytest.mark.parametrize("chunks", [[b"a hf_FakeTokenValue42xyz b\n"], [b"x hf_FakeTok", b"enValue42xyz y\nz"],
                                    [b"p" * 70000 + b"hf_FakeTokenValue42xyz" + b"q" * 10]])
def test_pump_redacts_across_reads(tmp_path, chunks):
    """Whole lines are redacted even when a secret is split across two reads; a long run without a line end is
    written in pieces that keep a possibly split secret together; the unterminated tail is written at EOF."""
    r, w = os.pipe()
    log = tmp_path / "log"
    fd = log_redactor.open_log(log)
    pid = os.fork()
    if pid == 0:  # the writer
        os.close(r)
        for c in chunks:
            os.write(w, c)
        os._exit(0)
    os.close(w)
    log_redactor.pump(r, fd, {SECRET: "HF_TOKEN"})
    os.waitpid(pid, 0)
    os.close(r)
    os.close(fd)
    want = b"".join(chunks).replace(SECRET.encode(), b"<redacted:HF_TOKEN>")
    assert log.read_bytes() == want


def test_reader_outlives_a_killed_writer(tmp_path):
    """kill -9 of the process writing its output through the pipe: every line it wrote reaches the log."""
    log = tmp_path / "train.log"
    script = ("import os, signal, sys\nfrom ragen.utils import console\n"
              "with console.quiet_console(sys.argv[1]):\n"
              "    for i in range(2000):\n        print(f'line {i} token=' + os.environ['MY_TOKEN'])\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(log)], env=_env(MY_TOKEN=SECRET), timeout=120)
    assert proc.returncode == -9
    for _ in range(100):  # the reader drains the pipe after its writer died
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) == 2000:
            break
        time.sleep(0.1)
    assert lines == [f"line {i} token=<redacted:MY_TOKEN>" for i in range(2000)]


def test_every_entry_config_disables_hydra_dumps():
    """Every top-level config under config/ (each can be a --config-name) composes with no .hydra/ dump and no
    Hydra log file (a config that set its own hydra keys could bring them back)."""
    from hydra import compose, initialize_config_dir

    from ragen.trainer.config.compose import config_dir

    names = sorted(p.stem for p in Path(config_dir()).glob("*.yaml"))
    assert len(names) > 10
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        for name in names:
            hydra_cfg = compose(config_name=name, return_hydra_config=True).hydra
            assert hydra_cfg.output_subdir is None, name
            assert set(hydra_cfg.job_logging.handlers) == {"console"}, name


def test_terminal_lines_are_redacted(monkeypatch, capfd):
    """What the quiet console prints on the terminal (``say``) is redacted too (a batch system keeps it in a file)."""
    from ragen.utils import console

    monkeypatch.setenv("HF_TOKEN", SECRET)
    console.say(f"[ragen] run folder runs/exp-{SECRET}")
    assert capfd.readouterr().out == "[ragen] run folder runs/exp-<redacted:HF_TOKEN>\n"


def test_worker_output_goes_through_the_redacting_pipe(tmp_path):
    """A Ray worker of a quiet run (``RAGEN_LOG_FILE`` set) points its output at the run's log through its own
    redacting reader: what it prints (Python and C level) reaches the log redacted, even when it is SIGKILLed."""
    log = tmp_path / "train.log"
    script = ("import os, signal\nfrom ragen.utils.console import redirect_worker_output\nredirect_worker_output()\n"
              "print('worker', os.environ['HF_TOKEN'], flush=True)\n"
              "os.write(2, b'fd2 ' + os.environ['HF_TOKEN'].encode() + b'\\n')\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", script], env=_env(HF_TOKEN=SECRET, RAGEN_LOG_FILE=str(log)),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9 and SECRET not in proc.stdout + proc.stderr
    for _ in range(100):
        if log.exists() and log.read_text().count("\n") >= 2:
            break
        time.sleep(0.1)
    assert log.read_text() == "worker <redacted:HF_TOKEN>\nfd2 <redacted:HF_TOKEN>\n"


def test_archer_plot_title_is_redacted(tmp_path, monkeypatch):
    """The learning curve's title is drawn into the PNG (pixels no byte grep finds): the run both trainers plot
    through (``Run.plot``, which the ArCHer trainer calls) redacts it."""
    import inspect
    from types import SimpleNamespace

    import ragen.utils.plotting as plotting
    from ragen.archer.trainer import ArcherTrainer
    from ragen.trainer.run import Run

    assert "self.run.plot()" in inspect.getsource(ArcherTrainer)
    titles = []
    monkeypatch.setattr(plotting, "plot_learning_curves", lambda records, path, title="": titles.append(title))
    monkeypatch.setenv("HF_TOKEN", SECRET)
    stub = SimpleNamespace(history=[], dir=tmp_path,
                           cfg=SimpleNamespace(trainer=SimpleNamespace(experiment_name=f"exp-{SECRET}")))
    Run.plot(stub)
    assert titles == ["exp-<redacted:HF_TOKEN>"]
