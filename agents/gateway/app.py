"""The OpenAI-compatible gateway (aiohttp, like the workers' data plane): an unmodified agent written
against the OpenAI SDK drives one PEARL trajectory by changing only `base_url` / `api_key`.

Routes (each also under `/sessions/<key>`, for agents that can only set a base URL):
  POST /v1/chat/completions   messages (+ tools) → one assistant turn; `stream` replays it as SSE
  POST /v1/completions        a text or token-id prompt → one completion (token-native agents)
  GET  /v1/models             the job's model
  POST /sessions/<key>/reward {"reward": r}: the agent's reward (PEARL_REWARD_URL)
  POST /v1/pearl/sessions     (runner token) open a session: 429 + Retry-After when full

Responses carry `x-pearl-weight-version` and `Server-Timing: engine;dur=<ms>` (the turn's time in the
backend: routing, queueing, sampling; the rest of what the client waited is the gateway's); with
`return_token_ids: true` (vLLM's field) the prompt's `prompt_token_ids` and the choice's `token_ids`.
Errors have OpenAI's shape, 4xx for bad input.
"""

from __future__ import annotations

import json
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from agents.dataplane import MAX_PROMPT_TOKENS, MAX_REQUEST_BYTES
from agents.gateway.backends import Backend, BackendUnavailable, Sampling
from agents.gateway.chat import ChatFormat, TemplateError
from agents.gateway.sessions import Full, Session, SessionStore, TurnRecord
from agents.process import serve_app

log = logging.getLogger("pearl.gateway")
WEIGHT_VERSION_HEADER = "x-pearl-weight-version"
SERVER_TIMING_HEADER = "Server-Timing"  # W3C Server-Timing: an agent sees where its turn's time went
SESSION = web.AppKey("gateway", object)
DEFAULT_MAX_TOKENS = 256
MAX_STOP = 4
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class OpenAIError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return web.Response(
            body=orjson.dumps(body), status=self.status, content_type="application/json", headers=self.headers
        )


