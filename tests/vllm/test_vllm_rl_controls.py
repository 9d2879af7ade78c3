"""RL controls on a real vLLM worker: a trainer's weights installed in place (no restart), and pause /
resume / sleep with the partial outputs of what was in flight returned."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import ClientSession

from tests.vllm.conftest import Worker, save_tiny, start_worker
from tests.vllm.test_vllm_pd import hand_off, prompt, turn

TRAINED_SEED = 1  # the "trainer's" next weights: the tiny model from another seed, same architecture

pytest.importorskip("vllm")
pytest.importorskip("nixl")
pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def fresh(tmp_path_factory: pytest.TempPathFactory, http: ClientSession) -> AsyncIterator[Worker]:
    """A vLLM worker started from the trained weights on disk (no KV connector: colocated only)."""
    model = save_tiny(tmp_path_factory.mktemp("vllm-trained") / "tiny", seed=TRAINED_SEED)
    worker = await start_worker(model, 3, http, kv_connector="")
    try:
        yield worker
    finally:
        with contextlib.suppress(Exception):
            await worker.runner.cleanup()


def trained_snapshot() -> bytes:
    """What a trainer publishes: safetensors bytes of the wire state dict (tied weights once)."""
    from safetensors.torch import save

    from agents import models

    return save(models.state_dict_for_wire(models.load_model("tiny", seed=TRAINED_SEED)))


async def test_weights_installed_in_place_equal_a_fresh_engine_and_no_stale_kv_is_reused(
    pd: tuple[Worker, Worker], fresh: Worker
) -> None:
    from agents.engines.base import EngineConflict

    p, d = pd
    tokens = prompt(300, 21)  # long enough that a stale prefix-cache hit would decide the output
    await d.role("colocated")
    status, before = await d.call("generate", turn("w-before", tokens))
    assert status == 200
    snapshot = trained_snapshot()
    await d.engine.load_weights(3, snapshot)
    status, health = await d.call("health", method="GET")
    assert health["weight_version"] == 3 and d.engine.install_s > 0
    assert await d.engine.llm.get_weight_version() == "3"  # vLLM's own record of it
    status, after = await d.call("generate", turn("w-after", tokens))
    status, ref = await fresh.call("generate", turn("w-ref", tokens))
    assert status == 200 and after["tokens"] == ref["tokens"]
    assert after["logprobs"] == pytest.approx(ref["logprobs"], abs=1e-3)
    # a weak random model with tied embeddings tends to repeat the prompt's last token under any seed, so the
    # tokens alone may not show the install: the log-probabilities do
    assert after["logprobs"] != pytest.approx(before["logprobs"], abs=1e-3)
    assert after["weight_version"] == 3
    others = [prompt(n, 30 + n) for n in (7, 64, 129)]
    for i, other in enumerate(others):
        _, mine = await d.call("generate", turn(f"w-o{i}", other))
        _, theirs = await fresh.call("generate", turn(f"w-r{i}", other))
        assert mine["tokens"] == theirs["tokens"], i
    with pytest.raises(EngineConflict, match="refusing to go back"):
        await d.engine.load_weights(2, snapshot)
    await d.engine.load_weights(3, snapshot)  # the version held: nothing to do
    assert d.engine.weight_version == 3
    # the prefill worker gets the same version; a hand-off between them then equals the fresh engine too
    await p.engine.load_weights(3, snapshot)
    await p.role("prefill")
    await d.role("decode")
    _, (status, res) = await hand_off(p, d, "w-pd", tokens)
    assert status == 200 and res["tokens"] == ref["tokens"]


async def long_turn(w: Worker, rid: str) -> asyncio.Task:
    task = asyncio.create_task(w.call("generate", turn(rid, [256, 97, 98], 3000)))
    for _ in range(3000):  # until it has decoded a few tokens
        s = next((s for s in w.engine.inflight() if s["request_id"] == rid), None)
        if s is not None and len(s["tokens"]) >= 4:
            return task
        await asyncio.sleep(0.01)
    raise AssertionError("the long turn never decoded")


async def test_drain_aborts_in_flight_turns_with_their_partial_tokens_and_resume_serves_again(fresh: Worker) -> None:
    w = fresh
    task = await long_turn(w, "long-0")
    status, drained = await w.call("drain", {"mode": "abort", "timeout_s": 0})
    assert status == 200 and drained["finished_in_time"] is False
    [partial] = drained["aborted"]
    assert partial["request_id"] == "long-0" and partial["finish_reason"] == "abort"
    assert 4 <= len(partial["tokens"]) < 3000
    status, answered = await asyncio.wait_for(task, 10)  # the caller gets its partial output too
    assert status == 200 and answered["finish_reason"] == "abort"
    assert answered["tokens"][: len(partial["tokens"])] == partial["tokens"]
    status, body = await w.call("generate", turn("refused", [256, 97], 4))
    assert status == 503 and "draining" in body["error"]
    status, health = await w.call("resume", {})
    assert status == 200 and health["state"] == "running"
    status, res = await w.call("generate", turn("after", [256, 97, 98], 6))
    assert status == 200 and res["finish_reason"] == "length"
    n = min(6, len(answered["tokens"]))
    assert res["tokens"][:n] == answered["tokens"][:n]  # greedy: the same continuation as before the pause


async def test_drain_waits_for_short_turns_and_sleep_is_a_pause_on_cpu(fresh: Worker) -> None:
    w = fresh
    short = [asyncio.create_task(w.call("generate", turn(f"s{i}", [256, 90 + i], 8))) for i in range(3)]
    await asyncio.sleep(0.05)
    status, drained = await w.call("drain", {"mode": "wait", "timeout_s": 30})
    assert status == 200 and drained["finished_in_time"] is True and drained["aborted"] == []
    assert all(r[0] == 200 and r[1]["finish_reason"] == "length" for r in await asyncio.gather(*short))
    await w.call("resume", {})
    status, health = await w.call("sleep", {"level": 2})
    assert status == 200 and health["state"] == "sleeping" and health["sleep_mode"] == "pause"
    status, _ = await w.call("generate", turn("asleep", [256, 97], 4))
    assert status == 503
    status, health = await w.call("wake", {})
    assert status == 200 and health["state"] == "running"
    status, res = await w.call("generate", turn("awake", [256, 97], 4))
    assert status == 200 and len(res["tokens"]) == 4
