"""The liveness table's ``env.config`` rows: each env's constructor keywords, walked under that env (``env=<name>``,
two turns) with the ``expert`` probe (the env's expert, noise 0.5, plays the train rollout through the agent proxy;
``text_adventure`` has no expert and is played by the scripted engine) or the scripted ``rollout`` probe."""

from __future__ import annotations

import importlib.util

from liveness_model import Quantity, Table, changes, rejected, same

OBS = Quantity("expert", ("prompt_tokens",), "observations in the prompts")
REWARDS = Quantity("expert", ("token_rewards",), "rewards")
EPISODES = Quantity("expert", ("prompt_tokens", "sampled_tokens", "token_rewards"),
                    "episodes: observations, expert answers, rewards")
PROGRAM_OBS = Quantity("rollout", ("prompt_tokens",), "prompts of the program's calls")
PROGRAM_EPISODES = Quantity("rollout", ("prompt_tokens", "sampled_tokens", "token_rewards"),
                            "episodes: the program's prompts, trained samples, rewards")
SCRIPTED_REWARDS = Quantity("rollout", ("token_rewards",), "rewards of scripted answers")
LLM_EPISODES = Quantity("expert", ("prompt_tokens", "sampled_tokens", "token_rewards"),
                        "episodes: observations, expert answers, rewards", slow=True)
LLM_SCRIPTED = Quantity("rollout", ("prompt_tokens", "sampled_tokens", "token_rewards"),
                        "episodes: observations, scripted questions, rewards", slow=True)
LLM_ONLY = "read only by the llm oracle: the env refuses it with oracle=scripted"
# The llm oracle answers with the default model (135M) on CPU: two two-turn episodes keep guess_my_city's long answers
# few (the first turn's answer is the second turn's observation); twenty_questions' yes / no answers need the eight
# episodes of the env's context, and a question the oracle answers with a preamble, to show a shorter budget.
LLM_FEW = ("rollout.n_groups=1", "rollout.group_size=2", "actor.mini_batch_size=2", "critic.mini_batch_size=2")
NOT_SHOWN = ("not demonstrated: live only where a bought product's catalog nouns and its title's extracted nouns "
             "disagree; the probe's purchases on the shipped catalog never hit such a product")


def _has_spacy() -> str | None:
    return "spaCy is installed here: noun_extractor auto resolves to it" if importlib.util.find_spec("spacy") else None


def env_context(env: str) -> tuple[str, ...]:
    """The context ``env``'s keys are walked in: the env's group, two turns, room for the expert's answers (and a
    game file name for text_adventure, whose fake game the probes pass as ``game_factory``)."""
    game = ("env.config.game_path=game.z5",) if env == "text_adventure" else ()
    program = ("env.config.entry=ragen.gateway.examples.calculator:run",) if env == "agent_program" else ()
    return (f"env={env}", "env.max_turn=2", "agent.max_new_tokens=128", *game, *program)


def _ctx(env: str, *extra: str) -> tuple[str, ...]:
    return (*env_context(env), *extra)


