"""The gateway with the official `openai` SDK as the client, against real engine workers (in-process
`WorkerServer`s over the torch engine's tiny model, or the emulated engine where a turn must be slow)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import openai
import orjson
import pytest
from aiohttp import ClientSession

from agents.gateway.app import SERVER_TIMING_HEADER, WEIGHT_VERSION_HEADER, Gateway, serve
from agents.gateway.backends import Generation, WorkerBackend
from agents.gateway.chat import ByteChatFormat
from agents.gateway.sessions import SessionStore
from agents.tokenizer import TOKENIZER, TOOL_CALL_END_ID, TOOL_CALL_ID
from tests.support.gateway import SECRET, start_worker

USER: list[Any] = [{"role": "user", "content": "1+2?"}]


def extra(obj: Any) -> dict[str, Any]:
    """The vendor fields of an SDK object (what the gateway adds to OpenAI's shapes)."""
    return obj.model_extra or {}


def extra_body(err: openai.APIStatusError) -> dict[str, Any]:
    assert isinstance(err.body, dict)
    return err.body


@pytest.fixture
async def http():
    async with ClientSession() as s:
        yield s


@pytest.fixture
async def worker():
    runner, url, _server = await start_worker("torch")
    yield url
    await runner.cleanup()


@pytest.fixture
async def gateway(worker, http):
    gw = Gateway(ByteChatFormat(), WorkerBackend([worker], SECRET, http), sessions=SessionStore(max_sessions=2048))
    runner, _base = await serve(gw)
    yield gw
    await runner.cleanup()


async def direct(http, worker: str, prompt: list[int], max_tokens: int, seed: int, temperature: float = 1.0) -> dict:
    """What the engine samples for this prompt and seed, asked of the worker's data plane directly."""
    body = {
        "request_id": f"direct-{seed}",
        "prompt_tokens": prompt,
        "sampling": {"max_tokens": max_tokens, "temperature": temperature, "seed": seed, "stop_at_eos": True},
    }
    async with http.post(
        f"{worker}/generate", data=orjson.dumps(body), headers={"Authorization": f"Bearer {SECRET}"}
    ) as r:
        assert r.status == 200
        return await r.json()


async def test_sync_client_raw_response_headers_token_ids_and_logprobs_equal_the_engine(gateway, worker, http):
    s = gateway.open("t-sync")
    base = gateway.base_url

    def agent():
        c = openai.OpenAI(base_url=f"{base}/v1", api_key=s.key, max_retries=0)
        t0 = time.perf_counter()
        raw = c.chat.completions.with_raw_response.create(
            model="tiny", messages=USER, max_tokens=12, seed=7, logprobs=True, extra_body={"return_token_ids": True}
        )
        return raw.headers, raw.parse(), time.perf_counter() - t0

    headers, cc, waited_s = await asyncio.to_thread(agent)
    assert headers[WEIGHT_VERSION_HEADER] == "0"
    name, dur = headers[SERVER_TIMING_HEADER].split(";dur=")  # the engine's part of what the agent waited
    assert name == "engine" and 0 < float(dur) / 1e3 < waited_s
    ch = cc.choices[0]
    prompt, tokens = extra(cc)["prompt_token_ids"], extra(ch)["token_ids"]
    assert prompt == ByteChatFormat().render(USER, None)
    eng = await direct(http, worker, prompt, 12, 7)
    assert tokens == eng["tokens"]  # token for token what the engine samples
    assert [e.logprob for e in ch.logprobs.content] == pytest.approx(eng["logprobs"])
    assert cc.usage is not None and cc.usage.completion_tokens == len(tokens) and ch.finish_reason in ("stop", "length")
    rec = s.record()["samples"][0]
    assert rec["tokens"][: len(prompt)] == prompt and rec["tokens"][len(prompt) : len(prompt) + len(tokens)] == tokens
    assert rec["mask"][: len(prompt) + len(tokens)] == [0] * len(prompt) + [1] * len(tokens)
    assert rec["logprobs"][len(prompt) : len(prompt) + len(tokens)] == pytest.approx(eng["logprobs"])
    assert rec["weight_versions"] == [0]


async def test_async_streaming_multi_turn_extends_the_held_tokens_without_retokenizing(gateway, worker, http):
    s = gateway.open("t-stream")
    c = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/sessions/{s.key}/v1", api_key="unused", max_retries=0)
    first = await c.chat.completions.create(model="tiny", messages=USER, max_tokens=6, seed=1)
    msgs = [*USER, first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and 2+2?"}]
    chunks = [
        ch
        async for ch in await c.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_tokens=6,
            seed=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
    ]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert len(finish) == 1 and (chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1)
    prompt = extra(chunks[0])["prompt_token_ids"]
    t = s.tokens
    assert t.forks == 0 and len(t.samples) == 1 and t.current.turns == 2
    seg1, seg2 = [x for x in t.current.segments if x.sampled]
    # the second prompt holds the first turn's sampled ids exactly (the answer text was not re-tokenized)
    assert prompt[seg1.start : seg1.end] == t.current.tokens[seg1.start : seg1.end]
    assert prompt[: seg1.end] == t.current.tokens[: seg1.end]
    eng = await direct(http, worker, prompt, 6, 2)
    assert t.current.tokens[seg2.start : seg2.end] == eng["tokens"]
    assert text == ByteChatFormat().answer(eng["tokens"]).content
    await c.close()


async def test_rewritten_history_is_a_counted_fork(gateway):
    s = gateway.open("t-fork")
    c = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key=s.key, max_retries=0)
    await c.chat.completions.create(model="tiny", messages=USER, max_tokens=4)
    edited = [*USER, {"role": "assistant", "content": "compacted"}, {"role": "user", "content": "go"}]
    await c.chat.completions.create(model="tiny", messages=edited, max_tokens=4)
    rec = s.record()
    assert rec["forks"] == 1 and len(rec["samples"]) == 2 and [t["fork"] for t in rec["turn_log"]] == [True, True]
    assert rec["samples"][1]["tokens"][: rec["samples"][1]["prompt_len"]] == ByteChatFormat().render(edited, None)
    await c.close()


async def test_errors_arrive_as_the_sdks_exception_classes(gateway):
    s = gateway.open("t-err")
    c = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key=s.key, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-nope", max_retries=0).models.list()
    for bad in (
        {"n": 2},
        {"temperature": 3.0},
        {"max_tokens": 0},
        {"stop": [1]},
        {"tools": [{"type": "function"}]},
        {"tool_choice": {"type": "function", "function": {"name": "absent"}}},
        {"max_tokens": 10**6},
    ):
        with pytest.raises(openai.BadRequestError) as err:
            await c.chat.completions.create(model="tiny", messages=USER, **bad)
        assert extra_body(err.value)["param"] is not None  # OpenAI's error shape, naming the parameter
    with pytest.raises(openai.BadRequestError):
        wizard: list[Any] = [{"role": "wizard", "content": "x"}]
        await c.chat.completions.create(model="tiny", messages=wizard)
    with pytest.raises(openai.APIStatusError) as big:
        await c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x" * (2 << 20)}])
    assert big.value.status_code == 413
    assert (await c.models.list()).data[0].id == "tiny"
    gateway.close(s)  # the trajectory ended: its key expires with it
    with pytest.raises(openai.AuthenticationError):
        await c.models.list()
    await c.close()


async def test_sessions_open_with_back_pressure_only_before_they_start(gateway, http):
    gateway.sessions.max_sessions = len(gateway.sessions) + 1
    hdr = {"Authorization": f"Bearer {gateway.runner_token}"}
    async with http.post(f"{gateway.base_url}/v1/pearl/sessions", json={"trajectory": "a"}, headers=hdr) as r:
        assert r.status == 200
        opened = await r.json()
    c = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.RateLimitError) as err:  # the runner's SDK client sees 429 + Retry-After
        await c.post(
            "/pearl/sessions",
            cast_to=object,
            body={"trajectory": "b"},
            options={"headers": {"Authorization": hdr["Authorization"]}},
        )
    assert err.value.response.headers["retry-after"] == "1"
    # the open session itself is never refused
    ok = openai.AsyncOpenAI(base_url=opened["base_url"], api_key="unused", max_retries=0)
    assert (await ok.chat.completions.create(model="tiny", messages=USER, max_tokens=2)).choices
    async with http.post(f"{gateway.base_url}/v1/pearl/sessions", json={}, headers={"Authorization": "Bearer no"}) as r:
        assert r.status == 401
    await c.close()
    await ok.close()


