"""Real prefill/decode disaggregation across two torch worker processes.

The same two processes first serve colocated, then switch roles in place (no restart, no reload)
to prefill and decode; greedy outputs must be identical token for token.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

from agents import dataplane as dp
from agents.process import spawn_worker
from agents.worker_client import WorkerCallError, WorkerClient, generate_disaggregated, session

pytestmark = pytest.mark.asyncio(loop_scope="module")

PROMPTS = ["hello world", "The quick brown fox jumps over", "PEARL: elastic rollout", "x"]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("pd")
    a = await spawn_worker(worker_id=1, engine="torch", role="colocated", state_dir=base / "w1")
    b = await spawn_worker(worker_id=2, engine="torch", role="colocated", state_dir=base / "w2")
    s = session()
    yield WorkerClient(a.endpoint, a.secret, s), WorkerClient(b.endpoint, b.secret, s), a, b
    await s.close()
    await a.stop()
    await b.stop()


def _req(i: int, prompt: str, n: int = 12) -> dp.GenerateRequest:
    return dp.GenerateRequest(
        request_id=f"r{i}-{n}", prompt=prompt, sampling=dp.SamplingParams(max_tokens=n, stop_at_eos=False)
    )


async def test_disaggregated_greedy_equals_colocated(pair):
    a, b, pa, _pb = pair
    colocated = [await a.generate(_req(i, p)) for i, p in enumerate(PROMPTS)]
    assert all(len(r.tokens) == 12 and r.finish_reason == "length" for r in colocated)

    pid_a, pid_b = (await a.get("health"))["pid"], (await b.get("health"))["pid"]
    await a.call("role", {"role": "prefill"})
    await b.call("role", {"role": "decode"})
    disagg = [await generate_disaggregated(a, b, _req(i, p)) for i, p in enumerate(PROMPTS)]

    assert [r.tokens for r in disagg] == [r.tokens for r in colocated]
    for r, c in zip(disagg, colocated):
        assert r.logprobs == pytest.approx(c.logprobs, abs=1e-5)
    assert all(r.worker_id == 2 for r in disagg)  # decoded on the decode worker
    # the KV cache really moved between the processes
    sa, sb = await a.stats(), await b.stats()
    assert sa.kv_bytes_out > 0 and sb.kv_bytes_in == sa.kv_bytes_out
    assert sa.decode_iterations == sum(len(r.tokens) - 1 for r in colocated)  # only the colocated phase decoded on A
    # role change in place: same processes
    assert (await a.get("health"))["pid"] == pid_a == pa.pid and (await b.get("health"))["pid"] == pid_b


async def test_role_admission_and_kv_handles(pair):
    a, b, _, _ = pair
    await a.call("role", {"role": "prefill"})
    await b.call("role", {"role": "decode"})
    with pytest.raises(WorkerCallError) as err:
        await a.generate(_req(9, "hi"))
    assert err.value.status == 409
    pre = await a.prefill(_req(10, "some prompt"))
    # a handle is pulled once; the second pull is an unknown handle (404), and so is a made-up one
    dec = dp.DecodeRequest(
        request_id="d10",
        kv_url=a.endpoint,
        handle=pre.handle,
        kv_token=pre.kv_token,
        sampling=dp.SamplingParams(max_tokens=4),
    )
    out = await b.decode(dec)
    assert out.tokens[0] == pre.first_token and len(out.tokens) == 4
    with pytest.raises(WorkerCallError) as err:
        await b.decode(dp.DecodeRequest(request_id="d11", kv_url=a.endpoint, handle=pre.handle, kv_token=pre.kv_token))
    assert err.value.status == 404
    with pytest.raises(WorkerCallError) as err:
        await b.decode(dp.DecodeRequest(request_id="d12", kv_url=a.endpoint, handle="nope", kv_token="x"))
    assert err.value.status == 404
    # a wrong capability token cannot pull someone else's cache
    pre2 = await a.prefill(_req(13, "another"))
    async with a.session.get(f"{a.endpoint}/kv/{pre2.handle}", headers={dp.KV_TOKEN_HEADER: "wrong"}) as resp:
        assert resp.status == 403


async def test_bad_input_gets_4xx(pair):
    a, _, _, _ = pair
    await a.call("role", {"role": "colocated"})
    s = a.session
    async with s.post(f"{a.endpoint}/generate", json={"request_id": "x", "prompt": "hi"}) as resp:
        assert resp.status == 401  # no secret
    async with s.post(f"{a.endpoint}/generate", data=b"{not json", headers=a.headers) as resp:
        assert resp.status == 400 and "JSON" in (await resp.json())["error"]
    async with s.post(
        f"{a.endpoint}/generate", json={"request_id": "x", "prompt": "hi", "bogus": 1}, headers=a.headers
    ) as resp:
        assert resp.status == 400 and "bogus" in (await resp.json())["error"]
    async with s.post(
        f"{a.endpoint}/generate", json={"request_id": "x", "prompt_tokens": [1, 99999]}, headers=a.headers
    ) as resp:
        assert resp.status == 400 and "vocabulary" in (await resp.json())["error"]
    async with s.post(
        f"{a.endpoint}/generate",
        json={"request_id": "x", "prompt": "hi", "sampling": {"max_tokens": 10**9}},
        headers=a.headers,
    ) as resp:
        assert resp.status == 400 and "max_tokens" in (await resp.json())["error"]
    async with s.post(f"{a.endpoint}/generate", data=b"x" * (dp.MAX_REQUEST_BYTES + 10), headers=a.headers) as resp:
        assert resp.status == 413
    async with s.post(f"{a.endpoint}/role", json={"role": "janitor"}, headers=a.headers) as resp:
        assert resp.status == 400
    # a stale epoch on a control verb is refused
    await a.call("role", {"role": "colocated"}, epoch=5)
    with pytest.raises(WorkerCallError) as err:
        await a.call("role", {"role": "prefill"}, epoch=4)
    assert err.value.status == 409
    assert (await a.get("health"))["role"] == "colocated"
