"""search_qa: parsing, hand-computed step/outcome rewards, tool errors, budget, loaders, garbage."""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ragen.env as E
from ragen.env.search_qa import contains_alias, exact_match, load_corpus, load_qa, normalize_answer, parse_action
from ragen.env.search_qa.actions import tags_balanced


def search(query: str) -> str:
    return "<tool>" + json.dumps({"name": "search", "args": {"query": query}}) + "</tool>"


@pytest.fixture
def env():
    return E.make("search_qa")


def seed_of(env, qid: str) -> int:
    return next(i for i, item in enumerate(env.items) if item.qid == qid)


def test_config_file_and_registry(check_env_config_file):
    cfg = check_env_config_file("search_qa")
    env = E.make("search_qa", **cfg["config"])
    assert len(env.items) == 50 and len(env.passages) == 200


def test_normalisation_and_matching():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert normalize_answer("A Tale of Two Cities") == "tale of two cities"
    assert exact_match("the Islamabad.", ["Islamabad"]) and not exact_match("Islamabad city", ["Islamabad"])
    assert contains_alias("It is Islamabad, I think", ["Islamabad"])
    assert not contains_alias("Islamabadi food", ["Islamabad"])  # whole words only
    assert not contains_alias("anything", ["the"])  # alias normalising to "" never matches


@pytest.mark.parametrize(
    "text, kind, calls, answer, well_formed",
    [
        ('<tool>{"name": "search"}</tool>', "tool", ('{"name": "search"}',), "", False),
        ("<tool>a</tool> <tool>b</tool>", "tool", ("a", "b"), "", False),
        ('<tool>{"name": "search"', "tool", (None,), "", False),
        ("<answer> Paris </answer>", "answer", (), "Paris", True),
        ("<answer>a</answer><answer>b</answer>", "answer", (), "b", False),
        ("<answer>Paris", "answer", (), "Paris", False),
        ("<answer></answer>", "answer", (), "", False),
        ('{"name": "search", "args": {"query": "x"}}', "tool", ('{"name": "search", "args": {"query": "x"}}',), "",
         False),
        ("Paris", "answer", (), "Paris", True),
        ("Paris</answer>", "answer", (), "Paris</answer>", False),
        ("   ", "invalid", (), "", False),
    ],
)
def test_parse_action(text, kind, calls, answer, well_formed):
    parsed = parse_action(text)
    assert (parsed.kind, parsed.tool_calls, parsed.answer, parsed.answer_well_formed) == (
        kind, calls, answer, well_formed,
    )


def test_tags_balanced():
    tags = ("tool", "answer")
    assert tags_balanced("<tool>x</tool> then <answer>y</answer>", tags)
    assert tags_balanced("no tags at all", tags)
    assert not tags_balanced("<tool><answer>y</answer></tool>", tags)  # nesting
    assert not tags_balanced("x</tool>", tags) and not tags_balanced("<answer>x", tags)
    assert parse_action("Paris", bare_text_is_answer=False).kind == "invalid"


def test_scripted_successful_episode(env):
    obs = env.reset(seed_of(env, "q000"))
    assert obs == "Question: What is the capital of Pakistan?"
    r1 = env.step(search("capital of Pakistan"))
    assert r1.observation.startswith("<result>\nDoc 1 (Title: Pakistan) Pakistan is a country in Asia.")
    assert r1.observation.count("Doc ") == 3 and r1.observation.endswith("</result>")
    # step: 0.2 * 1/1 successful calls + 0.5 (alias "Islamabad" in the first passage)
    assert (r1.info["step_reward"], r1.info["outcome_reward"], r1.reward, r1.done) == (0.7, 0.0, 0.7, False)
    r2 = env.step("<answer>Islamabad</answer>")
    # outcome: exact match 1.0 + format 0.2 + xml 0.2
    assert (r2.info["step_reward"], r2.info["outcome_reward"], r2.done, r2.info["success"]) == (0.0, 1.4, True, True)
    assert r2.reward == pytest.approx(1.4)
    assert not env.step("<answer>again</answer>").info["action_is_valid"]


