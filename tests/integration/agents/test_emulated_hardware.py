"""The emulated engine is timed per chip type (issue 23): the same request on an H20 worker prefills slower and
decodes faster than on an H800 (H20: ~15% of the H800's dense compute, 4.0 vs 3.35 TB/s HBM; core/PROFILES.md),
in the engine and through a worker process started with --hardware, as a node agent starts it for its node's
chip. Compared on the engine's modeled durations (its schedule, not the wall clock), so the test cannot pass or
fail by machine load."""

from __future__ import annotations

import pytest

from agents import dataplane as dp
from agents.engines.emulated import EmulatedEngine
from agents.process import spawn_worker
from agents.worker_client import WorkerClient, session
from controlplane.core.profiles import get_profile

FAST = 1e-3  # a thousand times faster than the emulated GPU
PROMPT = 4096
NEW = 64


async def _one_request(hardware: str) -> tuple[float, float]:
    """(modeled prefill seconds, modeled seconds per decode iteration) of one 4K-prompt, 64-token request."""
    e = EmulatedEngine(model="qwen3-8b", hardware=hardware, tp=2, time_factor=FAST)
    await e.start()
    try:
        out = await e.generate(
            dp.GenerateRequest(request_id="r", sampling=dp.SamplingParams(max_tokens=NEW, seed=1)), [7] * PROMPT
        )
        assert len(out.tokens) == NEW
        decode = [(pred, k) for n, k, pred, _obs in e.timing_log if n == 1]
        assert decode, e.timing_log
        return e.counters.prefill_s_total, sum(p for p, _ in decode) / FAST / sum(k for _, k in decode)
    finally:
        await e.shutdown()


@pytest.mark.asyncio
async def test_h20_prefills_slower_and_decodes_faster_than_h800():
    pre_h800, it_h800 = await _one_request("H800")
    pre_h20, it_h20 = await _one_request("H20")
    pre_a100, it_a100 = await _one_request("A100")
    assert pre_h20 > 3 * pre_h800  # compute-bound: 148 vs 989 TFLOP/s (H20's higher MFU narrows it)
    assert it_h20 < it_h800  # bandwidth-bound: 4.0 vs 3.35 TB/s
    assert pre_a100 > pre_h800 and it_a100 > it_h800  # A100: less compute and less bandwidth than an H800
    # and the engine keeps each profile's pace: prefill as the profile prices 4K tokens, decode as A + b·n
    for hw, pre, it in (("H800", pre_h800, it_h800), ("H20", pre_h20, it_h20)):
        p = get_profile(hw, "qwen3-8b", 2)
        assert pre == pytest.approx(p.t_prefill * PROMPT, rel=0.1), hw
        assert p.decode_a <= it <= p.decode_a + 1.5 * p.decode_b, hw  # one sequence of a 4K context


@pytest.mark.asyncio
async def test_a_worker_started_with_hardware_h20_is_timed_as_an_h20(tmp_path):
    """`agents.worker --hardware` is what a node agent passes for its node's chip (agents/node/reconciler.py)."""
    prefill_s_per_token = {}
    s = session()
    try:
        for hw in ("H800", "H20"):
            w = await spawn_worker(
                worker_id=1,
                engine="emulated",
                role="colocated",
                model="qwen3-8b",
                hardware=hw,
                time_factor=FAST,
                state_dir=tmp_path / hw,
                extra=["--tp", "2"],
            )
            try:
                c = WorkerClient(w.endpoint, w.secret, s)
                out = await c.generate(
                    dp.GenerateRequest(
                        request_id="r", prompt_tokens=[7] * PROMPT, sampling=dp.SamplingParams(max_tokens=8, seed=1)
                    )
                )
                assert len(out.tokens) == 8
                st = await c.stats()
                assert st.prefill_tokens == PROMPT
                prefill_s_per_token[hw] = st.prefill_s_total / st.prefill_tokens
            finally:
                await w.stop()
    finally:
        await s.close()
    ratio = prefill_s_per_token["H20"] / prefill_s_per_token["H800"]
    expected = get_profile("H20", "qwen3-8b", 2).t_prefill / get_profile("H800", "qwen3-8b", 2).t_prefill
    assert ratio == pytest.approx(expected, rel=0.25) and ratio > 3