def bad(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def no_alternatives(param: str) -> OpenAIError:
    """Why a 400 and not a made-up answer: PEARL's engines return the log-prob of each sampled token (what
    the trainer needs), not the engine's top-k alternatives; echoing the sampled token as its only
    "alternative" would look like data and mean nothing."""
    return bad(
        f"{param}: this engine returns the sampled token's log-prob only, not top-k alternatives; ask for "
        + ("logprobs: true without top_logprobs" if param == "top_logprobs" else "logprobs: 0"),
        param,
        "unsupported_parameter",
    )


# ------------------------------------------------------------------ request validation
def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
        raise bad(f"{name} must be a number in [{lo}, {hi}]", name)
    return float(v)


def _int(body: dict[str, Any], name: str, lo: int, hi: int) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise bad(f"{name} must be an integer in [{lo}, {hi}]", name)
    return v


def _stops(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > MAX_STOP or not all(isinstance(s, str) and s for s in stops):
        raise bad(f"stop must be a non-empty string or a list of at most {MAX_STOP} of them", "stop")
    return stops


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("messages must be a non-empty list", "messages")
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise bad(f"{where}.role must be one of system, developer, user, assistant, tool", where)
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise bad(f"{where}.content must be a string or a list of parts", f"{where}.content")
        if isinstance(c, list) and not all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in c
        ):
            raise bad(f"{where}.content: only text parts are supported", f"{where}.content")
        if m["role"] == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise bad(f"{where}.tool_call_id is required for a tool message", f"{where}.tool_call_id")
        calls = m.get("tool_calls")
        if calls is not None and (
            m["role"] != "assistant"
            or not isinstance(calls, list)
            or not all(isinstance(c, dict) and isinstance((c.get("function") or {}).get("name"), str) for c in calls)
        ):
            raise bad(
                f"{where}.tool_calls must be a list of function calls of an assistant message", f"{where}.tool_calls"
            )
    return [{**m, "role": "system" if m["role"] == "developer" else m["role"]} for m in msgs]


def _tools(body: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, bool]:
    """The tools and whether tool calls are parsed (`tool_choice: none` turns parsing off)."""
    tools = body.get("tools")
    if tools is not None and (
        not isinstance(tools, list)
        or not all(
            isinstance(t, dict)
            and t.get("type", "function") == "function"
            and isinstance((t.get("function") or {}).get("name"), str)
            for t in tools
        )
    ):
        raise bad("tools must be a list of {type: function, function: {name, ...}}", "tools")
    choice = body.get("tool_choice")
    if (
        choice is not None
        and choice not in ("none", "auto", "required")
        and not (isinstance(choice, dict) and isinstance((choice.get("function") or {}).get("name"), str))
    ):
        raise bad("tool_choice must be none, auto, required or {type: function, function: {name}}", "tool_choice")
    if isinstance(choice, dict) and not any(
        (t.get("function") or {}).get("name") == choice["function"]["name"] for t in tools or []
    ):
        raise bad("tool_choice names a function that is not in tools", "tool_choice")
    return (tools or None), choice != "none"


def _truncate_at_stop(fmt: ChatFormat, tokens: list[int], stops: list[str]) -> tuple[list[int], str | None]:
    """Cut a sampled turn at its first end-of-turn id (kept: it was sampled and ends the turn) or after the
    token that completes the first stop string (the string is not shown). Returns (tokens, text or None)."""
    for i, t in enumerate(tokens):
        if t in fmt.stop_ids:
            tokens = tokens[: i + 1]
            break
    if not stops:
        return tokens, None
    text = fmt.decode(tokens)
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return tokens, None
    at, _ = min(hits)
    lo, hi = 1, len(tokens)  # the shortest prefix whose text reaches the stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in fmt.decode(tokens[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return tokens[:lo], text[:at]


# ------------------------------------------------------------------ the gateway
class Gateway:
    """One gateway: a chat format, a backend that samples turns, the sessions."""

    def __init__(
        self,
        fmt: ChatFormat,
        backend: Backend,
        *,
        sessions: SessionStore | None = None,
        runner_token: str = "",
        max_context_tokens: int = MAX_PROMPT_TOKENS,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        base_url: str = "",
    ) -> None:
        self.fmt = fmt
        self.backend = backend
        self.sessions = sessions or SessionStore()
        self.runner_token = runner_token or secrets.token_urlsafe(24)
        self.max_context_tokens = max_context_tokens
        self.default_max_tokens = default_max_tokens
        self.base_url = base_url  # http://host:port once served
        self.on_closed: list[Callable[[Session], None]] = []
        app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[self._errors])
        app[SESSION] = self
        for prefix in ("", "/sessions/{key}"):
            app.router.add_post(prefix + "/v1/chat/completions", self.chat)
            app.router.add_post(prefix + "/v1/completions", self.completions)
            app.router.add_get(prefix + "/v1/models", self.models)
        app.router.add_post("/sessions/{key}/reward", self.reward)
        app.router.add_post("/v1/pearl/sessions", self.open_session)
        self.app = app

    # ---- sessions
    def open(self, trajectory: str, task: Any = None) -> Session:
        return self.sessions.open(trajectory, task)

    def close(self, s: Session) -> None:
        self.sessions.close(s.key)
        for cb in self.on_closed:
            cb(s)

    def session_url(self, s: Session) -> str:
        return f"{self.base_url}/sessions/{s.key}/v1"

    # ---- plumbing
    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except OpenAIError as exc:
            return exc.response()
        except TemplateError as exc:
            return bad(str(exc), "messages").response()
        except web.HTTPRequestEntityTooLarge:
            return OpenAIError(
                413, f"request body larger than {MAX_REQUEST_BYTES} bytes", code="request_too_large"
            ).response()
        except web.HTTPException as exc:
            if exc.status >= 400:
                return OpenAIError(exc.status, exc.reason or "error", type="invalid_request_error").response()
            raise

    def _session(self, request: web.Request) -> Session:
        key = request.match_info.get("key")
        if key is None:
            auth = request.headers.get("Authorization", "")
            key = auth[7:].strip() if auth.startswith("Bearer ") else ""
        s = self.sessions.get(key) if key else None
        if s is None:
            raise OpenAIError(
                401, "unknown or expired session key", type="invalid_request_error", code="invalid_api_key"
            )
        s.touch()
        return s

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if request.content_length is not None and request.content_length > MAX_REQUEST_BYTES:
            raise OpenAIError(413, f"request body larger than {MAX_REQUEST_BYTES} bytes", code="request_too_large")
        raw = await request.read()
        try:
            body = orjson.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise bad(f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise bad("the body must be a JSON object")
        return body

    def _sampling(self, body: dict[str, Any], prompt_len: int) -> Sampling:
        if body.get("n", 1) != 1:
            raise bad("only n = 1 is supported (one sample per request; a trajectory forks by itself)", "n")
        room = self.max_context_tokens - prompt_len
        if room < 1:
            raise bad(
                f"the prompt has {prompt_len} tokens; the context holds {self.max_context_tokens}",
                "messages",
                "context_length_exceeded",
            )
        mt = _int(body, "max_completion_tokens", 1, 1 << 30)
        if mt is None:
            mt = _int(body, "max_tokens", 1, 1 << 30)
        if mt is not None and mt > room:
            raise bad(
                f"max_tokens {mt} exceeds what the context leaves ({room} of {self.max_context_tokens})",
                "max_tokens",
                "context_length_exceeded",
            )
        return Sampling(
            max_tokens=mt or min(room, self.default_max_tokens),
            temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=_number(body, "top_p", 1.0, 1e-6, 1.0),
            seed=_int(body, "seed", -(2**63), 2**63 - 1),
        )

    def _headers(self, version: int, engine_s: float) -> dict[str, str]:
        return {WEIGHT_VERSION_HEADER: str(version), SERVER_TIMING_HEADER: f"engine;dur={1e3 * engine_s:.3f}"}

    # ---- routes
    async def models(self, request: web.Request) -> web.Response:
        self._session(request)
        model = {"id": self.backend.model, "object": "model", "created": 0, "owned_by": "pearl"}
        return web.json_response({"object": "list", "data": [model]})

    async def reward(self, request: web.Request) -> web.Response:
        s = self._session(request)
        body = await self._body(request)
        r = body.get("reward")
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
            raise bad("reward must be a finite number", "reward")
        s.set_reward(float(r))
        return web.json_response({"ok": True})

    async def open_session(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if not secrets.compare_digest(auth.encode(), f"Bearer {self.runner_token}".encode()):
            raise OpenAIError(401, "bad runner token", code="invalid_api_key")
        body = await self._body(request)
        try:
            s = self.open(str(body.get("trajectory") or secrets.token_hex(8)), body.get("task"))
        except Full as exc:
            raise OpenAIError(
                429,
                str(exc),
                type="rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))},
            ) from None
        return web.json_response({"session_id": s.trajectory, "api_key": s.key, "base_url": self.session_url(s)})

    async def _turn(
        self, s: Session, prompt: list[int], new: list[int], sampling: Sampling, stops: list[str]
    ) -> tuple[list[int], list[float], str, str | None, int, list[int], float]:
        t0 = time.monotonic()
        try:
            gen = await self.backend.generate(s, prompt, new, sampling)
        except BackendUnavailable as exc:
            raise OpenAIError(503, str(exc), type="server_error", code="unavailable") from None
        tokens, cut_text = _truncate_at_stop(self.fmt, gen.tokens, stops)
        finish = gen.finish_reason
        if len(tokens) < len(gen.tokens) or (tokens and tokens[-1] in self.fmt.stop_ids):
            finish = "stop"
        return (
            tokens,
            gen.logprobs[: len(tokens)],
            finish,
            cut_text,
            gen.weight_version,
            gen.workers,
            time.monotonic() - t0,
        )

    async def chat(self, request: web.Request) -> web.StreamResponse:
        s = self._session(request)
        body = await self._body(request)
        messages = _messages(body)
        tools, parse_tools = _tools(body)
        stops = _stops(body)
        want_lp = bool(body.get("logprobs"))
        if _int(body, "top_logprobs", 0, 20):
            raise no_alternatives("top_logprobs")
        stream = bool(body.get("stream"))
        async with s.lock:
            key = json.dumps(tools, sort_keys=True) if tools else ""
            plan = s.tokens.plan(messages, key)
            ids = None
            if not plan.fork:
                ids = self.fmt.delta(plan.new_messages, tools)
                if ids is None:
                    plan.fork, plan.new_messages = True, list(messages)
            if plan.fork:
                ids = self.fmt.render(messages, tools)
            assert ids is not None
            sampling = self._sampling(body, len(s.tokens.current.tokens) + len(ids) if not plan.fork else len(ids))
            prompt = s.tokens.begin(plan, ids, messages, key)
            tokens, lps, finish, cut_text, version, workers, latency = await self._turn(s, prompt, ids, sampling, stops)
            answer = self.fmt.answer(tokens)
            if cut_text is not None:
                answer.content, answer.tool_calls = cut_text, []
            if not parse_tools and answer.tool_calls:
                answer.content, answer.tool_calls = answer.text, []
            msg = answer.message()
            s.tokens.sampled(
                tokens,
                lps,
                msg,
                weight_version=version,
                workers=workers,
                latency_s=latency,
                closing=self.fmt.closing(tokens),
            )
            s.turns.append(
                TurnRecord(len(messages), len(prompt), len(tokens), finish, version, workers, latency, plan.fork)
            )
            s.messages = [*messages, msg]
        if answer.tool_calls and finish == "stop":
            finish = "tool_calls"
        created = int(time.time())
        rid = "chatcmpl-" + secrets.token_hex(12)
        choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}
        if want_lp:
            choice["logprobs"] = {"content": self._logprobs(tokens, lps)}
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(tokens),
            "total_tokens": len(prompt) + len(tokens),
        }
        extra = {}
        if body.get("return_token_ids"):
            extra = {"prompt_token_ids": prompt}
            choice["token_ids"] = tokens
        headers = self._headers(version, latency)
        if not stream:
            out = {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": self.backend.model,
                "choices": [choice],
                "usage": usage,
                **extra,
            }
            return web.Response(body=orjson.dumps(out), content_type="application/json", headers=headers)
        return await self._stream_chat(
            request,
            rid,
            created,
            choice,
            usage,
            extra,
            headers,
            bool((body.get("stream_options") or {}).get("include_usage")),
        )

    def _logprobs(self, tokens: list[int], lps: list[float]) -> list[dict[str, Any]]:
        out = []
        for t, lp in zip(tokens, lps):
            text = self.fmt.decode([t])
            entry = {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}
            out.append(entry | {"top_logprobs": []})  # top_logprobs > 0 is refused (`no_alternatives`)
        return out

    async def _stream_chat(
        self,
        request: web.Request,
        rid: str,
        created: int,
        choice: dict[str, Any],
        usage: dict[str, int],
        extra: dict[str, Any],
        headers: dict[str, str],
        include_usage: bool,
    ) -> web.StreamResponse:
        """The finished turn replayed as SSE chunks (role, content, tool calls, finish, usage)."""
        resp = web.StreamResponse(headers={**headers, "Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.backend.model}
        msg = choice["message"]

        async def send(delta: dict[str, Any], finish: str | None = None, more: dict[str, Any] | None = None) -> None:
            ch: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
            ch.update(more or {})
            await resp.write(b"data: " + orjson.dumps(base | {"choices": [ch]}) + b"\n\n")

        first = {"role": "assistant", "content": ""}
        await resp.write(
            b"data: "
            + orjson.dumps(
                base | extra | {"choices": [{"index": 0, "delta": first, "finish_reason": None, "logprobs": None}]}
            )
            + b"\n\n"
        )
        more: dict[str, Any] = {}
        if choice.get("logprobs"):
            more["logprobs"] = choice["logprobs"]
        if "token_ids" in choice:
            more["token_ids"] = choice["token_ids"]
        await send({"content": msg.get("content") or ""}, None, more)
        for i, c in enumerate(msg.get("tool_calls") or []):
            await send({"tool_calls": [{"index": i, "id": c["id"], "type": "function", "function": c["function"]}]})
        await send({}, choice["finish_reason"])
        if include_usage:
            await resp.write(b"data: " + orjson.dumps(base | {"choices": [], "usage": usage}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def completions(self, request: web.Request) -> web.Response:
        s = self._session(request)
        body = await self._body(request)
        prompt_in = body.get("prompt")
        if isinstance(prompt_in, list) and len(prompt_in) == 1 and isinstance(prompt_in[0], (str, list)):
            prompt_in = prompt_in[0]  # a batch of one
        if isinstance(prompt_in, str):
            ids = self.fmt.encode(prompt_in)
        elif (
            isinstance(prompt_in, list)
            and prompt_in
            and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt_in)
        ):
            ids = list(prompt_in)
            if min(ids) < 0 or max(ids) >= self.fmt.vocab_size:
                raise bad(f"token ids must be in [0, {self.fmt.vocab_size})", "prompt")
        else:
            raise bad("prompt must be a string or a non-empty list of token ids (one prompt)", "prompt")
        if body.get("stream"):
            raise bad("stream is not supported on /v1/completions", "stream")
        if body.get("echo"):
            raise bad("echo is not supported", "echo")
        stops = _stops(body)
        lp_in = body.get("logprobs")
        if lp_in is not None and lp_in is not False and _int(body, "logprobs", 0, 5):
            raise no_alternatives("logprobs")
        want_lp = lp_in is not None and lp_in is not False
        sampling = self._sampling(body, len(ids))
        async with s.lock:
            held = s.tokens.current.tokens if s.tokens.samples else None
            from agents.gateway.tokens import Plan

            fork = held is None or not (len(held) < len(ids) and ids[: len(held)] == held)
            new = ids if fork else ids[len(held or []) :]
            prompt = s.tokens.begin(Plan(fork, []), new, [], "completions")
            tokens, lps, finish, cut_text, version, workers, latency = await self._turn(s, prompt, new, sampling, stops)
            s.tokens.sampled(
                tokens,
                lps,
                {"role": "assistant", "content": None},
                weight_version=version,
                workers=workers,
                latency_s=latency,
            )
            s.tokens.held = []
            s.turns.append(TurnRecord(0, len(prompt), len(tokens), finish, version, workers, latency, fork))
        text = (
            cut_text
            if cut_text is not None
            else self.fmt.decode(tokens[:-1] if tokens and tokens[-1] in self.fmt.stop_ids else tokens)
        )
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        if want_lp:
            toks = [self.fmt.decode([t]) for t in tokens]
            choice["logprobs"] = {
                "tokens": toks,
                "token_logprobs": lps,
                "top_logprobs": None,
                "text_offset": [0] * len(toks),
            }
        out: dict[str, Any] = {
            "id": "cmpl-" + secrets.token_hex(12),
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.backend.model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(tokens),
                "total_tokens": len(prompt) + len(tokens),
            },
        }
        if body.get("return_token_ids"):
            out["prompt_token_ids"] = prompt
            choice["token_ids"] = tokens
        headers = self._headers(version, latency)
        return web.Response(body=orjson.dumps(out), content_type="application/json", headers=headers)


async def serve(gateway: Gateway, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve on loopback unless told otherwise; returns (runner, base URL)."""
    runner, bound = await serve_app(gateway.app, host, port)
    gateway.base_url = f"http://{host}:{bound}"
    return runner, gateway.base_url


__all__ = ["SERVER_TIMING_HEADER", "WEIGHT_VERSION_HEADER", "Gateway", "OpenAIError", "serve"]
