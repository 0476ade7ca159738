"""``python -m ragen.eval``: interval formulas on hand-computed numbers, model-argument resolution on fake run
folders, an end-to-end run of the tiny random model, and the openai path over a fake HTTP transport."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ragen.evaluation import report as R
from ragen.evaluation.cli import main
from ragen.evaluation.models import ACCEPTED, ModelArgError, resolve_model_arg, resolve_model_args
from ragen.evaluation.runner import EpisodeResult
from ragen.evaluation.stats import (
    Z95,
    mean_interval,
    newcombe_difference,
    paired_difference,
    wilson_interval,
)
from ragen.utils.checkpoint import write_checkpoint

TOL = 1e-4
FAST = ["agent.max_new_tokens=12", "trainer.num_threads=1", "rollout.dtype=float32", "--no-progress"]


def close(interval, estimate, low, high, tol=TOL):
    """``interval == (estimate, low, high)`` within ``tol`` (nan matches nan)."""
    for got, want in zip(interval, (estimate, low, high), strict=True):
        assert (math.isnan(got) and math.isnan(want)) or abs(got - want) < tol, (tuple(interval), estimate, low, high)


# ---------------------------------------------------------------------------------------------- statistics by hand
def test_wilson_by_hand():
    # z = 1.95996, z^2 = 3.84146. 8/10: center (0.8 + 0.19207) / 1.38415 = 0.71674,
    # half = z * sqrt(0.016 + 0.0096036) / 1.38415 = 0.22658
    assert abs(Z95 - 1.959964) < 1e-6
    close(wilson_interval(8, 10), 0.8, 0.49016, 0.94332)
    # 0/10: center = half = 0.19207 / 1.38415 = 0.13877 -> [0, 0.27753]; 10/10 mirrors it
    close(wilson_interval(0, 10), 0.0, 0.0, 0.27753)
    close(wilson_interval(10, 10), 1.0, 0.72247, 1.0)
    # no trials: no information, [0, 1]
    close(wilson_interval(0, 0), math.nan, 0.0, 1.0)
    with pytest.raises(ValueError, match="successes <= n"):
        wilson_interval(3, 2)


def test_mean_interval_by_hand():
    # mean 2.5, s = sqrt(5/3) = 1.29099, half = 1.95996 * 1.29099 / 2 = 1.26515
    close(mean_interval([1.0, 2.0, 3.0, 4.0]), 2.5, 1.23485, 3.76515)
    close(mean_interval([0.5, 0.5, 0.5]), 0.5, 0.5, 0.5)
    close(mean_interval([7.0]), 7.0, math.nan, math.nan)
    close(mean_interval([]), math.nan, math.nan, math.nan)


def test_newcombe_difference_by_hand():
    # Newcombe (1998), example (a): 56/70 - 48/80 = 0.2, method 10 interval [0.0524, 0.3339].
    # Wilson 56/70 = [0.69183, 0.87695], 48/80 = [0.49045, 0.70039]:
    # low = 0.2 - sqrt(0.10817^2 + 0.10039^2), high = 0.2 + sqrt(0.07695^2 + 0.10955^2)
    close(newcombe_difference(48, 80, 56, 70), 0.2, 0.05243, 0.33387)
    close(newcombe_difference(56, 70, 48, 80), -0.2, -0.33387, -0.05243)
    # equal counts: estimate 0, symmetric interval; 0/10 vs 0/10 -> +-0.27753 (the Wilson upper bound)
    close(newcombe_difference(0, 10, 0, 10), 0.0, -0.27753, 0.27753)
    assert newcombe_difference(3, 8, 3, 8).contains(0.0)


def test_paired_difference_by_hand():
    # differences [1, 1, 0, 0]: mean 0.5, s = sqrt(1/3) = 0.57735, half = 1.95996 * 0.57735 / 2 = 0.56579
    close(paired_difference([0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]), 0.5, -0.06579, 1.06579)
    close(paired_difference([0.1, -0.1, 1.0], [0.1, -0.1, 1.0]), 0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="equally many"):
        paired_difference([1.0], [1.0, 2.0])


def test_summarize_and_compare_by_hand():
    # model 1: 1 success in 4; 7 turns, 5 parsed. model 2: 3 successes; 4 turns, 4 parsed.
    first = [EpisodeResult(0, True, 1.0, 1, 1), EpisodeResult(1, False, -0.2, 2, 0),
             EpisodeResult(2, False, 0.0, 2, 2), EpisodeResult(3, False, 0.1, 2, 2)]
    second = [EpisodeResult(0, True, 1.0, 1, 1), EpisodeResult(1, True, 1.0, 1, 1),
              EpisodeResult(2, True, 1.0, 1, 1), EpisodeResult(3, False, 0.1, 1, 1)]
    s1 = R.summarize(first)
    assert (s1["n"], s1["failed"], s1["success"]["successes"], s1["success"]["trials"]) == (4, 0, 1, 4)
    assert (s1["format"]["successes"], s1["format"]["trials"]) == (5, 7)
    close(R.Interval(s1["format"]["estimate"], s1["format"]["low"], s1["format"]["high"]),
          *wilson_interval(5, 7))
    assert s1["reward"]["estimate"] == pytest.approx(0.225) and s1["turns"]["estimate"] == pytest.approx(1.75)
    diff = R.compare(first, second)
    assert diff["success"]["estimate"] == pytest.approx(0.5)
    assert (diff["success"]["low"], diff["success"]["high"]) == pytest.approx(newcombe_difference(1, 4, 3, 4)[1:])
    assert (diff["format"]["low"], diff["format"]["high"]) == pytest.approx(newcombe_difference(5, 7, 4, 4)[1:])
    # reward differences per seed: [0, 1.2, 1.0, 0.0] -> mean 0.55; turns: [0, -1, -1, -1] -> -0.75
    assert diff["reward"]["estimate"] == pytest.approx(0.55) and diff["turns"]["estimate"] == pytest.approx(-0.75)
    with pytest.raises(ValueError, match="same seeds"):
        R.compare(first, second[::-1])


# ---------------------------------------------------------------------------------------------- model arguments
def _model_folder(path: Path) -> Path:
    """A folder that passes for a transformers model (resolution reads config.json only; no weights needed)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "tokenizer_config.json").write_text("{}")
    return path