async def test_completions_with_token_ids_and_text(gateway, worker, http):
    s = gateway.open("t-cmpl")
    c = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key=s.key, max_retries=0)
    prompt = TOKENIZER.encode("2+2=")
    out = await c.completions.create(
        model="tiny", prompt=prompt, max_tokens=5, seed=3, logprobs=0, extra_body={"return_token_ids": True}
    )
    ch = out.choices[0]
    eng = await direct(http, worker, prompt, 5, 3)
    assert extra(ch)["token_ids"] == eng["tokens"]
    assert ch.logprobs is not None and ch.logprobs.token_logprobs == pytest.approx(eng["logprobs"])
    # a longer prompt that extends the held tokens is appended (no fork)
    held = s.tokens.current.tokens
    await c.completions.create(model="tiny", prompt=[*held, 65, 66], max_tokens=3)
    assert s.tokens.forks == 0 and s.tokens.current.turns == 2
    await c.completions.create(model="tiny", prompt="other text", max_tokens=3)
    assert s.tokens.forks == 1
    with pytest.raises(openai.BadRequestError):
        await c.completions.create(model="tiny", prompt=[10**6], max_tokens=3)
    await c.close()


async def test_a_whole_batch_of_sessions_concurrently(gateway):
    n = 32
    sessions = [gateway.open(f"t-batch-{i}") for i in range(n)]

    async def agent(key: str) -> int:
        async with openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key=key, max_retries=0) as c:
            msgs = list(USER)
            for _ in range(2):
                r = await c.chat.completions.create(model="tiny", messages=msgs, max_tokens=4)
                msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "next"}]
            return len(msgs)

    assert await asyncio.gather(*(agent(s.key) for s in sessions)) == [5] * n
    assert all(s.tokens.forks == 0 and s.tokens.current.turns == 2 for s in sessions)


