import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ragen.env as E
from ragen.env.sokoban import generate_room, parse_room, solve

CORRIDOR = """
#######
#P_X_O#
#######
"""

# Box X must go right onto O; the box on the left already sits on a target (√).
TWO_BOXES = """
########
#_√P_XO#
########
"""


def _env_with(text, **config):
    env = E.make("sokoban", **config)
    env.reset(0)
    env.room = parse_room(text)
    return env


def test_parse_and_render_round_trip():
    for text in (CORRIDOR, TWO_BOXES):
        assert parse_room(text).render() == text.strip("\n")
    for seed in range(20):
        room = generate_room(random.Random(seed))
        assert parse_room(room.render()) == room
    with pytest.raises(ValueError, match="unknown sokoban symbol"):
        parse_room("#Q#")


def test_solver_on_hand_made_rooms():
    assert solve(parse_room(CORRIDOR)) == ["Right", "Right", "Right"]
    assert solve(parse_room(TWO_BOXES)) == ["Right", "Right"]
    cornered = "#####\n#X_O#\n#_P_#\n#####"  # box stuck in a corner, off target
    assert solve(parse_room(cornered)) is None
    assert solve(parse_room("####\n#P√#\n####")) == []


def test_hand_checked_rewards_and_rendering():
    env = _env_with(TWO_BOXES)
    r = env.step("Left")  # pushes the box off its target: -0.1 - 1
    assert r.reward == pytest.approx(-1.1)
    assert r.observation == "########\n#XS__XO#\n########"
    assert r.info == {"action_is_valid": True, "action_is_effective": True, "success": False, "boxes_on_target": 0}
    r = env.step("Left")  # box against the wall: blocked, still costs a step
    assert r.reward == pytest.approx(-0.1) and r.info["action_is_effective"] is False
    assert r.observation == "########\n#XS__XO#\n########"
    r = env.step("Right")  # plain move
    assert r.reward == pytest.approx(-0.1) and r.info["action_is_effective"] is True
    assert r.observation == "########\n#XOP_XO#\n########"


def test_solving_push_earns_step_cost_plus_box_plus_bonus():
    env = _env_with(TWO_BOXES)
    r1 = env.step("Right")
    assert r1.reward == pytest.approx(-0.1) and not r1.done
    r2 = env.step("Right")
    assert r2.reward == pytest.approx(-0.1 + 1.0 + 10.0)
    assert r2.done and r2.info["success"] is True
    assert r2.observation == "########\n#_√__P√#\n########"
    after = env.step("Left")
    assert (after.reward, after.done, after.info["action_is_valid"], after.info["success"]) == (0.0, True, False, True)


@pytest.mark.parametrize(
    ("config", "seeds"),
    [({}, range(60)), ({"dim_room": [7, 7], "num_boxes": 2, "search_depth": 50}, range(15))],
)
def test_generated_rooms_are_solved_by_bfs_solution(config, seeds):
    env = E.make("sokoban", **config)
    num_boxes = config.get("num_boxes", 1)
    for seed in seeds:
        env.reset(seed)
        start = env.room
        assert len(start.boxes) == num_boxes == len(start.targets)
        assert not start.solved
        plan = solve(start)
        assert plan is not None and len(plan) >= 2, f"seed {seed}: room must be solvable and not trivial"
        total = 0.0
        for i, action in enumerate(plan):
            result = env.step(action)
            total += result.reward
            assert result.done == (i == len(plan) - 1)
        assert result.info["success"] is True
        expected = -0.1 * len(plan) + (num_boxes - start.boxes_on_target) + 10.0
        assert total == pytest.approx(expected)


def test_determinism_and_variety_over_seeds():
    env = E.make("sokoban")
    actions = ["Up", "Left", "Down", "Down", "Right", "Right", "Up", "Left"]

    def run(seed):
        trace = [env.reset(seed)]
        for action in actions:
            r = env.step(action)
            trace.append((r.observation, r.reward, r.done))
        return trace

    traces = [run(seed) for seed in range(20)]
    assert traces == [run(seed) for seed in range(20)]
    assert len({t[0] for t in traces}) >= 15


def test_invalid_actions_change_nothing_and_do_not_count_as_steps():
    env = _env_with(CORRIDOR, max_steps=2)
    before = env.room
    for garbage in ("jump", "", "Up || Left", "upp", None, 3):
        r = env.step(garbage)
        assert (r.reward, r.done, r.info["action_is_valid"], r.info["action_is_effective"]) == (
            0.0,
            False,
            False,
            False,
        )
        assert env.room == before
    assert not env.step(" RIGHT. ").done
    last = env.step("right")
    assert last.done and last.info["success"] is False  # max_steps=2 valid actions


def test_generator_reports_impossible_configs():
    with pytest.raises(ValueError, match="num_boxes=3"):
        generate_room(random.Random(0), (4, 4), num_boxes=3, search_depth=10)


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_garbage_never_raises(text):
    env = E.make("sokoban")
    env.reset(11)
    start = env.room
    result = env.step(text)
    if not result.info["action_is_valid"]:
        assert env.room == start and result.reward == 0.0