def _run_folder(root: Path) -> Path:
    """A run folder: complete checkpoints at steps 2 and 4, an unmarked global_step_6, a temporary step 8."""
    run = root / "runs" / "x"
    for step in (2, 4):
        write_checkpoint(run / "checkpoints", step, lambda tmp: _model_folder(tmp / "actor"))
    _model_folder(run / "checkpoints" / "global_step_6" / "actor")  # no COMPLETE marker
    _model_folder(run / "checkpoints" / ".tmp_global_step_8" / "actor")
    (run / "config.json").write_text(json.dumps({"model": {"path": "smollm2-135m-instruct"}}))  # not a model
    (run / "metrics.jsonl").write_text("")
    return run


def test_resolve_run_checkpoint_and_model_folders(tmp_path):
    run = _run_folder(tmp_path)
    latest = run / "checkpoints" / "global_step_4"
    for arg, source in ((run, "run folder"), (run / "checkpoints", "checkpoints folder")):
        spec = resolve_model_arg(str(arg))
        assert (spec.kind, spec.path, spec.source, spec.step) == ("local", str(latest / "actor"), source, 4)
        assert spec.checkpoint == str(latest) and spec.label == str(arg)
    spec = resolve_model_arg(str(run / "checkpoints" / "global_step_2"))
    assert (spec.path, spec.step, spec.source) == (str(run / "checkpoints" / "global_step_2" / "actor"), 2,
                                                   "checkpoint folder")
    folder = _model_folder(tmp_path / "my_model")
    spec = resolve_model_arg(str(folder))
    assert (spec.kind, spec.path, spec.source, spec.step) == ("local", str(folder), "model folder", None)


def test_resolve_errors_name_the_value_and_the_accepted_forms(tmp_path):
    run = _run_folder(tmp_path)
    bare = tmp_path / "runs" / "fresh"
    bare.mkdir()
    (bare / "metrics.jsonl").write_text("")
    no_actor = tmp_path / "global_step_3"
    write_checkpoint(tmp_path / "c", 3, lambda tmp: None).rename(no_actor)
    (tmp_path / "empty").mkdir()
    (tmp_path / "weights.bin").write_text("x")
    cases = [
        (bare, "no complete checkpoint"),
        (run / "checkpoints" / "global_step_6", "incomplete"),
        (run / "checkpoints" / ".tmp_global_step_8", "incomplete"),
        (no_actor, "no actor/"),
        (tmp_path / "empty", "neither a run folder"),
        (tmp_path / "weights.bin", "is a file"),
        (tmp_path / "no" / "such" / "model", "not usable"),
        ("not-a-model", "not usable"),
    ]
    for arg, message in cases:
        with pytest.raises(ModelArgError, match=message) as info:
            resolve_model_arg(str(arg))
        assert str(arg) in str(info.value)
    with pytest.raises(ModelArgError) as info:
        resolve_model_arg(str(tmp_path / "empty"))
    assert ACCEPTED in str(info.value)


