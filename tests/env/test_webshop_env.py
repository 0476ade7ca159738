"""WebShop env on the shipped catalog: page grammar, navigation, scripted episodes, determinism, garbage."""

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragen.env as E
from ragen.env.webshop.pages import ProductSearch
from ragen.env.webshop.scoring import purchase_score


@pytest.fixture
def env():
    return E.make("webshop", show_actions=False)


def open_goal_item(env):
    """Search the goal's query and page until the goal ASIN is clickable; click it."""
    goal = env.goal
    env.step(f"search[{goal.query}]")
    while goal.asin.lower() not in env.legal_actions():
        result = env.step("click[next >]")
        assert result.info["action_is_valid"], "goal product not among the search hits"
    return env.step(f"click[{goal.asin.lower()}]")


def test_registry_and_config_file(check_env_config_file):
    cfg = check_env_config_file("webshop")
    env = E.make("webshop", **cfg["config"])
    assert len(env.goals) == 60  # 100 shipped goals - 20 test - 20 val
    assert len(E.make("webshop", split="test").goals) == 20


def test_search_page_grammar(env):
    obs = env.reset(3)
    assert obs == f"WebShop [SEP] Instruction: [SEP] {env.goal.instruction_text} [SEP] Search"
    assert env.legal_actions() == "search[<keywords>]"
    assert re.search(r"price lower than \d+\.\d\d dollars$", env.goal.instruction_text)


def test_results_pages_and_pagination(env):
    env.reset(0)
    result = env.step("search[free]")  # matches many products
    hits = env.search_engine.search("free")
    assert len(hits) > 10 and result.info["action_is_effective"]
    parts = result.observation.split(" [SEP] ")
    assert parts[:5] == ["Instruction:", env.goal.instruction_text, "Back to Search",
                         f"Page 1 (Total results: {len(hits)})", "Next >"]
    product = env.catalog.products[hits[0]]
    assert parts[5:8] == [hits[0], product.title, f"${product.price:.2f}"]
    assert len(parts) == 5 + 3 * 10
    page1 = result.observation
    page2 = env.step("click[next >]").observation
    assert "Page 2 (Total results" in page2 and " [SEP] < Prev [SEP] " in page2 and hits[10] in page2
    assert env.step("click[< prev]").observation == page1
    assert not env.step("search[tea]").info["action_is_valid"]  # search only on the search page
    assert env.step("click[back to search]").observation.startswith("WebShop [SEP] ")


def test_item_and_detail_pages(env):
    env.reset(0)
    item = open_goal_item(env).observation
    product = env.catalog.products[env.goal.asin]
    options = [x for name, values in product.options.items() for x in [name, *values]]
    expected = ["Instruction:", env.goal.instruction_text, "Back to Search", "< Prev", *options, product.title,
                f"Price: ${product.price:.2f}", f"Rating: {product.rating}", "Description", "Features", "Reviews",
                "Buy Now"]
    assert item == " [SEP] ".join(expected)
    desc = env.step("click[description]").observation
    assert desc.endswith(f"< Prev [SEP] {product.description}")
    assert env.step("click[< prev]").observation == item
    assert env.step("click[< prev]").observation.split(" [SEP] ")[3].startswith("Page 1")


def test_scripted_successful_episode(env):
    for seed in range(len(env.goals)):
        env.reset(seed)
        open_goal_item(env)
        for value in env.goal.goal_options:
            result = env.step(f"click[{value}]")
            assert result.info["action_is_valid"] and result.reward == 0.0 and not result.done
        result = env.step("click[buy now]")
        assert result.done and result.reward == 1.0 and result.info["success"]
        assert result.info["purchase"]["r_type"] == 1.0


def test_failing_episode_scores_by_definition(env):
    env.reset(5)
    goal = env.goal
    other = next(p for p in env.catalog.products.values() if p.category != goal.category)
    env.step(f"search[{other.title}]")
    assert other.asin.lower() in env.legal_actions()
    env.step(f"click[{other.asin.lower()}]")
    result = env.step("click[buy now]")
    expected = purchase_score(other, goal, other.price, [])
    assert result.done and not result.info["success"]
    assert result.reward == pytest.approx(expected.total) and result.reward < 1.0
    after = env.step("click[buy now]")
    assert after.done and not after.info["action_is_valid"] and after.reward == 0.0


def test_wrong_option_is_penalised(env):
    seed = next(i for i, g in enumerate(env.goals) if g.goal_options)
    env.reset(seed)
    open_goal_item(env)
    product = env.catalog.products[env.goal.asin]
    name, values = next((n, v) for n, v in product.options.items() if set(v) & set(env.goal.goal_options))
    wrong = next(v for v in values if v not in env.goal.goal_options)
    assert not env.step(f"click[{wrong}]").done
    result = env.step("click[buy now]")
    n = len(env.goal.attributes) + len(env.goal.goal_options) + 1
    assert result.reward == pytest.approx((n - len(env.goal.goal_options)) / n)


def test_option_click_effectiveness(env):
    seed = next(i for i, g in enumerate(env.goals) if g.goal_options)
    env.reset(seed)
    open_goal_item(env)
    value = env.goal.goal_options[0]
    assert env.step(f"click[{value}]").info["action_is_effective"]
    again = env.step(f"CLICK[ {value.upper()} ]")
    assert again.info["action_is_valid"] and not again.info["action_is_effective"]


def test_determinism_per_seed():
    actions = ["search[organic green tea]", "click[next >]", "click[b0zzzzzzzz]", "click[back to search]",
               "search[wireless earbuds noise cancelling]"]
    runs = []
    for _ in range(2):
        env = E.make("webshop")
        trace = [env.reset(7)]
        result = env.step(actions[0])
        trace.append(result.observation)
        first_asin = re.search(r"click\[(b0[a-z0-9]{8})\]", result.observation).group(1)
        for action in actions[1:] + [f"click[{first_asin}]", "click[buy now]"]:
            r = env.step(action)
            trace.append((r.observation, r.reward, r.done, r.info["action_is_valid"]))
        runs.append(trace)
    assert runs[0] == runs[1]
    assert E.make("webshop").reset(7) != E.make("webshop").reset(8)


def test_search_engine_ranks_title_words():
    env = E.make("webshop")
    engine = ProductSearch(list(env.catalog.products.values()))
    top = env.catalog.products[engine.search("merino wool socks")[0]]
    assert "Socks" in top.title
    assert engine.search("") == [] and engine.search("the of and") == []


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.text(max_size=30),
    st.builds(lambda s: f"search[{s}]", st.text(max_size=20)),
    st.builds(lambda s: f"click[{s}]", st.sampled_from(["next >", "< prev", "buy now", "back to search", "", "]"])),
), max_size=8))
def test_garbage_actions_never_raise(env, actions):
    env.reset(1)
    for action in actions:
        before = env.state.copy()
        result = env.step(action)
        assert set(result.info) >= {"action_is_valid", "action_is_effective", "success"}
        assert 0.0 <= result.reward <= 1.0
        if not result.info["action_is_valid"]:
            assert env.state == before and result.reward == 0.0
        if result.done:
            break
    assert env.step(None).info["action_is_valid"] is False
