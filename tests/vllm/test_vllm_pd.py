"""Prefill → KV hand-off → decode between two real vLLM workers through vLLM's NixlConnector (UCX, DRAM on
this CPU-only machine), driven through PEARL's worker data plane as the rollout driver drives it."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from typing import Any

import pytest

from tests.vllm.conftest import PREFILL_LEASE_S, Worker

pytest.importorskip("vllm")
pytest.importorskip("nixl")
pytestmark = pytest.mark.asyncio(loop_scope="session")


def prompt(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(250) for _ in range(n)]


def turn(rid: str, tokens: list[int], max_tokens: int = 12) -> dict[str, Any]:
    return {"request_id": rid, "prompt_tokens": tokens, "sampling": {"max_tokens": max_tokens, "stop_at_eos": False}}


async def hand_off(
    p: Worker, d: Worker, rid: str, tokens: list[int], max_tokens: int = 12
) -> tuple[dict, tuple[int, Any]]:
    status, pre = await p.call("prefill", turn(rid, tokens, max_tokens))
    assert status == 200, pre
    body = {
        "request_id": f"{rid}-d",
        "kv_url": p.url,
        "handle": pre["handle"],
        "kv_token": pre["kv_token"],
        "sampling": {"max_tokens": max_tokens, "stop_at_eos": False},
    }
    return pre, await d.call("decode", body)


async def test_greedy_prefill_then_decode_equals_colocated_token_for_token(pd: tuple[Worker, Worker]) -> None:
    p, d = pd
    prompts = [prompt(n, seed) for seed, n in enumerate((5, 37, 200, 300))]  # inside one block, across many
    await p.role("colocated")
    colocated = []
    for i, tokens in enumerate(prompts):
        status, res = await p.call("generate", turn(f"co-{i}", tokens))
        assert status == 200 and len(res["tokens"]) == 12
        colocated.append(res)
    await p.role("prefill")
    await d.role("decode")
    await d.telemetry()  # start from an empty buffer
    sizes = []
    for i, tokens in enumerate(prompts):
        pre, (status, res) = await hand_off(p, d, f"pd-{i}", tokens)
        assert status == 200, res
        assert res["tokens"] == colocated[i]["tokens"], i
        assert pre["first_token"] == colocated[i]["tokens"][0]
        assert res["finish_reason"] == "length" and len(res["logprobs"]) == 12
        sizes.append(pre["kv_bytes"])
    # the tiny model in bf16: 2 layers x K,V x 2 KV heads x 32 dims x 2 bytes per token, whole blocks
    assert all(s > 0 and s % (2 * 2 * 2 * 32 * 2) == 0 for s in sizes)
    assert sizes[3] > sizes[2] > sizes[0]
    moved = [r for r in await d.telemetry() if r["kind"] == "kv_transfer"]
    assert moved and all(r["kv_bytes"] > 0 and r["duration_s"] > 0 for r in moved)
    assert sum(r["kv_bytes"] for r in moved) <= sum(sizes)  # what NIXL read, by its own count
    assert d.engine.kv_counts.get("num_failed_transfers", 0) == 0


def silent_peer() -> socket.socket:
    """A prefill worker that hangs: its side channel accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    return s


