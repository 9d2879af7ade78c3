"""torch engine: the fast decode path equals the model's own forward; continuous batching is exact."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agents import models
from agents.dataplane import DecodeRequest, GenerateRequest, SamplingParams
from agents.engines.base import EngineError
from agents.engines.torch_engine import TorchEngine
from agents.engines.torch_runner import TorchRunner
from agents.engines.torch_scheduler import Seq
from agents.tokenizer import TOKENIZER
from tests.support.hf_models import build_tokenizer


@pytest.fixture(scope="module")
def runner():
    models.set_threads(1)
    return TorchRunner(models.load_model("tiny"))


def test_batched_decode_matches_full_forward_with_joins_and_leaves(runner):
    """Rows of different lengths join and leave a running batch; every step's logits equal the
    model's own (uncached) forward on each row's whole sequence."""
    model = runner.model
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 17, 9, 30)]
    seqs: list[Seq] = []

    def add(i: int) -> None:
        ((logits, kv),) = runner.prefill([prompts[i]])
        s = Seq(str(i), "generate", prompts[i], SamplingParams(), 0, None)  # type: ignore[arg-type]
        s.out_tokens.append(int(logits.argmax()))
        runner.join(s, kv)
        seqs.append(s)

    add(0)
    add(1)
    for step in range(12):
        if step == 3:
            add(2)  # joins a running batch (shorter than the widest row)
        if step == 6:
            add(3)  # longer than every row: the batch widens on the left
        if step == 8:
            runner.remove([i for i, s in enumerate(runner.rows) if s.request_id != "1"])  # one leaves
        logits = runner.decode_iteration()
        for row, s in enumerate(runner.rows):
            full = torch.tensor([s.prompt + s.out_tokens])
            with torch.no_grad():
                ref = model(input_ids=full).logits[0, -1]
            assert torch.allclose(logits[row], ref, atol=1e-4), (step, s.request_id, (logits[row] - ref).abs().max())
            s.out_tokens.append(int(logits[row].argmax()))


async def test_continuous_batching_gives_each_request_its_solo_output():
    e = TorchEngine()
    e.decode_sample_s = 0.0  # every iteration's record, to see the batch grow
    await e.start()
    try:
        prompts = ["a", "hello there", "PEARL", "continuous batching joins between iterations"]
        solo = [
            await e.generate(
                GenerateRequest(
                    request_id=f"s{i}", prompt=p, sampling=SamplingParams(max_tokens=6 + 3 * i, stop_at_eos=False)
                ),
                TOKENIZER.encode(p),
            )
            for i, p in enumerate(prompts)
        ]
        tasks = []
        for i, p in enumerate(prompts):  # staggered arrivals: each joins a batch that is already running
            tasks.append(
                asyncio.create_task(
                    e.generate(
                        GenerateRequest(
                            request_id=f"c{i}",
                            prompt=p,
                            sampling=SamplingParams(max_tokens=6 + 3 * i, stop_at_eos=False),
                        ),
                        TOKENIZER.encode(p),
                    )
                )
            )
            while i < len(prompts) - 1 and e.counters.decode_iterations < 2 * (i + 1) + solo_iters(solo):
                await asyncio.sleep(0.001)
        together = await asyncio.gather(*tasks)
        assert [r.tokens for r in together] == [r.tokens for r in solo]
        assert max(r["running_batch"] for r in e.take_telemetry() if r["kind"] == "decode_iteration") >= 2
    finally:
        await e.shutdown()


def solo_iters(solo) -> int:
    return sum(len(r.tokens) - 1 for r in solo)


async def test_sampling_is_seeded_and_logprobs_are_consistent():
    e = TorchEngine()
    await e.start()
    try:
        p = TOKENIZER.encode("sample me")

        async def run(rid: str, **kw) -> list[int]:
            r = await e.generate(
                GenerateRequest(request_id=rid, sampling=SamplingParams(max_tokens=12, stop_at_eos=False, **kw)), p
            )
            assert len(r.logprobs) == 12 and all(lp <= 0 for lp in r.logprobs)
            return r.tokens

        a = await run("a", temperature=1.0, seed=3)
        assert a == await run("b", temperature=1.0, seed=3)
        assert a != await run("c", temperature=1.0, seed=4)
        assert await run("d", temperature=1.0, top_p=1e-6, seed=9) == await run("e")  # top-p -> greedy
    finally:
        await e.shutdown()


async def test_bad_kv_and_abort():
    e = TorchEngine()
    await e.start()
    try:
        with pytest.raises(EngineError, match="safetensors"):
            await e.decode(DecodeRequest(request_id="x", kv_url="http://p", handle="h"), b"garbage")
        from safetensors.torch import save

        bad = save(
            {"prompt": torch.tensor([1, 2]), "k.0": torch.zeros(1, 2, 2, 7)},
            metadata={"fingerprint": e.runner.fingerprint},
        )
        with pytest.raises(EngineError, match="does not fit"):
            await e.decode(DecodeRequest(request_id="y", kv_url="http://p", handle="h"), bad)
        task = asyncio.create_task(
            e.generate(
                GenerateRequest(request_id="long", sampling=SamplingParams(max_tokens=4000, stop_at_eos=False)),
                [1, 2, 3],
            )
        )
        while not e.inflight() or len(e.inflight()[0]["tokens"]) < 3:
            await asyncio.sleep(0.001)
        partial = await e.abort("long")
        assert partial.finish_reason == "abort" and 3 <= len(partial.tokens) < 4000
        assert (await task).tokens == partial.tokens
    finally:
        await e.shutdown()


async def test_a_caller_that_goes_away_aborts_its_request():
    e = TorchEngine()
    await e.start()
    try:
        task = asyncio.create_task(
            e.generate(
                GenerateRequest(request_id="gone", sampling=SamplingParams(max_tokens=4000, stop_at_eos=False)), [1, 2]
            )
        )
        while e.running() == 0:
            await asyncio.sleep(0.001)
        task.cancel()  # what aiohttp does to a handler whose client disconnected
        with pytest.raises(asyncio.CancelledError):
            await task
        while e.running() or e.inflight():
            await asyncio.sleep(0.001)
        again = await e.generate(GenerateRequest(request_id="gone", sampling=SamplingParams(max_tokens=3)), [1, 2])
        assert len(again.tokens) <= 3  # the id is free again
    finally:
        await e.shutdown()


async def test_requests_beyond_the_models_positions_are_refused_up_front():
    e = TorchEngine()
    await e.start()
    try:
        limit = e.runner.max_positions
        with pytest.raises(EngineError, match="positions") as err:
            await e.generate(GenerateRequest(request_id="big", sampling=SamplingParams(max_tokens=limit)), [1, 2])
        assert err.value.status == 400
        ok = await e.generate(GenerateRequest(request_id="ok", sampling=SamplingParams(max_tokens=2)), [1, 2])
        assert len(ok.tokens) <= 2
    finally:
        await e.shutdown()


async def test_a_local_model_directory_loads_with_the_same_outputs(tmp_path):
    models.load_model("tiny").save_pretrained(tmp_path / "m", safe_serialization=True)
    build_tokenizer().save_pretrained(tmp_path / "m")  # a model directory brings its tokenizer and chat template
    assert (tmp_path / "m" / "model.safetensors").exists()
    outs = []
    for spec in ("tiny", str(tmp_path / "m")):
        e = TorchEngine(model=spec)
        await e.start()
        try:
            outs.append(
                (
                    await e.generate(
                        GenerateRequest(request_id="x", sampling=SamplingParams(max_tokens=8, stop_at_eos=False)),
                        [256, 104, 105],
                    )
                ).tokens
            )
        finally:
            await e.shutdown()
    assert outs[0] == outs[1]
