from hypothesis import given, settings
from hypothesis import strategies as st

import ragen.env as E
from ragen.env.frozen_lake import shortest_path

SYMBOLS = {"S": "_", "F": "_", "H": "O", "G": "G"}


def _expected_render(desc, player, player_symbol="P"):
    rows = [[SYMBOLS[ch] for ch in line] for line in desc]
    rows[player[0]][player[1]] = player_symbol
    return "\n".join("".join(r) for r in rows)


def test_first_observation_renders_the_map():
    env = E.make("frozen_lake")
    for seed in range(10):
        obs = env.reset(seed)
        assert env.desc[0][0] == "S" and env.desc[3][3] == "G"
        assert obs == _expected_render(env.desc, (0, 0))
        assert env.position == (0, 0)


def test_known_path_reaches_goal_with_reward_one():
    for size in (4, 6):
        env = E.make("frozen_lake", size=size)
        for seed in range(15):
            env.reset(seed)
            path = shortest_path(env.desc, (0, 0), "G")
            assert path, f"gymnasium maps always have a path (seed {seed})"
            rewards = []
            for i, action in enumerate(path):
                result = env.step(action)
                rewards.append(result.reward)
                assert result.info["action_is_valid"] and result.info["action_is_effective"]
                assert result.done == (i == len(path) - 1)
            assert rewards == [0.0] * (len(path) - 1) + [1.0]
            assert result.info["success"] is True
            assert result.observation == _expected_render(env.desc, (size - 1, size - 1), "√")


def test_falling_into_a_hole_ends_without_reward():
    env = E.make("frozen_lake", p=0.6)
    checked = 0
    for seed in range(10):
        env.reset(seed)
        path = shortest_path(env.desc, (0, 0), "H")
        if not path:
            continue
        for action in path:
            result = env.step(action)
        assert (result.reward, result.done, result.info["success"]) == (0.0, True, False)
        assert "X" in result.observation and "P" not in result.observation
        checked += 1
    assert checked >= 5


def test_bump_into_edge_is_valid_but_not_effective_and_max_steps_ends():
    env = E.make("frozen_lake", max_steps=3)
    obs = env.reset(0)
    for i in range(3):
        result = env.step("up")
        assert result.observation == obs
        assert result.info["action_is_valid"] is True and result.info["action_is_effective"] is False
        assert result.reward == 0.0 and result.done == (i == 2)
    after = env.step("Down")
    assert (after.done, after.reward, after.info["action_is_valid"]) == (True, 0.0, False)


def test_trajectory_is_deterministic_per_seed_slippery_included():
    actions = ["Right", "Down", "Down", "Right", "Left", "Down", "Right", "Right"] * 2
    for slippery in (False, True):
        env = E.make("frozen_lake", is_slippery=slippery, size=5)

        def run(seed, env=env):
            trace = [env.reset(seed)]
            for action in actions:
                r = env.step(action)
                trace.append((r.observation, r.reward, r.done))
                if r.done:
                    break
            return trace

        traces = [run(seed) for seed in range(12)]
        assert traces == [run(seed) for seed in range(12)]
        assert len({t[0] for t in traces}) > 1  # different seeds give different maps


def test_slippery_ice_sometimes_slides_sideways():
    env = E.make("frozen_lake", is_slippery=True)
    first_cells = set()
    for seed in range(30):
        env.reset(seed)
        env.step("Down")
        first_cells.add(env.position)
    # From (0, 0), "Down" goes to (1, 0) as meant, slides Right to (0, 1), or slides Left into the edge.
    assert first_cells == {(1, 0), (0, 1), (0, 0)}
    plain = E.make("frozen_lake")
    plain.reset(0)
    plain.step("Down")
    assert plain.position == (1, 0)


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_garbage_never_raises_and_keeps_state(text):
    env = E.make("frozen_lake")
    obs = env.reset(7)
    result = env.step(text)
    if not result.info["action_is_valid"]:
        assert (result.observation, result.reward, result.done) == (obs, 0.0, False)
        assert env.position == (0, 0)
    else:
        assert " ".join(text.strip(" \t\r\n\"'`*.,;:!").split()).lower() in ("left", "down", "right", "up")
