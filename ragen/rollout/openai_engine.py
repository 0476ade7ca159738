"""The ``openai`` engine: an OpenAI-compatible ``/completions`` endpoint over the stdlib (docs/design.md, engines).

For evaluating API-served models (e.g. ``vllm serve``). Prompts go in as token-id lists (``prompt`` = list of
lists of ints), log-probs come back per token. Exact sampled ids need a server that returns them: vLLM does with
``return_tokens_as_token_ids`` (tokens look like ``"token_id:123"``), which we request. If a server returns plain
token strings instead, ids are recovered with the tokenizer (``convert_tokens_to_ids``, then re-encoding the text)
and the sample is marked ``extra["retokenized"] = True`` -- fine for evaluation, not for training.
``update_weights`` is not possible over this API and raises; ``sleep``/``wake`` are no-ops.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from typing import Any

from ragen.rollout.base import Sample, SamplingParams, SleepState

Transport = Callable[[str, dict[str, Any], dict[str, str], float], dict[str, Any]]


def urllib_transport(url: str, payload: dict[str, Any], headers: dict[str, str], timeout: float) -> dict[str, Any]:
    """POST ``payload`` as JSON and return the decoded JSON reply (raises ``OSError`` on HTTP/network errors)."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return json.loads(reply.read().decode())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:500]
        raise OSError(f"{url} answered HTTP {exc.code}: {body}") from None


def completion_request(model: str, prompts: list[list[int]], sampling: SamplingParams) -> dict[str, Any]:
    """The JSON body of a ``/completions`` call for ``prompts`` (OpenAI fields plus vLLM's extensions)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": [list(p) for p in prompts],
        "max_tokens": sampling.max_new_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "logprobs": 1,
        "n": 1,
        "echo": False,
        # vLLM extensions (ignored by servers that do not know them)
        "return_tokens_as_token_ids": True,
        "include_stop_str_in_output": True,
        "skip_special_tokens": False,
    }
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.stop_token_ids:
        body["stop_token_ids"] = list(sampling.stop_token_ids)
    if sampling.top_k > 0:
        body["top_k"] = sampling.top_k
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    return body


def _token_ids(tokens: list[str], text: str, tokenizer: Any) -> tuple[list[int], bool]:
    """Ids from the reply's token strings; returns (ids, retokenized)."""
    if all(t.startswith("token_id:") for t in tokens):
        return [int(t.split(":", 1)[1]) for t in tokens], False
    if tokenizer is None:
        raise ValueError("server returned token strings, not ids; pass a tokenizer to OpenAIEngine to map them")
    ids = tokenizer.convert_tokens_to_ids(tokens)
    if len(ids) == len(tokens) and all(i is not None and i != tokenizer.unk_token_id for i in ids):
        return list(ids), True
    return tokenizer(text, add_special_tokens=False)["input_ids"], True


def samples_from_response(response: dict[str, Any], n_prompts: int, tokenizer: Any = None) -> list[Sample]:
    """Convert a ``/completions`` reply into one ``Sample`` per prompt, ordered by ``choice["index"]``."""
    choices = sorted(response.get("choices", []), key=lambda c: c.get("index", 0))
    if len(choices) != n_prompts:
        raise ValueError(f"expected {n_prompts} choices in the completion reply, got {len(choices)}")
    samples = []
    for choice in choices:
        logprobs = choice.get("logprobs") or {}
        tokens = logprobs.get("tokens") or []
        values = [float(v) if v is not None else 0.0 for v in (logprobs.get("token_logprobs") or [])]
        ids, retokenized = _token_ids(tokens, choice.get("text", ""), tokenizer)
        if len(values) != len(ids):  # re-encoded text need not align with the server's tokens
            values = values[: len(ids)] + [0.0] * max(0, len(ids) - len(values))
        reason = "stop" if choice.get("finish_reason") == "stop" else "length"
        extra = {"text": choice.get("text", "")}
        if retokenized:
            extra["retokenized"] = True
        samples.append(Sample(ids, values, reason, extra))
    return samples


class OpenAIEngine:
    """``Engine`` over an OpenAI-compatible completions API (``base_url`` like ``http://host:8000/v1``).

    ``api_key`` defaults to ``$OPENAI_API_KEY``. Prompts are sent ``batch_size`` per request; failed requests
    are retried ``max_retries`` times with exponential backoff. ``transport`` replaces the HTTP call (tests).
    """

    def __init__(
        self,
        model: str,
        base_url: str = "http://localhost:8000/v1",
        *,
        api_key: str | None = None,
        tokenizer: Any = None,
        batch_size: int = 32,
        timeout: float = 120.0,
        max_retries: int = 3,
        transport: Transport | None = None,
    ):
        self.model = model
        self.url = base_url.rstrip("/") + "/completions"
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY", "")
        self.headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.timeout = timeout
        self.max_retries = max_retries
        self.transport = transport or urllib_transport
        self.sleep_state = SleepState()  # sleep / wake are recorded only (ragen.rollout.base)

    def generate(self, prompt_token_ids: list[list[int]], sampling: SamplingParams) -> list[Sample]:
        """One ``Sample`` per prompt, in order."""
        samples: list[Sample] = []
        for start in range(0, len(prompt_token_ids), self.batch_size):
            chunk = prompt_token_ids[start : start + self.batch_size]
            reply = self._post(completion_request(self.model, chunk, sampling))
            samples.extend(samples_from_response(reply, len(chunk), self.tokenizer))
        return samples

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(self.max_retries + 1):
            try:
                return self.transport(self.url, payload, self.headers, self.timeout)
            except OSError:
                if attempt == self.max_retries:
                    raise
                time.sleep(min(2.0**attempt, 30.0))
        raise AssertionError("unreachable")

    def update_weights(self, state_dict: dict[str, Any] | Iterable[tuple[str, Any]]) -> None:
        """Not available over an HTTP completions API."""
        raise RuntimeError("engine 'openai' serves fixed remote weights; train with engine 'hf' or 'vllm'")

    @property
    def asleep(self) -> frozenset[str]:
        """The parts (``ENGINE_PARTS``) asleep now (recorded only: the server manages its own memory)."""
        return self.sleep_state.asleep

    def sleep(self) -> None:
        """Recorded only: the server manages its own memory."""
        self.sleep_state.sleep(lambda: None)

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        """Recorded only: the server manages its own memory."""
        self.sleep_state.wake(tags, lambda parts: None)