async def test_a_turn_aborted_by_a_drain_is_resumed_on_another_worker_and_answered_once(http):
    """Worker A is drained mid-turn: the agent gets one complete answer, A's partial prefix then B's rest."""
    (ra, a, sa), (rb, b, _sb) = await start_worker("emulated", time_factor=0.2), await start_worker("emulated")
    gw = Gateway(ByteChatFormat(), WorkerBackend([a, b], SECRET, http))
    runner, _ = await serve(gw)
    try:
        s = gw.open("t-drain")
        c = openai.AsyncOpenAI(base_url=f"{gw.base_url}/v1", api_key=s.key, max_retries=0)
        turn = asyncio.ensure_future(
            c.chat.completions.create(
                model="tiny", messages=USER, max_tokens=400, extra_body={"return_token_ids": True}
            )
        )
        for _ in range(200):  # until A decodes
            await asyncio.sleep(0.02)
            if sa.engine.running() and sa.engine.inflight() and sa.engine.inflight()[0].get("tokens"):
                break
        async with http.post(f"{a}/drain", json={"mode": "abort"}, headers={"Authorization": f"Bearer {SECRET}"}) as r:
            assert r.status == 200
            partial = (await r.json())["aborted"][0]["tokens"]
        out = await turn
        ids = extra(out.choices[0])["token_ids"]
        assert 0 < len(partial) < len(ids) and ids[: len(partial)] == partial
        assert s.turns[0].workers == [0, 0] or len(s.turns[0].workers) == 2
        assert s.tokens.current.turns == 1 and s.tokens.current.mask.count(1) == len(ids)
        await c.close()
    finally:
        await runner.cleanup()
        await ra.cleanup()
        await rb.cleanup()


