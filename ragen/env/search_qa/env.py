"""search_qa: answer a question with a BM25 search tool; turn-level (step) and outcome rewards.

Each step is a tool turn or the final answer (``actions.py`` says how an action string is classified).

Tool turn: each call is JSON ``{"name": "search", "args": {"query": "..."}}``; the env replies one
``<result>...</result>`` per call with the top-k passages (``Doc i (Title: t) text``), or
``<result>Error: ...</result>`` for bad JSON, an unknown tool, a missing query, or a call beyond the
budget. Every call counts toward ``max_tool_calls``; when the budget is used up the episode ends.
    step_reward    = tool_score * successful_calls / attempted_calls   (this turn's calls)
                   + retrieval_score  if the first passage of some successful search of this turn contains
                                      a gold alias (normalised, whole words), counted once per turn
    outcome_reward = 0, or when the budget ends the episode: xml_score if all tags so far were balanced

Answer turn (ends the episode):
    step_reward    = 0
    outcome_reward = max(contains_score if the answer contains an alias, exact_score if it matches one
                         exactly after SQuAD normalisation, 0)
                   + format_score if the answer was well-formed inside the answer tags
                   + xml_score    if every tool/answer(/think) tag in all the episode's actions was balanced

StepResult.reward = step_reward + outcome_reward; both parts are in ``info`` (``step_reward``,
``outcome_reward``) for estimators with turn-level credit (ms_grpo / ms_po), with ``tool_result``: at least one
search call of this turn ran and returned its passages (a turn whose calls all failed with ``Error: ...`` has none;
answer and invalid turns have none). success = exact match.
Defaults: tool 0.2, retrieval 0.5, contains 0.5, exact 1.0, format 0.2, xml 0.2.
Invalid actions (empty text; bare text when ``bare_text_is_answer`` is false; anything after the end)
change nothing and score 0.

Expert (``expert_action``): search, then answer. While no search of the episode has retrieved a gold passage (one
containing a gold alias: the retrieval reward's test) and a call would leave budget for the answer, it searches
with the first of these queries whose top passage, by the env's own BM25 index, is a gold one: the question, the
question plus the answer, the title of a gold passage plus the answer (``expert_query``); then it answers with
the first gold alias. The search is the bare JSON call (no tags needed); the answer is bare text, or wrapped in
the answer tag when ``bare_text_is_answer`` is false.
"""

from __future__ import annotations

import functools
import json

from ragen.env.base import StepResult, register
from ragen.env.bm25 import BM25Index
from ragen.env.bm25_disk import DiskBM25Index
from ragen.env.search_qa.actions import contains_alias, exact_match, normalize_answer, parse_action, tags_balanced
from ragen.env.search_qa.data import SHIPPED_DIR, Passage, PassageStore, QAItem, load_corpus, load_qa

TOOL_NAME = "search"


@functools.lru_cache(maxsize=4)
def _load(qa_path: str, corpus_path: str) -> tuple[list[QAItem], list[Passage], BM25Index]:
    passages = load_corpus(corpus_path)
    index = BM25Index([f"{p.title} {p.text}" for p in passages])
    return load_qa(qa_path), passages, index


@functools.lru_cache(maxsize=4)
def _load_disk(qa_path: str, index_path: str) -> tuple[list[QAItem], PassageStore, DiskBM25Index]:
    """Questions, and passages + BM25 served memory-mapped from a disk index folder (env.config.index_path)."""
    index = DiskBM25Index(index_path, key="env.config.index_path")
    try:
        passages = PassageStore(index_path)
    except FileNotFoundError as err:
        raise ValueError(f"env.config.index_path={index_path!r} has no passage store ({err}); build the folder "
                         "with `python -m ragen_external.search.build`") from err
    if len(passages) != index.size:
        raise ValueError(f"env.config.index_path={index_path!r}: {len(passages)} passages but the index has "
                         f"{index.size} documents; rebuild the folder")
    return load_qa(qa_path), passages, index


