from hypothesis import given, settings
from hypothesis import strategies as st

import ragen.env as E


def _env(**config):
    return E.make("bandit", **config)


def test_low_arm_always_pays_low_payout():
    env = _env()
    for seed in range(50):
        env.reset(seed)
        result = env.step("phoenix")
        assert result.reward == 0.1
        assert result.done
        assert result.info == {"action_is_valid": True, "action_is_effective": True, "success": False, "arm": "phoenix"}


def test_high_arm_pays_one_with_probability_quarter():
    env = _env()
    rewards = []
    for seed in range(2000):
        env.reset(seed)
        result = env.step("dragon")
        assert result.done and result.info["success"] is True and result.info["action_is_valid"] is True
        rewards.append(result.reward)
    assert set(rewards) == {0.0, 1.0}
    mean = sum(rewards) / len(rewards)
    assert abs(mean - 0.25) < 0.03  # binomial std over 2000 draws ~ 0.0097


def test_reward_is_deterministic_per_seed_and_configurable():
    env = _env(low_arm="safe", high_arm="risky", low_payout=0.3, high_payout=5.0, high_prob=0.5)
    outcomes = {}
    for seed in range(40):
        obs = env.reset(seed)
        assert "safe" in obs and "risky" in obs
        outcomes[seed] = env.step("risky").reward
        env.reset(seed)
        assert env.step("RISKY").reward == outcomes[seed]
        env.reset(seed)
        assert env.step("safe").reward == 0.3
    assert set(outcomes.values()) == {0.0, 5.0}


def test_arm_order_is_shuffled_by_seed_and_fixed_per_seed():
    env = _env()
    first = {seed: env.reset(seed) for seed in range(30)}
    assert {obs for obs in first.values()} == {
        "Arms: phoenix, dragon. Which arm do you pull?",
        "Arms: dragon, phoenix. Which arm do you pull?",
    }
    for seed, obs in first.items():
        assert env.reset(seed) == obs
        assert env.legal_actions() in obs


def test_case_and_punctuation_insensitive_matching():
    env = _env()
    for action in ("  DRAGON ", "Dragon.", "`dragon`", "'dragon'"):
        env.reset(1)
        assert env.step(action).info["arm"] == "dragon"


def test_invalid_action_ends_episode_with_zero_reward_and_step_after_done():
    env = _env()
    env.reset(0)
    result = env.step("griffin")
    assert (result.reward, result.done, result.info["action_is_valid"], result.info["success"]) == (
        0.0,
        True,
        False,
        False,
    )
    again = env.step("dragon")
    assert (again.reward, again.done, again.info["action_is_valid"]) == (0.0, True, False)
    env.reset(0)
    env.step("dragon")
    after = env.step("dragon")
    assert (after.reward, after.done, after.info["action_is_valid"], after.info["success"]) == (0.0, True, False, True)


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_garbage_never_raises(text):
    env = _env()
    env.reset(3)
    result = env.step(text)
    assert result.done
    valid = " ".join(text.strip(" \t\r\n\"'`*.,;:!").split()).lower() in ("dragon", "phoenix")
    assert result.info["action_is_valid"] is valid
    if not valid:
        assert result.reward == 0.0
