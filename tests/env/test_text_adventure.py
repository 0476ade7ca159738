"""Text adventure wrapper: contract tests on a fake jericho-like game, and a real TextWorld game through jericho."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ragen.env as E
from ragen.env.base import REQUIRED_INFO_KEYS
from ragen.env.text_adventure import emulator_seed


class FakeGame:
    """Two rooms: take the lamp (+5) in the hall, go north to the vault, open the chest (+10, win)."""

    def __init__(self, path: str, seed: int) -> None:
        self.path, self.seeds, self.moves = path, [seed], 0
        self.state = {"room": "hall", "lamp": False, "chest": False, "score": 0, "dead": False}

    def seed(self, seed=None):
        self.seeds.append(seed)
        return seed

    def reset(self):
        self.state = {"room": "hall", "lamp": False, "chest": False, "score": 0, "dead": False}
        self.moves = 0
        return "Welcome to the fake adventure.", {"moves": 0, "score": 0}

    def step(self, action):
        s, self.moves = self.state, self.moves + 1
        old = s["score"]
        if action == "look":
            text = "A dusty hall." if s["room"] == "hall" else "A cold vault with a chest."
        elif action == "inventory":
            text = "You are carrying: a lamp." if s["lamp"] else "You are empty-handed."
        elif action == "take lamp" and s["room"] == "hall" and not s["lamp"]:
            s["lamp"], s["score"], text = True, s["score"] + 5, "Taken."
        elif action == "north" and s["room"] == "hall":
            s["room"], text = "vault", "You go north."
        elif action == "open chest" and s["room"] == "vault" and s["lamp"]:
            s["chest"], s["score"], text = True, s["score"] + 10, "You open the chest. You win!"
        elif action == "jump in pit":
            s["dead"], text = True, "You fall. *** You have died ***"
        else:
            text = "Nothing happens."
        return text, s["score"] - old, self.game_over() or self.victory(), {"moves": self.moves}

    def get_valid_actions(self):
        if self.state["room"] == "hall":
            return ["north"] + ([] if self.state["lamp"] else ["take lamp"])
        return [] if self.state["chest"] else ["open chest"]

    def get_score(self):
        return self.state["score"]

    def get_max_score(self):
        return 15

    def get_state(self):
        return copy.deepcopy((self.state, self.moves))

    def set_state(self, state):
        self.state, self.moves = copy.deepcopy(state)

    def get_world_state_hash(self):
        return str(sorted(self.state.items()))

    def victory(self):
        return self.state["chest"]

    def game_over(self):
        return self.state["dead"]


def fake_env(**kw):
    return E.make("text_adventure", game_path="fake.z5", game_factory=FakeGame, **kw)


def test_observation_has_location_inventory_score_and_valid_actions():
    env = fake_env()
    obs = env.reset(3)
    assert obs == ("Welcome to the fake adventure.\n\nLocation: A dusty hall.\nInventory: You are empty-handed.\n"
                   "Score: 0 / 15\nValid actions: north, take lamp")
    assert env.game.moves == 0  # look / inventory ran on a restored state
    assert env.game.seeds[-1] == emulator_seed(3) == 4
    assert env.legal_actions() == "north, take lamp"


def test_successful_episode_reward_is_score_change():
    env = fake_env()
    env.reset(0)
    out = [env.step(a) for a in ("take lamp", "north", "open chest")]
    assert [r.reward for r in out] == [5.0, 0.0, 10.0]
    assert [r.done for r in out] == [False, False, True]
    assert [r.info["success"] for r in out] == [False, False, True]
    assert "Inventory: You are carrying: a lamp." in out[1].observation
    assert env.step("north").done and env.step("north").reward == 0.0


def test_failing_episodes_max_steps_and_death():
    env = fake_env(max_steps=2)
    env.reset(0)
    r1, r2 = env.step("dance"), env.step("north")
    assert [r1.reward, r2.reward] == [0.0, 0.0] and [r1.done, r2.done] == [False, True]
    assert not r1.info["action_is_effective"] and r2.info["action_is_effective"] and not r2.info["success"]
    env = fake_env()
    env.reset(0)
    r = env.step("jump in pit")
    assert r.done and not r.info["success"] and r.reward == 0.0


def test_reset_is_deterministic():
    a, b = fake_env(), fake_env()
    assert a.reset(5) == b.reset(5)
    a.step("take lamp")
    assert a.reset(5) == b.reset(5)


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="game_path"):
        E.make("text_adventure")
    with pytest.raises(FileNotFoundError, match="game_path"):
        E.make("text_adventure", game_path=str(tmp_path / "nope.z5"))


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.text(max_size=250), st.just("x" * 199), st.just("\x00\n")))
def test_garbage_commands_never_raise(action):
    env = fake_env(max_steps=3)
    env.reset(1)
    r = env.step(action)
    assert all(k in r.info for k in REQUIRED_INFO_KEYS)
    if not action.strip() or len(" ".join(action.split()).encode()) > 198:
        assert not r.info["action_is_valid"] and r.reward == 0.0


@pytest.fixture(scope="module")
def textworld_game(tmp_path_factory):
    """A tiny TextWorld game compiled locally (TextWorld bundles Inform 7; no network). jericho only enables
    scores for TextWorld games whose file name starts with ``tw-``."""
    out = tmp_path_factory.mktemp("tw") / "tw-ragen.z8"
    tw_make = Path(sys.executable).parent / "tw-make"
    cmd = [str(tw_make), "custom", "--world-size", "2", "--nb-objects", "3", "--quest-length", "2", "--seed", "1",
           "--output", str(out), "-f", "--silent"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    return out


def test_real_textworld_game_through_jericho(textworld_game):
    walkthrough = json.loads(textworld_game.with_suffix(".json").read_text())["metadata"]["walkthrough"]
    env = E.make("text_adventure", game_path=str(textworld_game))
    obs = env.reset(0)
    assert "Location:" in obs and "Inventory:" in obs and "Score: 0 / " in obs
    max_score = env.game.get_max_score()
    rewards = []
    for i, action in enumerate(walkthrough):
        r = env.step(action)
        rewards.append(r.reward)
        assert r.done == (i == len(walkthrough) - 1)
    assert sum(rewards) == max_score > 0 and r.info["success"]
    assert env.reset(0) == obs  # same seed, same start
    short = E.make("text_adventure", game_path=str(textworld_game), max_steps=1)
    short.reset(0)
    r = short.step("look")
    assert r.done and r.reward == 0.0 and not r.info["success"]


def test_config_file_keys_are_env_keys(check_env_config_file):
    # game_factory (a Python callable) cannot be written in YAML
    cfg = check_env_config_file("text_adventure", python_only=("game_factory",))
    assert cfg["max_actions_per_turn"] == 1