def test_scripted_failing_episode(env):
    env.reset(seed_of(env, "q000"))
    r1 = env.step(search("second highest mountain K2"))
    assert "(Title: K2)" in r1.observation.split("\n")[1]  # first passage lacks "Islamabad"
    assert r1.info["step_reward"] == pytest.approx(0.2) and not r1.info["answer_in_first_result"]
    r2 = env.step("<answer>Lahore</answer>")
    assert r2.info["outcome_reward"] == pytest.approx(0.4) and not r2.info["success"]  # format + xml only


@pytest.mark.parametrize(
    "answer, outcome",
    [
        ("<answer>The Islamabad.</answer>", 1.4),  # exact after normalisation
        ("<answer>the city of Islamabad</answer>", 0.9),  # contains 0.5 (max, not sum with exact)
        ("Islamabad", 1.4),  # bare text: proxy already extracted it from the answer tags
        ("<answer>Islamabad", 1.0 + 0.0 + 0.0),  # unclosed: no format, tags unbalanced
        ("<answer>x</answer><answer>Islamabad</answer>", 1.0 + 0.0 + 0.2),  # two blocks: not well-formed
    ],
)
def test_answer_rewards(env, answer, outcome):
    env.reset(seed_of(env, "q000"))
    result = env.step(answer)
    assert result.done and result.info["outcome_reward"] == pytest.approx(outcome)
    assert result.reward == pytest.approx(outcome)


def test_tool_errors_are_results_not_exceptions():
    cases = [
        ("<tool>{not json}</tool>", "Error: invalid JSON"),
        ('<tool>{"name": "calculator", "args": {}}</tool>', "Error: unknown tool 'calculator'"),
        ('<tool>{"name": "search", "args": {}}</tool>', 'Error: missing argument "query"'),
    ]
    env = E.make("search_qa", max_tool_calls=5)
    env.reset(0)
    for action, message in cases:
        result = env.step(action)
        assert result.observation.startswith(f"<result>{message}") and result.observation.endswith("</result>")
        assert result.info["action_is_valid"] and not result.info["action_is_effective"]
        assert result.info["step_reward"] == 0.0 and not result.done
    assert result.info["tool_calls_left"] == 2  # errors count toward the budget


def test_tool_result_flag_marks_turns_whose_search_ran(env):
    """``tool_result`` is set by what the turn did, not by its step reward: a search whose first passage misses the
    answer still returns a result; a turn of failed calls, an answer and an invalid action return none."""
    env.reset(seed_of(env, "q000"))
    failed = env.step('<tool>{"name": "nope"}</tool>')
    assert failed.info["tool_result"] is False and failed.info["step_reward"] == 0.0
    env.reset(seed_of(env, "q000"))
    found = env.step(search("capital of Pakistan"))
    assert found.info["tool_result"] is True and found.info["step_reward"] == pytest.approx(0.7)
    answer = env.step("<answer>Islamabad</answer>")
    assert answer.info["tool_result"] is False
    env.reset(seed_of(env, "q000"))
    missed = env.step(search("second highest mountain K2"))
    assert missed.info["tool_result"] is True and not missed.info["answer_in_first_result"]
    mixed = env.step(search("capital of Pakistan") + '<tool>{"name": "nope"}</tool>')  # one of two calls runs
    assert mixed.info["tool_result"] is True
    strict = E.make("search_qa", bare_text_is_answer=False)
    strict.reset(0)
    assert strict.step("no tags").info["tool_result"] is False  # invalid


def test_mixed_calls_in_one_turn(env):
    env.reset(seed_of(env, "q000"))
    result = env.step(search("capital of Pakistan") + '<tool>{"name": "nope"}</tool>')
    assert result.observation.count("<result>") == 2
    assert result.info["step_reward"] == pytest.approx(0.2 * 1 / 2 + 0.5)
    assert result.done  # both calls of the budget of 2 used
    assert result.info["outcome_reward"] == pytest.approx(0.2)  # no answer: xml score only
    assert result.reward == pytest.approx(0.1 + 0.5 + 0.2)