async def test_a_decode_whose_kv_pull_fails_answers_an_error_and_one_aborted_mid_pull_returns_at_once(
    pd: tuple[Worker, Worker],
) -> None:
    """vLLM's handshake with a hung peer times out (5 s) and, under kv_load_failure_policy "fail", the decode
    ends with an error the worker answers 502 to (the driver then runs the turn again: a recompute). A
    decode aborted while its pull is pending comes back as an abort with no tokens, not after the timeout."""
    import json

    from agents.dataplane import DecodeRequest, SamplingParams
    from agents.engines.base import EngineError

    p, d = pd
    await p.role("prefill")
    await d.role("decode")
    status, pre = await p.call("prefill", turn("hung-0", prompt(64, 7)))
    assert status == 200
    descriptor = json.loads(p.engine.pull_kv(pre["handle"], None))
    peer = silent_peer()
    try:
        params = descriptor["kv_transfer_params"]
        params["remote_port"], params["remote_engine_id"] = peer.getsockname()[1], "hung-prefill-engine"
        data = json.dumps(descriptor).encode()
        sampling = SamplingParams(max_tokens=8, stop_at_eos=False)
        t0 = time.monotonic()
        try:
            await asyncio.wait_for(d.engine.decode(DecodeRequest("hung-d", p.url, "h", sampling=sampling), data), 60)
            raise AssertionError("a decode whose KV never arrived produced tokens")
        except EngineError as exc:
            assert exc.status == 502 and "KV pull" in str(exc)
        assert time.monotonic() - t0 < 45
        task = asyncio.create_task(d.engine.decode(DecodeRequest("hung-a", p.url, "h", sampling=sampling), data))
        for _ in range(200):
            if "hung-a" in d.engine._inflight:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.5)
        t1 = time.monotonic()
        aborted = await d.engine.abort("hung-a")
        res = await asyncio.wait_for(task, 10)
        assert aborted is not None and aborted.finish_reason == "abort" and res.finish_reason == "abort"
        assert res.tokens == [] and time.monotonic() - t1 < 4
    finally:
        peer.close()
    # the worker is fine afterwards: a real hand-off still works
    _, (status, res) = await hand_off(p, d, "after-hung", prompt(40, 8))
    assert status == 200 and len(res["tokens"]) == 12


async def test_the_prefill_side_returning_its_worker_mid_hand_off(pd: tuple[Worker, Worker]) -> None:
    """Drained (Training Begin returns it) between prefill and decode: vLLM keeps the prefilled blocks
    pinned for the lease, so the decode still gets them, exact. Put to sleep: its descriptors go, and the
    decode is refused (404) at once: the driver recomputes the turn."""
    p, d = pd
    await p.role("colocated")
    tokens = prompt(150, 11)
    status, ref = await p.call("generate", turn("ret-ref", tokens))
    assert status == 200
    await p.role("prefill")
    await d.role("decode")
    status, pre = await p.call("prefill", turn("ret-0", tokens))
    status, drained = await p.call("drain", {"mode": "abort", "timeout_s": 0})
    assert status == 200 and drained["aborted"] == []
    status, res = await d.call(
        "decode",
        {
            "request_id": "ret-0-d",
            "kv_url": p.url,
            "handle": pre["handle"],
            "kv_token": pre["kv_token"],
            "sampling": {"max_tokens": 12, "stop_at_eos": False},
        },
    )
    assert status == 200 and res["tokens"] == ref["tokens"]
    status, _ = await p.call("resume", {})
    assert status == 200
    status, pre = await p.call("prefill", turn("ret-1", tokens))
    assert status == 200
    status, health = await p.call("sleep", {"level": 1})
    assert status == 200 and health["state"] == "sleeping" and health["sleep_mode"] == "pause"
    status, res = await d.call(
        "decode",
        {
            "request_id": "ret-1-d",
            "kv_url": p.url,
            "handle": pre["handle"],
            "kv_token": pre["kv_token"],
            "sampling": {"max_tokens": 12},
        },
    )
    assert status == 404 and "unknown KV handle" in res["error"]
    status, health = await p.call("wake", {})
    assert status == 200 and health["state"] == "running"


async def test_a_descriptor_past_its_lease_is_refused(pd: tuple[Worker, Worker]) -> None:
    """PEARL's lease on the descriptor ends first (404 for a late decode: the driver recomputes), vLLM's
    lease on the blocks (kv_lease_duration, 30 s longer) after it, so no decode reads freed blocks. (vLLM
    logs each release, "Releasing expired KV blocks for request ..."; its counter is per interval, not per
    request, so this test does not assert on it.)"""
    p, d = pd
    await p.role("prefill")
    await d.role("decode")
    status, pre = await p.call("prefill", turn("late-0", prompt(80, 13)))
    assert status == 200
    p.engine.kv.lease_s = 1.0  # PEARL's lease on descriptors, short for this test (vLLM's was fixed at start)
    try:
        await asyncio.sleep(1.5)
        status, res = await d.call(
            "decode",
            {
                "request_id": "late-0-d",
                "kv_url": p.url,
                "handle": pre["handle"],
                "kv_token": pre["kv_token"],
                "sampling": {"max_tokens": 4},
            },
        )
    finally:
        p.engine.kv.lease_s = PREFILL_LEASE_S
    assert status == 404 and "unknown KV handle" in res["error"]