def add_env_rows(t: Table) -> None:
    def row(env: str, key: str, *cases, note: str = "") -> None:
        t.add(f"env.config.{key}", *cases, env=env, note=note)

    def allow(env: str, key: str, reason: str) -> None:
        t.allow(f"env.config.{key}", reason, env=env)

    c = _ctx("agent_program")  # the calculator example against the scripted engine (no answer is a number)
    row("agent_program", "entry", changes(PROGRAM_EPISODES, "ragen.gateway.examples.calculator:make_task", when=c),
        rejected("no_such_module:run", "ragen.gateway.examples.calculator:nothing", when=c),
        note="make_task is no program (it takes a seed only): every episode fails")
    row("agent_program", "tasks", changes(PROGRAM_OBS, [{"question": "What is 2 + 2?", "answer": 4}], when=c),
        rejected([], when=c))
    row("agent_program", "tasks_entry", rejected("no_such_module:tasks", when=c),
        note="live as tasks is: the task of each seed (tests/agent/test_program_rollout.py)")
    row("agent_program", "timeout_s", rejected(0, when=c))
    row("agent_program", "tool_parser", rejected("xml", when=c),
        note="hermes | none: how tool calls are read (tests/gateway/test_toolcalls.py)")
    row("agent_program", "model", changes(PROGRAM_OBS, "another", when=c),
        note="the example's requests name ragen: another name answers each with a 400 and fails the episode")
    row("agent_program", "format_penalty", rejected(0.5, when=c),
        note="live: the reward of each call that was a malformed tool call (tests/agent/test_program_rewards.py)")
    row("agent_program", "expert", rejected("no_such_module:expert", when=c),
        note="live with trainer.sft_warmup_steps >= 1: the warm start's demonstrations "
             "(tests/trainer/test_agent_program_run.py); without a warm start unread, as an env's expert_action is")

    c = _ctx("bandit")
    row("bandit", "low_arm", changes(EPISODES, "tiger", when=c))
    row("bandit", "high_arm", changes(OBS, "tiger", when=c))
    for key, value in (("low_payout", 0.5), ("high_payout", 2.0), ("high_prob", 0.9)):
        row("bandit", key, changes(REWARDS, value, when=c))

    c = _ctx("countdown")
    for key, value in (("num_numbers", 3), ("min_number", 5), ("max_number", 20)):
        row("countdown", key, changes(OBS, value, when=c))
    row("countdown", "max_target", changes(OBS, 200, when=(*c, "rollout.n_groups=8")), rejected(100, when=c))

    c = _ctx("delayed_choice")
    row("delayed_choice", "doors", changes(OBS, ["right", "blue"], when=c), rejected(["red", "blue"], when=c,
                                                                                    match="good_door"))
    row("delayed_choice", "good_door", changes(REWARDS, "left", when=c))
    row("delayed_choice", "chests", changes(OBS, ["ruby", "jade"], when=c))
    row("delayed_choice", "num_turns", changes(REWARDS, 3, when=c))
    row("delayed_choice", "payout", changes(REWARDS, 2.0, when=c))

    c = _ctx("frozen_lake")
    for key, value in (("size", 3), ("p", 0.5), ("is_slippery", True), ("max_steps", 1)):
        row("frozen_lake", key, changes(EPISODES, value, when=c))

    # the experts ask questions the llm oracle answers "Yes" / "No" in its first word, whatever its budget:
    # twenty_questions' budget shows on the scripted questions (liveness_probes.ACTIONS)
    for env, tokens, few, llm_q in (("guess_my_city", 8, LLM_FEW, LLM_EPISODES),
                                    ("twenty_questions", 4, (), LLM_SCRIPTED)):
        c = _ctx(env)
        few = (*c, *few)
        row(env, "oracle", changes(LLM_EPISODES, "llm", when=few))
        row(env, "oracle_model", rejected("another-model", when=c, match="only oracle='llm' reads it"),
            note="another model for the llm oracle: not walked (one model is available offline)")
        row(env, "oracle_max_new_tokens", changes(llm_q, tokens, when=(*few, "env.config.oracle=llm")),
            rejected(tokens, when=c, match="only oracle='llm' reads it"))
        row(env, "max_turns", changes(EPISODES, 1, when=c))
    row("guess_my_city", "min_population", changes(EPISODES, 1000000, when=_ctx("guess_my_city")))
    row("twenty_questions", "objects_path", changes(EPISODES, "small", when=_ctx("twenty_questions")),
        same(EPISODES, "full", when=_ctx("twenty_questions")))
    row("twenty_questions", "secret_order", changes(EPISODES, "cycle", when=_ctx("twenty_questions")),
        rejected("balanced", when=_ctx("twenty_questions"), match="secret_order"))

    c = _ctx("search_qa")
    for key in ("qa_path", "corpus_path", "index_path"):
        allow("search_qa", key, "path: the questions / passages / BM25 index to load")
    for key, value, q in (("top_k", 1, OBS), ("max_tool_calls", 0, EPISODES), ("max_passage_chars", 50, OBS),
                          ("tool_tag", "search", EPISODES), ("answer_tag", "final", EPISODES),
                          ("result_tag", "info", OBS), ("bare_text_is_answer", False, EPISODES)):
        row("search_qa", key, changes(q, value, when=c))
    row("search_qa", "think_tag", changes(SCRIPTED_REWARDS, "think", when=(*c, "agent.think_tag=reason")))
    for key, value in (("tool_score", 0.5), ("retrieval_score", 0.1), ("contains_score", 2.0), ("exact_score", 0.5),
                       ("format_score", 0.5), ("xml_score", 0.5)):
        row("search_qa", key, changes(REWARDS, value, when=c))

    c = _ctx("sokoban")
    for key, value in (("dim_room", [7, 7]), ("num_boxes", 2), ("search_depth", 5), ("max_steps", 1)):
        row("sokoban", key, changes(EPISODES, value, when=c))

    c = _ctx("static_qa")
    allow("static_qa", "data_path", "path: the questions to load")
    row("static_qa", "question_key", changes(EPISODES, "answer", when=c))
    row("static_qa", "answer_key", changes(EPISODES, "question", when=c))
    row("static_qa", "answer_format", changes(EPISODES, "plain", when=c), same(EPISODES, "gsm8k", when=c),
        rejected("boxed", when=c, match="no boxed answer"))
    row("static_qa", "max_attempts", changes(EPISODES, 2, when=c))

    c = _ctx("text_adventure")
    allow("text_adventure", "game_path", "path: the Z-machine game file")
    allow("text_adventure", "game_factory", "Python-only: a callable that opens the game (tests pass a fake game)")
    row("text_adventure", "max_steps", changes(EPISODES, 1, when=c))
    row("text_adventure", "max_valid_actions", changes(EPISODES, 1, when=c))

    c = _ctx("webshop")
    for key in ("data_dir", "products_file", "attributes_file", "goals_file"):
        allow("webshop", key, "path: the catalog files to load")
    row("webshop", "split", changes(EPISODES, "val", "test", "all", when=c))
    for key, value in (("test_size", 5), ("val_size", 5), ("shuffle_seed", 1), ("show_actions", False)):
        row("webshop", key, changes(EPISODES, value, when=c))
    row("webshop", "noun_extractor", same(EPISODES, "heuristic", when=c, skip=_has_spacy),
        rejected("spacy", when=c, skip=_has_spacy, match="needs spaCy"))
    row("webshop", "spacy_model", rejected("en_core_web_md", when=c, skip=_has_spacy, match="spacy_model"))
    row("webshop", "use_precomputed_nouns", changes(EPISODES, False, when=(*c, "env.max_turn=10"), xfail=NOT_SHOWN))
