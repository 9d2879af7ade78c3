"""Engines, KV hand-off and emulated-timing benchmarks (figures for BENCHMARKS.md).

    .venv/bin/python benchmarks/bench_engines.py [--quick] [--json out.json]

1. torch engine (continuous batching, hand-rolled loop) vs `transformers` `generate` on the same tiny
   Qwen3, same batch, same prompt and output lengths, greedy, 1 torch thread, side by side in one run
   (interleaved repeats, medians).
2. KV hand-off between two torch worker processes (prefill worker -> decode worker pulls safetensors
   over HTTP): bytes per token, pull latency, request latency vs colocated.
3. emulated engine: concurrent sequences one worker holds while its decode iterations keep the
   profile's timing (Qwen3-8B, H800, TP2, time factor 1) within 5%.
4. emulated engine, the live benchmark's regime (few long decodes per worker, time scaled down):
   wall makespan / time factor against the same requests replayed on `core.batching.IterationScheduler` in pure model
   time (`--only emulated_decode`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from agents import dataplane as dp  # noqa: E402
from agents import models  # noqa: E402


# ---------------------------------------------------------------- 1. torch engine vs generate
async def _engine_run(engine, batch: int, prompt_len: int, new: int, tag: str) -> tuple[float, float, float]:
    c = engine.counters
    p0 = c.prefill_s_total
    c.iteration_s.clear()
    prompts = [[(i * 7 + j) % 256 for j in range(prompt_len)] for i in range(batch)]
    t0 = time.perf_counter()
    await asyncio.gather(
        *[
            engine.generate(
                dp.GenerateRequest(
                    request_id=f"{tag}-{i}", sampling=dp.SamplingParams(max_tokens=new, stop_at_eos=False)
                ),
                prompts[i],
            )
            for i in range(batch)
        ]
    )
    total = time.perf_counter() - t0
    prefill_s = c.prefill_s_total - p0
    decode_s = sum(c.iteration_s)
    return prefill_s, decode_s, total


def _hf_run(model, batch: int, prompt_len: int, new: int) -> tuple[float, float, float]:
    ids = torch.tensor([[(i * 7 + j) % 256 for j in range(prompt_len)] for i in range(batch)])
    mask = torch.ones_like(ids)
    kw = dict(do_sample=False, use_cache=True, pad_token_id=258, eos_token_id=None)
    with torch.no_grad():
        t0 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=1, min_new_tokens=1, **kw)
        t1 = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **kw)
        t2 = time.perf_counter()
    prefill = t1 - t0
    return prefill, (t2 - t1) - prefill, t2 - t1


async def bench_torch(batches: list[int], prompt_len: int, new: int, repeats: int) -> list[dict]:
    from agents.engines.torch_engine import TorchEngine

    models.set_threads(1)
    engine = TorchEngine(threads=1)
    await engine.start()
    hf = models.load_model("tiny")
    rows = []
    try:
        await _engine_run(engine, 2, 16, 4, "warm")
        _hf_run(hf, 2, 16, 4)
        for b in batches:
            eng, ref = [], []
            for r in range(repeats):  # interleaved, so both see the same machine load
                eng.append(await _engine_run(engine, b, prompt_len, new, f"b{b}r{r}"))
                ref.append(_hf_run(hf, b, prompt_len, new))
            med = lambda xs, k: statistics.median(x[k] for x in xs)
            dec_tokens = b * (new - 1)
            row = {
                "batch": b,
                "prompt_len": prompt_len,
                "new_tokens": new,
                "engine_prefill_tok_s": b * prompt_len / med(eng, 0),
                "generate_prefill_tok_s": b * prompt_len / med(ref, 0),
                "engine_decode_tok_s": dec_tokens / med(eng, 1),
                "generate_decode_tok_s": dec_tokens / med(ref, 1),
                "engine_total_s": med(eng, 2),
                "generate_total_s": med(ref, 2),
            }
            row["decode_ratio"] = row["engine_decode_tok_s"] / row["generate_decode_tok_s"]
            row["prefill_ratio"] = row["engine_prefill_tok_s"] / row["generate_prefill_tok_s"]
            row["end_to_end_ratio"] = row["generate_total_s"] / row["engine_total_s"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        await engine.shutdown()
    return rows


# ---------------------------------------------------------------- 2. KV hand-off across processes
async def bench_kv(prompt_lens: list[int], new: int, repeats: int) -> list[dict]:
    from agents.process import spawn_worker
    from agents.worker_client import WorkerClient, session

    tmp = Path(tempfile.mkdtemp(prefix="bench-kv-"))
    p = await spawn_worker(worker_id=1, engine="torch", role="prefill", state_dir=tmp / "p")
    d = await spawn_worker(worker_id=2, engine="torch", role="decode", state_dir=tmp / "d")
    c = await spawn_worker(worker_id=3, engine="torch", role="colocated", state_dir=tmp / "c")
    s = session()
    rows = []
    try:
        P, D, C = (WorkerClient(w.endpoint, w.secret, s) for w in (p, d, c))
        for L in prompt_lens:
            disagg, coloc, pulls, kvb, equal = [], [], [], [], True
            for r in range(repeats):
                req = dp.GenerateRequest(
                    request_id=f"kv{L}-{r}",
                    prompt_tokens=[(j * 13) % 256 for j in range(L)],
                    sampling=dp.SamplingParams(max_tokens=new, stop_at_eos=False),
                )
                t0 = time.perf_counter()
                pre = await P.prefill(req)
                t1 = time.perf_counter()
                out = await D.decode(
                    dp.DecodeRequest(
                        request_id=req.request_id,
                        kv_url=P.endpoint,
                        handle=pre.handle,
                        kv_token=pre.kv_token,
                        sampling=req.sampling,
                    )
                )
                t2 = time.perf_counter()
                req2 = dp.GenerateRequest(
                    request_id=f"c{L}-{r}", prompt_tokens=req.prompt_tokens, sampling=req.sampling
                )
                ref = await C.generate(req2)
                t3 = time.perf_counter()
                equal &= out.tokens == ref.tokens
                recs = [x for x in (await D.get("telemetry"))["records"] if x["kind"] == "kv_transfer"]
                pulls.append(recs[-1]["duration_s"])
                kvb.append(pre.kv_bytes)
                disagg.append((t1 - t0, t2 - t1, t2 - t0))
                coloc.append(t3 - t2)
            row = {
                "prompt_len": L,
                "new_tokens": new,
                "kv_bytes": statistics.median(kvb),
                "kv_bytes_per_token": statistics.median(kvb) / L,
                "kv_pull_ms": 1e3 * statistics.median(pulls),
                "prefill_request_ms": 1e3 * statistics.median(x[0] for x in disagg),
                "decode_request_ms": 1e3 * statistics.median(x[1] for x in disagg),
                "disaggregated_request_ms": 1e3 * statistics.median(x[2] for x in disagg),
                "colocated_request_ms": 1e3 * statistics.median(coloc),
                "greedy_equal": equal,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        await s.close()
        for w in (p, d, c):
            await w.stop()
    return rows


# ---------------------------------------------------------------- 3. emulated timing fidelity
async def bench_emulated(ns: list[int], prompt_len: int, factors: list[float]) -> list[dict]:
    """N sequences arrive at once; each generates long enough that all N are admitted (prefill
    budget 8k tokens per iteration) before the first finishes. The engine sleeps once per segment
    (iterations with an unchanged batch). Error = observed / predicted wall time over all segments
    (aggregate) and per segment (p50 |error|)."""
    from agents.engines.emulated import EmulatedEngine

    rows = []
    for factor in factors:
        for n in ns:
            new = n * prompt_len // 8192 + 48
            e = EmulatedEngine(model="qwen3-8b", hardware="H800", tp=2, time_factor=factor)
            await e.start()
            t0 = time.perf_counter()
            await asyncio.gather(
                *[
                    e.generate(
                        dp.GenerateRequest(request_id=f"e{i}", sampling=dp.SamplingParams(max_tokens=new, seed=i)),
                        [i % 256] * prompt_len,
                    )
                    for i in range(n)
                ]
            )
            wall = time.perf_counter() - t0
            log = list(e.timing_log)
            await e.shutdown()
            agg = sum(o for _, _, _, o in log) / sum(p for _, _, p, _ in log) - 1
            per = sorted(abs(o / p - 1) for _, _, p, o in log)
            peak = max(b for b, _, _, _ in log)
            at_peak = [p / k for b, k, p, _ in log if b == peak]
            rows.append(
                {
                    "concurrent": n,
                    "time_factor": factor,
                    "peak_running_batch": peak,
                    "segments": len(log),
                    "iterations": sum(k for _, k, _, _ in log),
                    "profile_iteration_ms_at_peak": 1e3 * at_peak[0] / factor,
                    "aggregate_error_pct": 100 * agg,
                    "p50_segment_error_pct": 100 * per[len(per) // 2],
                    "wall_s": wall,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


async def bench_emulated_decode(ns: list[int], factors: list[float], prompt_len: int = 2048) -> list[dict]:
    """N sequences with distinct prompts and staggered lengths (400 + 25·i tokens) arrive at once on one
    worker. Expected makespan: the same requests on `core.batching.IterationScheduler` with a virtual clock."""
    from agents.engines.emulated import EmulatedEngine
    from controlplane.core.batching import CHUNK_TOKENS, IterationScheduler, Request, ScaledCosts
    from controlplane.core.profiles import get_profile
    from controlplane.core.state import Role

    prof = get_profile("H800", "qwen3-8b", 2)
    rows = []
    for n in ns:
        lengths = [400 + 25 * i for i in range(n)]
        ref = IterationScheduler(
            0,
            "",
            Role.COLOCATED,
            ScaledCosts(prof),
            chunk_tokens=CHUNK_TOKENS,
            kv_capacity=int(prof.hbm_kv_capacity // prof.kv_bytes_per_token),
        )
        for m in lengths:
            ref.submit_prompt(Request(None, prompt_len, 0, prompt_len, m - 1))
        t, expected = 0.0, 0.0
        while (end := ref.plan(t)) is not None:
            ref.finish()
            t = expected = end
        for factor in factors:
            e = EmulatedEngine(model="qwen3-8b", hardware="H800", tp=2, time_factor=factor)
            await e.start()
            t0 = time.perf_counter()
            await asyncio.gather(
                *[
                    e.generate(
                        dp.GenerateRequest(request_id=f"d{i}", sampling=dp.SamplingParams(max_tokens=m, seed=i)),
                        [i] * prompt_len,
                    )
                    for i, m in enumerate(lengths)
                ]
            )
            model_s = (time.perf_counter() - t0) / factor
            await e.shutdown()
            rows.append(
                {
                    "concurrent": n,
                    "time_factor": factor,
                    "expected_model_s": expected,
                    "observed_model_s": model_s,
                    "error_pct": 100 * (model_s / expected - 1),
                    "segments": len(e.timing_log),
                    "iterations": e.counters.decode_iterations,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--only", default="torch,kv,emulated,emulated_decode")
    a = ap.parse_args()
    out: dict = {"machine": "see BENCHMARKS.md header", "torch_threads": 1}
    only = a.only.split(",")
    if "torch" in only:
        out["torch_vs_generate"] = asyncio.run(
            bench_torch([8] if a.quick else [1, 8, 32], 64, 32 if a.quick else 64, 3 if a.quick else 5)
        )
    if "kv" in only:
        out["kv_handoff"] = asyncio.run(bench_kv([64, 512] if a.quick else [64, 256, 1024], 16, 3 if a.quick else 5))
    if "emulated" in only:
        out["emulated"] = asyncio.run(
            bench_emulated(
                [64, 512] if a.quick else [1, 64, 256, 1024, 2048, 4096], 128, [1.0] if a.quick else [1.0, 0.1, 0.01]
            )
        )
    if "emulated_decode" in only:
        out["emulated_decode"] = asyncio.run(
            bench_emulated_decode(
                [4, 16] if a.quick else [2, 8, 32], [1.0, 0.05] if a.quick else [1.0, 0.2, 0.05, 0.01]
            )
        )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