class ScriptedBackend:
    """Stands in for a model that calls tools (the tiny model does not): answers each turn with a fixed
    token sequence; everything else (templates, parsing, the wire) is the gateway's own."""

    model = "tiny"

    def __init__(self, answers: list[list[int]]) -> None:
        self.answers = answers

    def weight_version(self) -> int:
        return 3

    async def generate(self, session, prompt, new, sampling) -> Generation:
        ids = self.answers.pop(0)
        return Generation(ids, [-0.5] * len(ids), "stop", 3, [1])


TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


def call_ids(name: str, args: dict) -> list[int]:
    body = TOKENIZER.encode(json.dumps({"name": name, "arguments": args}), add_bos=False)
    return [TOOL_CALL_ID, *body, TOOL_CALL_END_ID, TOKENIZER.eos_id]


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_calls_are_parsed_and_tool_results_templated_back(stream):
    fmt = ByteChatFormat()
    gw = Gateway(
        fmt,
        ScriptedBackend([call_ids("add", {"a": 1, "b": 2}), [*TOKENIZER.encode("3", add_bos=False), TOKENIZER.eos_id]]),
    )
    runner, _ = await serve(gw)
    try:
        s = gw.open("t-tools")
        c = openai.AsyncOpenAI(base_url=f"{gw.base_url}/v1", api_key=s.key, max_retries=0)
        kw: dict[str, Any] = dict(model="tiny", messages=USER, tools=TOOLS, tool_choice="auto")
        if stream:
            calls: dict[int, dict] = {}
            finish = None
            async for ch in await c.chat.completions.create(**kw, stream=True):
                for tc in ch.choices[0].delta.tool_calls or []:
                    calls.setdefault(tc.index, {"id": tc.id, "name": tc.function.name, "arguments": ""})
                    calls[tc.index]["arguments"] += tc.function.arguments or ""
                finish = ch.choices[0].finish_reason or finish
            call = calls[0]
            msg = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["name"], "arguments": call["arguments"]},
                    }
                ],
            }
        else:
            raw = await c.chat.completions.with_raw_response.create(**kw)
            assert raw.headers[WEIGHT_VERSION_HEADER] == "3"
            out = raw.parse()
            finish = out.choices[0].finish_reason
            tc = out.choices[0].message.tool_calls[0]
            call = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments}
            msg = out.choices[0].message.model_dump(exclude_none=True)
        assert finish == "tool_calls" and call["name"] == "add" and json.loads(call["arguments"]) == {"a": 1, "b": 2}
        msgs = [*USER, msg, {"role": "tool", "tool_call_id": call["id"], "content": "3"}]
        final = await c.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS)
        assert final.choices[0].message.content == "3" and final.choices[0].finish_reason == "stop"
        sample = s.tokens.current
        assert s.tokens.forks == 0 and sample.turns == 2
        tool_part = fmt.delta([msgs[-1]], TOOLS)  # the tool result, templated after the sampled call
        seg1, seg2 = [x for x in sample.segments if x.sampled]
        assert sample.tokens[seg1.end : seg2.start] == fmt.closing(call_ids("add", {})) + tool_part
        assert all(m == 0 for m in sample.mask[seg1.end : seg2.start]) and sample.mask[seg2.start : seg2.end] == [1, 1]
        await c.close()
    finally:
        await runner.cleanup()


async def test_stop_strings_cut_the_turn_after_the_token_that_completes_them():
    fmt = ByteChatFormat()
    gw = Gateway(fmt, ScriptedBackend([TOKENIZER.encode("abc STOP def", add_bos=False)]))
    runner, _ = await serve(gw)
    try:
        s = gw.open("t-stop")
        c = openai.AsyncOpenAI(base_url=f"{gw.base_url}/v1", api_key=s.key, max_retries=0)
        out = await c.chat.completions.create(
            model="tiny", messages=USER, stop=["STOP"], extra_body={"return_token_ids": True}
        )
        assert out.choices[0].message.content == "abc " and out.choices[0].finish_reason == "stop"
        assert fmt.decode(extra(out.choices[0])["token_ids"]) == "abc STOP"  # trained on what it sampled up to there
        await c.close()
    finally:
        await runner.cleanup()
