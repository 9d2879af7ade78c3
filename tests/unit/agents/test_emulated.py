"""The emulated engine in-process: same protocol and roles as torch, time from the core profile."""

from __future__ import annotations

import asyncio

import pytest

from agents.dataplane import DecodeRequest, GenerateRequest, SamplingParams
from agents.engines.base import EngineConflict, EngineUnavailable
from agents.engines.emulated import EmulatedEngine, synthetic_token
from controlplane.core.profiles import get_profile
from controlplane.core.telemetry import RecordKind

FAST = 0.01  # 100x faster than the emulated H800


def req(i: int, n: int = 8, seed: int | None = None) -> GenerateRequest:
    return GenerateRequest(request_id=f"r{i}", sampling=SamplingParams(max_tokens=n, seed=i if seed is None else seed))


@pytest.fixture
async def engine():
    e = EmulatedEngine(model="qwen3-8b", hardware="H800", tp=2, time_factor=FAST)
    await e.start()
    yield e
    await e.shutdown()


async def test_tokens_are_deterministic_and_pd_equals_colocated(engine):
    colocated = await engine.generate(req(1, 10, seed=42), list(range(50)))
    assert colocated.tokens == [synthetic_token(42, i) for i in range(10)]
    engine.set_role("prefill")
    pre = await engine.prefill(req(2, 10, seed=42), list(range(50)))
    assert pre.kv_bytes == 50 * get_profile("H800", "qwen3-8b", 2).kv_bytes_per_token
    blob = engine.pull_kv(pre.handle, pre.kv_token)
    engine.set_role("decode")
    out = await engine.decode(
        DecodeRequest(
            request_id="d2", kv_url="http://p", handle=pre.handle, sampling=SamplingParams(max_tokens=10, seed=42)
        ),
        blob,
    )
    assert out.tokens == colocated.tokens and out.prompt_len == 50


async def test_hundreds_of_concurrent_sequences_and_telemetry(engine):
    engine.decode_sample_s = 0.0  # every iteration's record
    outs = await asyncio.gather(*[engine.generate(req(i, 16), [i] * 64) for i in range(300)])
    assert all(len(o.tokens) == 16 and o.finish_reason == "length" for o in outs)
    records = engine.take_telemetry()
    decode = [r for r in records if r["kind"] == RecordKind.DECODE_ITERATION]
    assert max(r["running_batch"] for r in decode) == 300
    assert sum(r["tokens"] for r in records if r["kind"] == RecordKind.PREFILL) == 300 * 64
    assert engine.stats().generated_tokens == 300 * 16
    # each engine record names the chip it is timed as (the tracker corrects that chip's costs from it)
    assert {r["hardware"] for r in records if r["kind"] in (RecordKind.DECODE_ITERATION, RecordKind.PREFILL)} == {
        "H800"
    }


async def test_abort_returns_the_partial_output(engine):
    task = asyncio.create_task(engine.generate(req(7, 10_000), [1] * 8))
    while engine.running() == 0 or not engine.inflight()[0]["tokens"][3:]:
        await asyncio.sleep(0.01)
    partial = await engine.abort("r7")
    result = await task
    assert result.finish_reason == "abort" and len(result.tokens) >= 4
    assert partial.tokens == result.tokens[: len(partial.tokens)]
    assert await engine.abort("r7") is None


async def test_drain_sleep_wake_and_admission(engine):
    task = asyncio.create_task(engine.generate(req(8, 10_000), [1] * 8))
    while engine.running() == 0:
        await asyncio.sleep(0.01)
    with pytest.raises(EngineConflict):
        await engine.sleep(1)  # busy
    aborted, in_time = await engine.drain("abort", 0)
    assert not in_time and [a.request_id for a in aborted] == ["r8"]
    assert (await task).finish_reason == "abort"
    with pytest.raises(EngineUnavailable):
        engine.admit("generate")
    engine.resume()
    await engine.sleep(1)
    with pytest.raises(EngineUnavailable, match="asleep"):
        engine.admit("generate")
    await engine.wake()
    engine.admit("generate")
    engine.set_role("decode")
    with pytest.raises(EngineConflict):
        engine.admit("generate")
    with pytest.raises(EngineConflict, match="weight version"):
        engine.set_role("colocated") or engine.admit("generate", min_weight_version=3)


