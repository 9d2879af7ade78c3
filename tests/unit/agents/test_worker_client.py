"""The one worker client (agents.worker_client) against a real worker data plane (an emulated engine): typed
results, a refusal as WorkerCallError with its status (also when the body is not JSON), a worker that is gone
as one of UNREACHABLE; the rollout driver turns both into WorkerUnavailable (the turn is routed again)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestServer

from agents import dataplane as dp
from agents.driver.episodes import WorkerUnavailable, _unavailable_on_failure
from agents.engines.emulated import EmulatedEngine
from agents.worker import WorkerServer
from agents.worker_client import UNREACHABLE, WorkerCallError, WorkerClient, generate_disaggregated, session

SECRET = "dp-secret"


@pytest.fixture
async def worker():
    srv = TestServer(
        WorkerServer(EmulatedEngine(model="qwen3-8b", hardware="H800", tp=2, time_factor=1e-4), SECRET).app,
        host="127.0.0.1",
    )
    await srv.start_server()
    s = session(30.0)
    yield str(srv.make_url("")).rstrip("/"), s
    await s.close()
    await srv.close()


def _req(rid: str) -> dp.GenerateRequest:
    return dp.GenerateRequest(request_id=rid, prompt_tokens=[5, 6, 7, 8], sampling=dp.SamplingParams(max_tokens=4))


async def test_a_typed_turn_and_the_refusals(worker):
    endpoint, s = worker
    out = await WorkerClient(endpoint, SECRET, s).generate(_req("a"))
    assert isinstance(out, dp.GenerationResult) and out.request_id == "a" and 1 <= len(out.tokens) <= 4
    with pytest.raises(WorkerCallError) as refused:
        await WorkerClient(endpoint, "not-the-secret", s).generate(_req("b"))
    assert refused.value.status == 401 and refused.value.endpoint == endpoint
    with pytest.raises(WorkerCallError) as unknown:  # aiohttp's plain-text 404, not JSON
        await WorkerClient(endpoint, SECRET, s).call("no-such-verb")
    assert unknown.value.status == 404


async def test_the_driver_routes_a_refused_or_vanished_turn_again(worker):
    endpoint, s = worker
    with pytest.raises(WorkerUnavailable, match="HTTP 401"):
        await _unavailable_on_failure(WorkerClient(endpoint, "wrong", s).generate(_req("c")))
    gone = WorkerClient("http://127.0.0.1:9", SECRET, s)  # the discard port: nothing listens
    with pytest.raises(UNREACHABLE):
        await gone.generate(_req("d"))
    with pytest.raises(WorkerUnavailable):
        await _unavailable_on_failure(gone.generate(_req("e")))


async def test_prefill_then_decode_hands_the_kv_over(worker):
    endpoint, s = worker
    client = WorkerClient(endpoint, SECRET, s)
    await client.call("role", {"role": "prefill"})
    prefill = client
    decode_srv = TestServer(
        WorkerServer(EmulatedEngine(model="qwen3-8b", hardware="H800", tp=2, time_factor=1e-4), SECRET).app,
        host="127.0.0.1",
    )
    await decode_srv.start_server()
    try:
        decode = WorkerClient(str(decode_srv.make_url("")).rstrip("/"), SECRET, s)
        await decode.call("role", {"role": "decode"})
        req = dp.GenerateRequest(
            request_id="pd",
            prompt_tokens=list(range(1, 40)),
            sampling=dp.SamplingParams(max_tokens=6, stop_at_eos=False),
        )
        out = await generate_disaggregated(prefill, decode, req)
        assert len(out.tokens) == 6
        assert (await prefill.stats()).kv_bytes_out > 0 and (await decode.stats()).kv_bytes_in > 0
    finally:
        await decode_srv.close()