def test_resolve_alias_and_openai(monkeypatch):
    spec = resolve_model_arg("smollm2-135m-instruct")  # the packaged default, converted once and cached
    assert spec.kind == "local" and (Path(spec.path) / "config.json").is_file()
    spec = resolve_model_arg("openai:served-model", base_url="http://h:8000/v1")
    assert (spec.kind, spec.path, spec.base_url, spec.api_key_env) == ("openai", "served-model", "http://h:8000/v1",
                                                                        "OPENAI_API_KEY")
    monkeypatch.delenv("EVAL_TEST_KEY", raising=False)
    for kwargs, message in (({}, "needs --base-url"), ({"base_url": "h:8000"}, "http:// or https://"),
                            ({"base_url": "http://h", "api_key_env": "EVAL_TEST_KEY"}, "EVAL_TEST_KEY")):
        with pytest.raises(ModelArgError, match=message):
            resolve_model_arg("openai:served-model", **kwargs)
    with pytest.raises(ModelArgError, match="no model name"):
        resolve_model_arg("openai:", base_url="http://h")
    with pytest.raises(ModelArgError, match="apply only to openai"):
        resolve_model_args(["smollm2-135m-instruct"], base_url="http://h")


# ---------------------------------------------------------------------------------------------- end to end
@pytest.fixture(scope="module")
def tiny_folder() -> str:
    from ragen.trainer.builders import prepare_model
    from ragen.trainer.config.compose import load_train_config

    path, _ = prepare_model(load_train_config("base", ["model=tiny"]))
    return path


@pytest.mark.slow
def test_two_copies_of_the_tiny_model(tiny_folder, tmp_path, capsys):
    out = tmp_path / "eval" / "out.json"
    code = main([tiny_folder, tiny_folder, "--env", "bandit", "--env", "delayed_choice", "--n", "8",
                 "--batch-size", "3", "--json", str(out), "model=tiny", *FAST])
    assert code == 0
    report = json.loads(out.read_text())
    assert [m["label"] for m in report["models"]] == [tiny_folder, tiny_folder]
    assert report["models"][0]["source"] == "model folder"
    assert (report["config_name"], report["n"], report["temperature"], report["batch_size"]) == ("base", 8, 0.0, 3)
    assert "model=tiny" in report["overrides"] and "agent.max_new_tokens=12" in report["overrides"]
    assert list(report["envs"]) == ["bandit", "delayed_choice"]
    seeds = list(range(report["val_seed"], report["val_seed"] + 8))
    for name, env in report["envs"].items():
        assert env["env"]["name"] == name and env["env"]["agent"]["temperature"] == 0.0
        assert env["n"] == 8 and env["seeds"] == seeds
        assert len(env["models"]) == 2 and len(env["episodes"]) == 2
        for summary, episodes in zip(env["models"], env["episodes"], strict=True):
            assert [e["seed"] for e in episodes] == seeds
            assert (summary["n"], summary["success"]["trials"]) == (8, 8)
            assert summary["success"]["successes"] == sum(e["success"] for e in episodes)
            assert summary["format"]["trials"] == sum(e["turns"] for e in episodes) >= 8
            assert summary["format"]["successes"] == sum(e["format_ok"] for e in episodes)
            assert all(1 <= e["turns"] <= env["env"]["max_turn"] for e in episodes)
            for metric in R.METRICS:
                assert summary[metric]["low"] <= summary[metric]["estimate"] <= summary[metric]["high"]
        assert env["episodes"][0] == env["episodes"][1]  # same weights, same seeds, greedy
        for metric in R.METRICS:
            diff = env["difference"][metric]
            assert diff["estimate"] == 0.0 and diff["low"] <= 0.0 <= diff["high"]
    printed = capsys.readouterr().out
    assert "model 2 - model 1" in printed and f"model 1: {tiny_folder}" in printed
    for name in ("bandit", "delayed_choice"):
        for label in R.LABELS.values():
            assert any(line.startswith(name) and label in line for line in printed.splitlines()), (name, label)
    assert f"wrote {out}" in printed