async def test_kv_capacity_limits_the_running_batch():
    profile = get_profile("H800", "qwen3-8b", 2)
    e = EmulatedEngine(profile=profile, time_factor=FAST)
    await e.start()
    try:
        per_seq = (4000 + 7) * profile.kv_bytes_per_token  # prompt + the tokens decoded after the first
        fit = int(profile.hbm_kv_capacity // per_seq)
        outs = await asyncio.gather(*[e.generate(req(i, 8), [i] * 4000) for i in range(fit + 20)])
        assert all(len(o.tokens) == 8 for o in outs)
        peak = max(r["running_batch"] for r in e.take_telemetry() if r["kind"] == RecordKind.DECODE_ITERATION)
        assert peak <= fit
    finally:
        await e.shutdown()


async def test_a_caller_that_goes_away_aborts_its_request(engine):
    task = asyncio.create_task(engine.generate(req(9, 10_000), [1] * 8))
    while engine.running() == 0:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert engine.running() == 0 and engine.inflight() == []
    assert len((await engine.generate(req(9, 3), [1])).tokens) == 3


async def test_decode_iterations_are_sampled_not_all_sent(engine):
    """An engine iterating every few milliseconds sends about one decode record per `decode_sample_s`."""
    await asyncio.gather(*[engine.generate(req(i, 64), [1] * 16) for i in range(8)])
    decode = [r for r in engine.take_telemetry() if r["kind"] == RecordKind.DECODE_ITERATION]
    assert 1 <= len(decode) < engine.stats().decode_iterations


async def test_next_turn_prefills_only_its_new_tokens_until_the_weights_change(engine):
    """The prefix cache: a trajectory's next turn (its context + response + observation) reuses the
    cached blocks of its earlier context; new weights invalidate them."""
    prompt = list(range(1000))
    first = await engine.generate(req(1, 40), prompt)
    before = engine.counters.prefill_tokens
    turn2 = prompt + first.tokens + [7] * 300
    await engine.generate(req(2, 8), turn2)
    computed = engine.counters.prefill_tokens - before
    assert computed < 300 + 40 + 16 and computed >= 300  # the 1000-token prefix came from the cache
    await engine.load_weights(1, _weights())
    before = engine.counters.prefill_tokens
    await engine.generate(req(3, 8), turn2)
    assert engine.counters.prefill_tokens - before == len(turn2)


async def test_a_long_generation_sleeps_per_segment_not_per_iteration(engine):
    """Iterations over which the batch does not change are one wall-clock wait: the engine keeps the
    profile's pace however short an iteration is after time scaling."""
    outs = await asyncio.gather(*[engine.generate(req(i, 200 + 100 * i), [i] * 32) for i in range(4)])
    assert [len(o.tokens) for o in outs] == [200, 300, 400, 500]
    assert engine.stats().decode_iterations >= 499
    assert len(engine.timing_log) <= 8  # one record per segment: the prefill pass, then up to each finish


def _weights() -> bytes:
    import numpy as np
    from safetensors.numpy import save

    return save({"w": np.zeros(4, dtype=np.float32)})


async def test_an_engine_with_more_pd_interference_is_measured_by_the_tracker():
    """`interference` (emulated engines only): a prefill that rides next to running decodes costs that much
    more than its roofline time; the PREFILL records say which prefills did, and the runtime tracker turns
    them into the PD interference I that the colocated closed form carries."""
    from controlplane.core.telemetry import TelemetryRecord
    from controlplane.core.tracker import RuntimeTracker

    prof = get_profile("H800", "qwen3-8b", 2)
    e = EmulatedEngine(model="qwen3-8b", hardware="H800", tp=2, time_factor=FAST, interference=2.0)
    await e.start()
    try:
        tracker = RuntimeTracker(prof, batch_size=64, min_engine_samples=5)
        for wave in range(6):
            first = asyncio.create_task(e.generate(req(100 + wave, 400), [wave] * 512))  # alone: nothing decodes yet
            while e.running() == 0:
                await asyncio.sleep(0.005)
            await asyncio.gather(
                first, *[e.generate(req(10 * wave + i, 4), [7 + i] * (256 + 64 * i)) for i in range(6)]
            )
        records = [TelemetryRecord.from_json(r) for r in e.take_telemetry()]
    finally:
        await e.shutdown()
    prefills = [r for r in records if r.kind is RecordKind.PREFILL]
    mixed = [r for r in prefills if r.running_batch > 0]
    alone = [r for r in prefills if r.running_batch == 0]
    assert mixed and alone
    for r in mixed:
        assert r.duration_s == pytest.approx(2.0 * prof.prefill_s(r.tokens, r.prefix_tokens), rel=1e-6)
    for r in alone:
        assert r.duration_s == pytest.approx(prof.prefill_s(r.tokens, r.prefix_tokens), rel=1e-6)
    for r in records:
        tracker.observe(r)
    assert tracker.interference().value == pytest.approx(2.0, rel=1e-3)
    with pytest.raises(ValueError):
        EmulatedEngine(interference=0.0)


@pytest.mark.parametrize("argv", [["--interference", "0"], ["--interference", "2", "--engine", "torch"]])
def test_the_node_refuses_an_interference_it_cannot_apply(argv, capsys):
    from agents.node import main

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "--interference" in capsys.readouterr().err
