"""The OpenAI-compatible endpoint: an aiohttp server over any ``ragen.rollout.base.Engine`` (docs/gateway.md).

Routes: ``POST /v1/chat/completions`` and ``GET /v1/models``, also under ``/ep/<episode>/`` (each run of a program
gets a base URL ``http://127.0.0.1:<port>/ep/<episode>/v1``; the ``X-Ragen-Episode`` header names the episode
too). A call's messages are rendered with the tokenizer's chat template (``ragen.gateway.render``), its samples
come from the engine in batches with other calls (``ragen.gateway.batching``), each sample is recorded with its
exact ids and log-probs (``ragen.gateway.episodes``), and the answer is an OpenAI chat completion whose tool calls
the model family's parser read (``ragen.gateway.toolcalls``).

* Sampling is the run's: a request's ``temperature``, ``top_p``, ``top_k``, ``seed`` are overridden (the trainer's
  log-probs must match the engine's); the response names the overridden ones in the header
  ``X-Ragen-Sampling-Overridden`` and in its ``ragen.overridden`` field. ``max_tokens`` (or
  ``max_completion_tokens``) is capped by the run's budget and the room left in ``max_model_len``; ``stop``
  strings apply (the stop text is kept in the sample, as the engines do). ``n`` samples share a group id.
* A retried call (the same ``Idempotency-Key`` or ``X-Request-Id`` header within an episode) is answered with the
  first answer; it is neither sampled nor recorded again.
* A bad request (invalid JSON, an unknown model, a prompt over the length budget, malformed messages) gets an
  OpenAI-style 400 error and marks its episode failed (its rows train nothing); the server goes on.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from aiohttp import web

from ragen.gateway.batching import Batcher
from ragen.gateway.episodes import EpisodeBook, EpisodeLog
from ragen.gateway.render import PromptRenderer, RequestError, normalise_messages
from ragen.gateway.toolcalls import tool_parser
from ragen.rollout.base import DROPPED_REASONS, Engine, Sample, SamplingParams

EPISODE_HEADER = "X-Ragen-Episode"
OVERRIDDEN_HEADER = "X-Ragen-Sampling-Overridden"
REQUEST_ID_HEADERS = ("Idempotency-Key", "X-Request-Id")
DEFAULT_EPISODE = "default"
_RUN_SAMPLING = ("temperature", "top_p", "top_k", "seed")


@dataclass(frozen=True)
class GatewayConfig:
    """``model``: the one model name served (``/v1/models``; another name is a 400); ``host`` / ``port``: where to
    listen (port 0: a free port); ``max_model_len``: prompt + completion budget in tokens; ``tool_format``: the
    tool-call parser (``ragen.gateway.toolcalls``); ``gather_s``: the batching window in seconds; ``max_n``: the
    most samples per call."""

    model: str = "ragen"
    host: str = "127.0.0.1"
    port: int = 0
    max_model_len: int = 4096
    tool_format: str = "none"
    gather_s: float = 0.002
    max_n: int = 16


def error_body(message: str, code: str = "invalid_request_error", param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


@dataclass
class _Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]

    def response(self) -> web.Response:
        return web.json_response(self.body, status=self.status, headers=self.headers)


class Gateway:
    """The server (module docstring): ``async with Gateway(...) as gw`` serves at ``gw.base_url()`` until the
    block ends; ``gw.book`` holds what it recorded. ``sampling``: the run's sampling settings; ``stop_ids``: the
    ids that end a sample (default: the tokenizer's eos and the template's end-of-turn token, when it has one)."""

    def __init__(self, engine: Engine, tokenizer: Any, sampling: SamplingParams,
                 config: GatewayConfig | None = None, stop_ids: Iterable[int] | None = None) -> None:
        self.config = config or GatewayConfig()
        stops = set(stop_ids) if stop_ids is not None else _default_stop_ids(tokenizer)
        self.sampling = replace(sampling, stop_token_ids=tuple(sorted(set(sampling.stop_token_ids) | stops)))
        self.renderer = PromptRenderer(tokenizer, self.sampling.stop_token_ids)
        self.parser = tool_parser(self.config.tool_format)
        self.batcher = Batcher(engine, self.config.gather_s)
        self.book = EpisodeBook()
        self.port: int | None = None
        self._runner: web.AppRunner | None = None

    # ------------------------------------------------------------------------------------------------ lifecycle
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("", "/ep/{episode}"):
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_get(prefix + "/v1/models", self._models)
        return app

    async def start(self) -> None:
        """Listen on ``config.host`` / ``config.port`` (a free port when 0, then in ``self.port``)."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.config.host, self.config.port))
        self.port = sock.getsockname()[1]
        self.batcher.start()
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        """Stop listening (the port is closed) and end the batcher; calls in flight fail."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.batcher.stop()

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def base_url(self, episode: str | None = None) -> str:
        """The OpenAI base URL (ending in ``/v1``) of ``episode``, or the plain one (the header names episodes)."""
        root = f"http://{self.config.host}:{self.port}"
        return f"{root}/ep/{episode}/v1" if episode else f"{root}/v1"

    # --------------------------------------------------------------------------------------------------- routes
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.config.model, "object": "model", "created": 0, "owned_by": "ragen"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        episode = self.book.episode(request.match_info.get("episode") or request.headers.get(EPISODE_HEADER)
                                    or DEFAULT_EPISODE)
        rid = next((request.headers[h] for h in REQUEST_ID_HEADERS if request.headers.get(h)), None)
        if rid is not None and rid in episode.responses:
            return (await asyncio.shield(episode.responses[rid])).response()
        rid = rid or f"req-{uuid.uuid4().hex}"
        done = asyncio.get_running_loop().create_future()
        episode.responses[rid] = done
        try:
            answer = await self._answer(request, episode, rid)
        except RequestError as exc:
            if exc.code != "episode_closed":  # an ended episode keeps the outcome its program had
                episode.fail(f"{rid}: {exc}")
            answer = _Answer(400, error_body(str(exc), exc.code, exc.param), {})
        except Exception as exc:  # noqa: BLE001 - the engine failed: this call and its episode fail, not the server
            episode.fail(f"{rid}: {type(exc).__name__}: {exc}")
            answer = _Answer(500, error_body(f"generation failed: {exc}", "server_error"), {})
        except BaseException:  # cancelled before an answer (nothing was recorded): a retry starts afresh
            episode.responses.pop(rid, None)
            done.cancel()
            raise
        done.set_result(answer)
        return answer.response()

    async def _answer(self, request: web.Request, episode: EpisodeLog, rid: str) -> _Answer:
        try:
            body = await request.json()
        except ValueError as exc:
            raise RequestError(f"the body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise RequestError("the body must be a JSON object")
        if body.get("stream"):
            raise RequestError("streaming is not supported; call without stream", param="stream")
        if episode.closed:
            raise RequestError(f"episode {episode.key!r} has ended; its program may not call any more",
                               "episode_closed")
        if body.get("model") != self.config.model:
            raise RequestError(f"unknown model {body.get('model')!r}; this endpoint serves {self.config.model!r}",
                               "model_not_found", "model")
        prompt = episode.prepare(self.renderer, normalise_messages(body.get("messages")), _tools(body))
        sampling, n = self._sampling(body, len(prompt.ids))
        samples = await self.batcher.generate([prompt.ids] * n, sampling)
        if any(s.finish_reason in DROPPED_REASONS for s in samples):
            raise RuntimeError(f"the engine dropped a sample ({[s.finish_reason for s in samples]})")
        parser = tool_parser("none") if body.get("tool_choice") == "none" else self.parser
        records = episode.record(self.renderer, parser, rid, prompt, samples)
        overridden = [k for k in _RUN_SAMPLING if k in body and body[k] is not None
                      and body[k] != getattr(self.sampling, k)]
        choices = [self._choice(i, rec.tool_parse, s, bool(body.get("logprobs")))
                   for i, (rec, s) in enumerate(zip(records, samples, strict=True))]
        out = {
            "id": f"chatcmpl-{rid}", "object": "chat.completion", "created": int(time.time()),
            "model": self.config.model, "choices": choices,
            "usage": {"prompt_tokens": len(prompt.ids), "completion_tokens": sum(len(s.token_ids) for s in samples),
                      "total_tokens": len(prompt.ids) * n + sum(len(s.token_ids) for s in samples)},
            "ragen": {"episode": episode.key, "request_id": rid, "group_id": records[0].group_id,
                      "overridden": overridden, "sampling": _sampling_dict(self.sampling),
                      "malformed_tool_calls": [r.tool_parse.malformed for r in records]},
        }
        return _Answer(200, out, {OVERRIDDEN_HEADER: ",".join(overridden)} if overridden else {})

    # -------------------------------------------------------------------------------------------------- helpers
    def _sampling(self, body: dict[str, Any], prompt_len: int) -> tuple[SamplingParams, int]:
        """The run's sampling with the request's budget and stop strings, and its ``n``."""
        n = body.get("n")
        n = 1 if n is None else n
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.config.max_n:
            raise RequestError(f"n must be an integer in [1, {self.config.max_n}], got {n!r}", param="n")
        room = self.config.max_model_len - prompt_len
        if room < 1:
            raise RequestError(f"the prompt has {prompt_len} tokens; max_model_len is {self.config.max_model_len}",
                               "context_length_exceeded", "messages")
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or self.sampling.max_new_tokens
        if not isinstance(asked, int) or asked < 1:
            raise RequestError(f"max_tokens must be a positive integer, got {asked!r}", param="max_tokens")
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else stop
        if not isinstance(stop, list | tuple) or not all(isinstance(s, str) and s for s in stop):
            raise RequestError("stop must be a string or a list of strings", param="stop")
        budget = min(asked, self.sampling.max_new_tokens, room)
        return replace(self.sampling, max_new_tokens=budget, stop=tuple(self.sampling.stop) + tuple(stop)), n

    def _choice(self, index: int, parse: Any, sample: Sample, logprobs: bool) -> dict[str, Any]:
        """One ``choices`` entry: the message, the finish reason (``tool_calls`` when it called tools), and the
        per-token log-probs when asked."""
        finish = "tool_calls" if parse.tool_calls else ("length" if sample.finish_reason == "length" else "stop")
        out: dict[str, Any] = {"index": index, "message": self.renderer.message(parse), "finish_reason": finish,
                               "logprobs": None}
        if logprobs:
            out["logprobs"] = {"content": [
                {"token": self.renderer.decode([t]), "logprob": float(lp), "top_logprobs": []}
                for t, lp in zip(sample.token_ids, sample.log_probs, strict=True)]}
        return out


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
        raise RequestError("tools must be a list of objects", param="tools")
    return tools or None


def _sampling_dict(s: SamplingParams) -> dict[str, Any]:
    return {"temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "seed": s.seed}


def _default_stop_ids(tokenizer: Any) -> set[int]:
    """The tokenizer's eos and, for a ChatML-style template, its ``<|im_end|>`` (the end-of-turn token)."""
    out = {int(tokenizer.eos_token_id)} if getattr(tokenizer, "eos_token_id", None) is not None else set()
    template = getattr(tokenizer, "chat_template", None) or ""
    if "<|im_end|>" in template:
        eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(eot, int) and eot != getattr(tokenizer, "unk_token_id", None):
            out.add(eot)
    return out


class GatewayThread:
    """The gateway for synchronous callers: its event loop runs in a thread between :meth:`start` and
    :meth:`stop` (or a ``with`` block). :meth:`call` runs a function on that loop (read ``gateway.book`` there)."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> GatewayThread:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ragen-gateway", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.gateway.start(), self._loop).result()
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.gateway.stop(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._loop = None

    def submit(self, coro: Any) -> Any:
        """Run the coroutine ``coro`` on the gateway's loop and wait for its result (e.g.
        ``thread.submit(run_programs(thread.gateway, ...))``)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def call(self, fn: Any) -> Any:
        """``fn()`` run on the gateway's loop; its result."""
        async def run() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result()

    def __enter__(self) -> GatewayThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