def test_one_model_table_has_no_difference(tiny_folder, capsys):
    assert main([tiny_folder, "--env", "bandit", "--n", "2", "model=tiny", *FAST]) == 0
    printed = capsys.readouterr().out
    assert "success rate" in printed and "model 2" not in printed


@pytest.mark.slow
def test_run_folder_end_to_end_and_weights_only_checkpoints(tiny_folder, tmp_path, capsys):
    """A run folder holding the tiny model as its checkpoint is played from its latest checkpoint, and the JSON
    names it; a checkpoint without tokenizer files is refused up front (the engine could not load it)."""
    import shutil

    def actor(with_tokenizer: bool):
        def write(tmp: Path) -> None:
            shutil.copytree(tiny_folder, tmp / "actor")
            if not with_tokenizer:
                for name in ("tokenizer.json", "tokenizer_config.json"):
                    (tmp / "actor" / name).unlink()
        return write

    run = tmp_path / "run"
    write_checkpoint(run / "checkpoints", 3, actor(True))
    out = tmp_path / "run.json"
    assert main([str(run), "--env", "bandit", "--n", "2", "--json", str(out), "model=tiny", *FAST]) == 0
    model = json.loads(out.read_text())["models"][0]
    assert (model["source"], model["step"], model["path"]) == ("run folder", 3,
                                                               str(run / "checkpoints" / "global_step_3" / "actor"))
    write_checkpoint(run / "checkpoints", 5, actor(False))
    capsys.readouterr()
    assert main([str(run), "--env", "bandit", "--n", "2", "model=tiny", *FAST]) == 2
    err = capsys.readouterr().err
    assert "global_step_5" in err and "no tokenizer files" in err