def is_gold(passage: Passage, item: QAItem) -> bool:
    """The passage contains a gold alias of ``item`` (title and text, as the retrieval reward reads them)."""
    return contains_alias(f"{passage.title} {passage.text}", item.answers)


def gold_answer(item: QAItem) -> str:
    """The first gold alias that survives answer normalisation (so it is an exact match)."""
    return next((a for a in item.answers if normalize_answer(a)), item.answers[0])


@register("search_qa")
class SearchQAEnv:
    """Question answering with a search tool over a BM25-indexed corpus (the shipped small set by default).

    Args:
        qa_path: questions (JSONL/JSON, TriviaQA or {question, answers}); None = the shipped set.
        corpus_path: passages (JSONL id/title/text), indexed in memory; None = the shipped corpus.
        index_path: a disk BM25 index folder (``python -m ragen_external.search.build``) used instead of
            ``corpus_path`` for large corpora (memory-mapped); None = use ``corpus_path``. Setting both is an error.
        top_k: passages per search; max_passage_chars: passage text is cut to this length.
        max_tool_calls: tool-call budget per episode (the episode ends when it is used up).
        tool_tag / answer_tag / result_tag: tag names; think_tag: optional reasoning tag also checked
            for balance by the XML score (None = not checked).
        bare_text_is_answer: untagged, non-JSON text is the final answer (else it is invalid).
        tool_score, retrieval_score, contains_score, exact_score, format_score, xml_score: reward weights.
    """

    DEFAULT_MAX_TURN = 3  # the turn limits of the env config (ragen.env.default_config)
    DEFAULT_MAX_ACTIONS_PER_TURN = 1

    STEP_OUTCOME_SPLIT = True  # info carries step_reward / outcome_reward (MS-GRPO, MS-PO)

    def __init__(
        self,
        qa_path: str | None = None,
        corpus_path: str | None = None,
        index_path: str | None = None,
        top_k: int = 3,
        max_tool_calls: int = 2,
        max_passage_chars: int = 400,
        tool_tag: str = "tool",
        answer_tag: str = "answer",
        result_tag: str = "result",
        think_tag: str | None = None,
        bare_text_is_answer: bool = True,
        tool_score: float = 0.2,
        retrieval_score: float = 0.5,
        contains_score: float = 0.5,
        exact_score: float = 1.0,
        format_score: float = 0.2,
        xml_score: float = 0.2,
    ):
        if max_tool_calls < 0 or top_k < 1:
            raise ValueError(f"need max_tool_calls >= 0 and top_k >= 1, got {max_tool_calls} and {top_k}")
        qa = str(qa_path) if qa_path is not None else str(SHIPPED_DIR / "qa.jsonl")
        if index_path is not None:
            if corpus_path is not None:
                raise ValueError("search_qa: set env.config.index_path or env.config.corpus_path, not both "
                                 "(the index folder carries its own passages)")
            self.items, self.passages, self.index = _load_disk(qa, str(index_path))
        else:
            corpus = str(corpus_path) if corpus_path is not None else str(SHIPPED_DIR / "corpus.jsonl")
            self.items, self.passages, self.index = _load(qa, corpus)
        self.top_k, self.max_tool_calls, self.max_passage_chars = top_k, max_tool_calls, max_passage_chars
        self.tool_tag, self.answer_tag, self.result_tag = tool_tag, answer_tag, result_tag
        self.tags = tuple(t for t in (tool_tag, answer_tag, think_tag) if t)
        self.bare_text_is_answer = bare_text_is_answer
        self.weights = dict(tool=tool_score, retrieval=retrieval_score, contains=contains_score,
                            exact=exact_score, format=format_score, xml=xml_score)
        self.instructions = (
            "Answer the question. You may search a text corpus before answering. Each action is either\n"
            f'- a search: <{tool_tag}>{{"name": "search", "args": {{"query": "<keywords>"}}}}</{tool_tag}> '
            f"(the JSON alone also works); the reply is <{result_tag}>...</{result_tag}> with the top "
            f"{top_k} passages; at most {max_tool_calls} searches per question; or\n"
            f"- the final answer: <{answer_tag}>short answer</{answer_tag}>"
            + (" (plain text also counts as the final answer)" if bare_text_is_answer else "")
            + ". Answering ends the episode. Keep the answer short: just the name, number or phrase."
        )
        self.item: QAItem | None = None
        self.calls_used = 0
        self.tags_ok = True
        self.retrieved = False  # some search of this episode put a gold passage first
        self.done = False
        self._expert_queries: dict[tuple[str, str], str] = {}  # memo of expert_query (not episode state)

    def reset(self, seed: int) -> str:
        """Question ``seed % len(questions)``."""
        self.item = self.items[int(seed) % len(self.items)]
        self.calls_used, self.tags_ok, self.retrieved, self.done = 0, True, False, False
        return f"Question: {self.item.question}"

    def legal_actions(self) -> str:
        if self.done:
            return "(episode finished)"
        answer = f"<{self.answer_tag}>...</{self.answer_tag}>"
        if self.calls_used >= self.max_tool_calls:
            return answer
        tool = f'<{self.tool_tag}>{{"name": "search", "args": {{"query": "..."}}}}</{self.tool_tag}>'
        return f"{tool} ({self.max_tool_calls - self.calls_used} left), {answer}"

    def expert_action(self) -> str:
        """Search (a query that puts a gold passage first) until one did, if the budget allows; then the gold answer."""
        if self.item is None:
            raise RuntimeError("search_qa: call reset(seed) before expert_action()")
        if self.done:
            raise RuntimeError("search_qa: the episode is over; expert_action() needs an episode in progress "
                               "(call reset(seed) to start a new one)")
        if not self.retrieved and self.calls_used + 1 < self.max_tool_calls:
            return json.dumps({"name": TOOL_NAME, "args": {"query": self.expert_query()}})
        answer = gold_answer(self.item)
        return answer if self.bare_text_is_answer else f"<{self.answer_tag}>{answer}</{self.answer_tag}>"

    def expert_query(self) -> str:
        """The expert's search query for the current question (see the module docstring); the question itself when
        no candidate puts a gold passage first. Memoised per question (the index never changes)."""
        key = (self.item.qid, self.item.question)
        if key not in self._expert_queries:
            self._expert_queries[key] = self._find_query(self.item)
        return self._expert_queries[key]

    def _find_query(self, item: QAItem) -> str:
        answer = gold_answer(item)

        def candidates():
            yield item.question
            yield f"{item.question} {answer}"
            for passage in self.passages:  # only reached when the two queries above fail
                if is_gold(passage, item):
                    yield f"{passage.title} {answer}"

        for query in candidates():
            query = query.replace("||", " ")  # the agent proxy splits actions on "||"
            hits = self.index.search(query, 1)
            if hits and is_gold(self.passages[hits[0].index], item):
                return query
        return item.question.replace("||", " ")

    def step(self, action: str) -> StepResult:
        if self.item is None:
            raise RuntimeError("SearchQAEnv.step called before reset(seed)")
        if self.done:
            return self._invalid("the episode is over")
        parsed = parse_action(action, self.tool_tag, self.answer_tag, self.bare_text_is_answer, self.tags[2:])
        if parsed.kind == "invalid":
            return self._invalid(parsed.reason)
        self.tags_ok = self.tags_ok and tags_balanced(action, self.tags)
        if parsed.kind == "answer":
            return self._answer(parsed.answer, parsed.answer_well_formed)
        return self._tool_turn(parsed.tool_calls)

    # ----------------------------------------------------------------- turns
    def _answer(self, answer: str, well_formed: bool) -> StepResult:
        w = self.weights
        em = exact_match(answer, self.item.answers)
        contains = contains_alias(answer, self.item.answers)
        correctness = max(w["exact"] if em else 0.0, w["contains"] if contains else 0.0)
        outcome = correctness + (w["format"] if well_formed else 0.0) + (w["xml"] if self.tags_ok else 0.0)
        self.done = True
        info = self._info(True, True, em, 0.0, outcome, exact_match=em, answer=answer, format_ok=well_formed,
                          tool_result=False)
        return StepResult(f"Your answer: {answer}\nThe episode is over.", outcome, True, info)

    def _tool_turn(self, calls: tuple[str | None, ...]) -> StepResult:
        w = self.weights
        blocks, successes, retrieved = [], 0, False
        budget = self.max_tool_calls - self.calls_used
        for i, raw in enumerate(calls):
            if i >= budget:
                blocks.append(f"Error: tool-call budget of {self.max_tool_calls} exhausted")
                continue
            ok, text, first = self._run_call(raw)
            successes += ok
            retrieved = retrieved or (first is not None and contains_alias(first, self.item.answers))
            blocks.append(text)
        self.calls_used += min(len(calls), budget)
        self.retrieved = self.retrieved or retrieved
        step = w["tool"] * successes / len(calls) + (w["retrieval"] if retrieved else 0.0)
        self.done = self.calls_used >= self.max_tool_calls
        outcome = (w["xml"] if self.tags_ok else 0.0) if self.done else 0.0
        observation = "\n".join(f"<{self.result_tag}>{b}</{self.result_tag}>" for b in blocks)
        if self.done:
            observation += "\nNo searches left; the episode is over without an answer."
        info = self._info(True, successes > 0, False, step, outcome, tool_calls=len(calls), tool_successes=successes,
                          answer_in_first_result=retrieved, tool_result=successes > 0)
        return StepResult(observation, step + outcome, self.done, info)

    def _run_call(self, raw: str | None) -> tuple[bool, str, str | None]:
        """(succeeded, result text, first passage text or None) for one call's JSON; never raises."""
        if raw is None:
            return False, f"Error: unclosed <{self.tool_tag}> tag", None
        try:
            call = json.loads(raw)
        except ValueError as err:
            return False, f"Error: invalid JSON in tool call ({err.msg})", None
        if not isinstance(call, dict):
            return False, 'Error: a tool call must be a JSON object {"name": ..., "args": {...}}', None
        if call.get("name") != TOOL_NAME:
            return False, f"Error: unknown tool {call.get('name')!r}; available tools: {TOOL_NAME}", None
        args = call.get("args", call.get("arguments"))
        query = args.get("query") if isinstance(args, dict) else None
        if not isinstance(query, str) or not query.strip():
            return False, 'Error: missing argument "query" (a non-empty string) in "args"', None
        hits = self.index.search(query, self.top_k)
        if not hits:
            return True, "No results found.", ""
        docs = [self.passages[h.index] for h in hits]
        lines = [f"Doc {i + 1} (Title: {d.title}) {d.text[: self.max_passage_chars]}" for i, d in enumerate(docs)]
        return True, "\n" + "\n".join(lines) + "\n", f"{docs[0].title} {docs[0].text}"

    # ----------------------------------------------------------------- helpers
    def _info(self, valid: bool, effective: bool, success: bool, step: float, outcome: float, **extra) -> dict:
        return {
            "action_is_valid": valid, "action_is_effective": effective, "success": success,
            "step_reward": step, "outcome_reward": outcome, "tool_calls_left": self.max_tool_calls - self.calls_used,
            **extra,
        }

    def _invalid(self, reason: str) -> StepResult:
        info = self._info(False, False, False, 0.0, 0.0, tool_result=False)
        return StepResult(f"Invalid action: {reason}.", 0.0, self.done, info)
