"""delayed_choice: the first choice decides a reward paid only after the last turn."""

import pytest

from ragen.env import make


def _play(env, seed, door, chest="gold"):
    obs = env.reset(seed)
    first = env.step(door)
    last = env.step(chest)
    return obs, first, last


@pytest.mark.parametrize("door", ["right", "left"])
def test_reward_comes_after_the_last_turn_and_depends_only_on_the_first_choice(door):
    env = make("delayed_choice")
    for chest in ("gold", "silver"):
        obs, first, last = _play(env, 3, door, chest)
        assert obs.startswith("Doors: ") and "left" in obs and "right" in obs
        assert first.reward == 0.0 and not first.done and first.info["action_is_valid"]
        assert "Chests: " in first.observation
        assert last.done and last.reward == (1.0 if door == "right" else 0.0)
        assert last.info["success"] is (door == "right")
        assert last.info["outcome_reward"] == last.reward and first.info["step_reward"] == 0.0
        assert first.info["tool_result"] is False and last.info["tool_result"] is False  # there is no tool


def test_order_is_shuffled_by_seed_and_deterministic():
    env = make("delayed_choice")
    firsts = {env.reset(s).split(":")[1].split(",")[0].strip() for s in range(20)}
    assert firsts == {"left", "right"}
    assert env.reset(7) == env.reset(7)


def test_invalid_answers_end_the_episode_without_reward():
    env = make("delayed_choice")
    env.reset(0)
    res = env.step("the middle one")
    assert res.done and res.reward == 0.0 and not res.info["action_is_valid"] and not res.info["success"]
    assert env.step("right").info["action_is_valid"] is False  # over
    env.reset(0)
    env.step("Right.")  # normalised like every env's actions
    res = env.step("left")  # a door is not a chest
    assert res.done and res.reward == 0.0 and not res.info["action_is_valid"]


def test_num_turns_and_bad_config():
    env = make("delayed_choice", num_turns=3, payout=2.0)
    env.reset(1)
    assert not env.step("right").done and not env.step("gold").done
    assert env.step("silver").reward == 2.0
    with pytest.raises(ValueError, match="good_door"):
        make("delayed_choice", good_door="middle")
    with pytest.raises(ValueError, match="num_turns"):
        make("delayed_choice", num_turns=0)