def test_bad_arguments_exit_2_and_name_the_problem(tiny_folder, capsys):
    cases = [
        ([tiny_folder, "--env", "no_such_env"], "no_such_env"),
        ([tiny_folder, "--env", "bandit", "agent.no_such_key=1"], "no_such_key"),
        ([tiny_folder, "--env", "bandit", "--n", "0"], "--n must be >= 1"),
        ([tiny_folder, "--config-name", "no_such_config"], "no_such_config"),
        (["not-a-model", "--env", "bandit"], "not-a-model"),
        ([tiny_folder, tiny_folder, tiny_folder], "one or two models"),
        ([tiny_folder, "--env", "bandit", "env=sokoban"], "conflicts with --env"),
        ([tiny_folder, "--env", "bandit", "agent.layout=bad"], "agent.layout='bad' is unknown"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv


# ---------------------------------------------------------------------------------------------- openai engine
@pytest.mark.slow
def test_openai_models_over_a_fake_transport(monkeypatch, tmp_path, capsys, default_tokenizer):
    """Two served "models" that always pull one arm: the calls carry the endpoint, key, model and greedy
    sampling; the numbers are those of the env on the shared seeds."""
    import ragen.env as E
    from ragen.rollout import openai_engine

    arms = {"always-low": "phoenix", "always-high": "dragon"}
    calls = []

    def transport(url, payload, headers, timeout):
        calls.append((url, payload, headers))
        text = f"<think>pull</think><answer>{arms[payload['model']]}</answer>"
        ids = default_tokenizer(text, add_special_tokens=False)["input_ids"] + [default_tokenizer.eos_token_id]
        choice = {"text": text, "finish_reason": "stop",
                  "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.1] * len(ids)}}
        return {"choices": [{**choice, "index": i} for i in range(len(payload["prompt"]))]}

    monkeypatch.setattr(openai_engine, "urllib_transport", transport)
    monkeypatch.setenv("EVAL_TEST_KEY", "secret-value")
    out = tmp_path / "openai.json"
    argv = ["openai:always-low", "openai:always-high", "--base-url", "http://fake:9/v1", "--api-key-env",
            "EVAL_TEST_KEY", "--env", "bandit", "--n", "8", "--batch-size", "4", "--json", str(out), "--no-progress"]
    assert main(argv) == 0
    assert [c[1]["model"] for c in calls] == ["always-low"] * 2 + ["always-high"] * 2  # 8 one-turn episodes, 4 a call
    assert all(url == "http://fake:9/v1/completions" for url, _, _ in calls)
    assert all(h["Authorization"] == "Bearer secret-value" for _, _, h in calls)
    assert all(len(p["prompt"]) == 4 and p["temperature"] == 0.0 and "</answer>" in p["stop"] for _, p, _ in calls)
    text = out.read_text()
    assert "secret-value" not in text
    report = json.loads(text)
    assert [(m["kind"], m["path"], m["api_key_env"]) for m in report["models"]] == [
        ("openai", "always-low", "EVAL_TEST_KEY"), ("openai", "always-high", "EVAL_TEST_KEY")]
    env = report["envs"]["bandit"]
    low, high = env["models"]
    assert (low["success"]["successes"], high["success"]["successes"]) == (0, 8)
    assert low["format"]["estimate"] == high["format"]["estimate"] == 1.0
    payouts = []
    for seed in env["seeds"]:
        bandit = E.make("bandit")
        bandit.reset(seed)
        payouts.append(bandit.step("dragon").reward)
    assert low["reward"]["estimate"] == pytest.approx(0.1)
    assert high["reward"]["estimate"] == pytest.approx(sum(payouts) / 8)
    diff = env["difference"]
    assert [diff["success"][k] for k in ("estimate", "low", "high")] == pytest.approx(
        list(newcombe_difference(0, 8, 8, 8)))
    assert diff["reward"]["estimate"] == pytest.approx(sum(payouts) / 8 - 0.1)
    assert "+1.000" in capsys.readouterr().out


@pytest.mark.slow
def test_run_folder_plays_with_the_config_it_was_trained_with(tiny_folder, tmp_path, capsys):
    """A run trained on FrozenLake 3x3 with 3 turns and the forced answer prefix is evaluated with those settings
    (its config.json), not base.yaml's; overrides apply on top, --config-name composes instead, --env swaps the env."""
    import dataclasses
    import shutil

    from ragen.trainer.config.compose import load_train_config

    run = tmp_path / "run"
    trained = load_train_config("ppo_multi_turn", ["model=tiny", "agent.max_new_tokens=12"])
    run.mkdir()
    (run / "config.json").write_text(json.dumps(dataclasses.asdict(trained)))
    write_checkpoint(run / "checkpoints", 2, lambda tmp: shutil.copytree(tiny_folder, tmp / "actor"))
    fast = ["trainer.num_threads=1", "rollout.dtype=float32", "--no-progress"]
    out = tmp_path / "saved.json"
    assert main([str(run), "--n", "2", "--json", str(out), "agent.max_new_tokens=8", *fast]) == 0
    report = json.loads(out.read_text())
    env = report["envs"]["frozen_lake"]["env"]
    assert (env["max_turn"], env["config"]["size"]) == (3, 3)
    assert (env["agent"]["think"], env["agent"]["response_prefix"], env["agent"]["max_new_tokens"]) == (
        False, "<answer>", 8)
    assert report["config_name"] == f"run config {run / 'config.json'}"
    out2 = tmp_path / "composed.json"
    assert main([str(run), "--config-name", "base", "--n", "2", "--json", str(out2), "model=tiny", *FAST]) == 0
    assert list(json.loads(out2.read_text())["envs"]) == ["bandit"]  # told otherwise: base.yaml's env
    out3 = tmp_path / "swapped.json"
    assert main([str(run), "--env", "bandit", "--n", "2", "--json", str(out3), *fast]) == 0
    bandit = json.loads(out3.read_text())["envs"]["bandit"]["env"]
    assert bandit["max_turn"] == 1 and bandit["agent"]["response_prefix"] == "<answer>"  # the run's agent settings
    capsys.readouterr()


@pytest.mark.slow
def test_library_warnings_stay_off_the_console(tiny_folder, tmp_path, subprocess_env):
    """``python -m ragen.eval`` prints its table, not the libraries' deprecation warnings (torch's FutureWarning
    and transformers' ``past_key_values`` notice on every generate) or transformers' weight-loading bar; with
    ``--json`` they are kept in the log next to it (``--log`` names another file)."""
    import subprocess
    import sys

    out = tmp_path / "eval.json"
    proc = subprocess.run([sys.executable, "-m", "ragen.eval", tiny_folder, "--env", "bandit", "--n", "2",
                           "--json", str(out), "model=tiny", *FAST], cwd=tmp_path, env=subprocess_env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "success rate" in proc.stdout
    for noise in ("Warning", "deprecated", "Loading weights"):
        assert noise not in proc.stdout + proc.stderr, noise
    assert "deprecated" in out.with_suffix(".log").read_text()