def test_max_tool_calls_ends_episode(env):
    env.reset(seed_of(env, "q000"))
    assert not env.step(search("Pakistan")).done
    result = env.step('{"name": "search", "args": {"query": "Asia"}}')  # bare JSON is a tool call
    assert result.done and not result.info["success"] and "episode is over" in result.observation
    env = E.make("search_qa", max_tool_calls=1)
    env.reset(0)
    result = env.step(search("a b") + search("Paris"))
    assert "budget of 1 exhausted" in result.observation and result.done
    assert env.calls_used == 1


def test_xml_score_tracks_the_whole_episode(env):
    env.reset(seed_of(env, "q000"))
    env.step(search("capital of Pakistan") + "</answer>")  # stray closing tag
    result = env.step("<answer>Islamabad</answer>")
    assert result.info["outcome_reward"] == pytest.approx(1.0 + 0.2)


def test_custom_tags_and_invalid_bare_text():
    env = E.make("search_qa", tool_tag="search", answer_tag="final", bare_text_is_answer=False)
    env.reset(0)
    invalid = env.step("just text")
    assert not invalid.info["action_is_valid"] and not invalid.done and invalid.reward == 0.0
    assert "<search>" in env.instructions and "<final>" in env.instructions
    result = env.step('<search>{"name": "search", "args": {"query": "capital"}}</search>')
    assert result.info["action_is_effective"]
    assert env.step(f"<final>{env.item.answers[0]}</final>").info["outcome_reward"] == pytest.approx(1.4)


def test_determinism_per_seed():
    def run():
        env = E.make("search_qa")
        trace = [env.reset(11)]
        for action in (search(env.item.question), "<tool>bad</tool>"):
            r = env.step(action)
            trace.append((r.observation, r.reward, r.done))
        return trace

    assert run() == run()
    assert E.make("search_qa").reset(1) != E.make("search_qa").reset(2)


def test_loaders(tmp_path):
    trivia = {"Data": [{"Question": "Who wrote Dracula?", "QuestionId": "tq1",
                        "Answer": {"Value": "Bram Stoker", "Aliases": ["Stoker", "Bram Stoker"],
                                   "NormalizedAliases": ["bram stoker", "stoker"]}}]}
    (tmp_path / "tq.json").write_text(json.dumps(trivia))
    (item,) = load_qa(tmp_path / "tq.json")
    assert (item.qid, item.answers) == ("tq1", ("Bram Stoker", "Stoker", "bram stoker", "stoker"))
    lines = [{"question": "Q1?", "answer": "A"}, {"question": "Q2?", "golden_answers": ["B", "b2"]},
             {"question": "Q3?", "answers": []}]
    (tmp_path / "qa.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    assert [(i.question, i.answers) for i in load_qa(tmp_path / "qa.jsonl")] == [("Q1?", ("A",)),
                                                                                ("Q2?", ("B", "b2"))]
    corpus = [{"id": "d1", "title": "T", "text": "body"}, {"id": "d2", "contents": '"Title 2"\nsecond body'}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(x) for x in corpus))
    assert [(p.pid, p.title, p.text) for p in load_corpus(tmp_path / "c.jsonl")] == [
        ("d1", "T", "body"), ("d2", "Title 2", "second body")]
    env = E.make("search_qa", qa_path=str(tmp_path / "tq.json"), corpus_path=str(tmp_path / "c.jsonl"), top_k=1)
    env.reset(0)
    assert env.step("Stoker").info["success"]
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_qa(tmp_path / "nope.jsonl")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.text(max_size=40),
    st.builds(lambda s: f"<tool>{s}</tool>", st.text(max_size=30)),
    st.builds(lambda s: f"<answer>{s}", st.text(max_size=10)),
    st.builds(lambda q: search(q), st.text(max_size=20)),
), max_size=5))
def test_garbage_never_raises(env, actions):
    env.reset(3)
    for action in actions:
        calls_before = env.calls_used
        result = env.step(action)
        info = result.info
        assert result.reward == pytest.approx(info["step_reward"] + info["outcome_reward"])
        assert 0.0 <= info["step_reward"] <= 0.7 and 0.0 <= info["outcome_reward"] <= 1.4
        if not info["action_is_valid"]:
            assert result.reward == 0.0 and env.calls_used == calls_before
        if result.done:
            break
