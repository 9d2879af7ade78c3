"""vLLM workers side by side on the tiny model: colocated vs 1P1D (prefill -> NixlConnector -> decode), the
same with PEARL's torch engine, weight-install time, and what PEARL's worker data plane (HTTP + JSON)
costs over calling `AsyncLLM` in-process. Prints one JSON object (BENCHMARKS.md, Engines).

    PEARL_VLLM_KV_CACHE_BYTES=134217728 .venv-vllm/bin/python benchmarks/bench_vllm.py [--requests 16]

Needs vLLM and nixl importable (`make test-vllm` builds .venv-vllm with both).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SECRET = "bench-vllm"


async def serve(engine: Any) -> tuple[Any, str]:
    from aiohttp import web

    from agents.worker import WorkerServer

    runner = web.AppRunner(WorkerServer(engine, SECRET).app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


async def post(http: Any, url: str, verb: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(f"{url}/{verb}", json=body, headers={"Authorization": f"Bearer {SECRET}"}) as r:
        data = await r.json()
        if r.status != 200:
            raise RuntimeError(f"{verb}: {r.status} {data}")
        return data


def prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(250) for _ in range(length)] for _ in range(n)]


async def colocated(http: Any, url: str, batch: list[list[int]], new: int, tag: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    rs = await asyncio.gather(
        *(
            post(
                http,
                url,
                "generate",
                {"request_id": f"{tag}-{i}", "prompt_tokens": p, "sampling": {"max_tokens": new, "stop_at_eos": False}},
            )
            for i, p in enumerate(batch)
        )
    )
    dt = time.perf_counter() - t0
    return {"tokens_per_s": sum(len(r["tokens"]) for r in rs) / dt, "wall_s": dt}


async def disaggregated(
    http: Any, p_url: str, d_url: str, batch: list[list[int]], new: int, tag: str, d_engine: Any
) -> dict[str, Any]:
    d_engine.take_telemetry(4096)

    async def one(i: int, p: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
        pre = await post(
            http,
            p_url,
            "prefill",
            {"request_id": f"{tag}-{i}", "prompt_tokens": p, "sampling": {"max_tokens": new, "stop_at_eos": False}},
        )
        res = await post(
            http,
            d_url,
            "decode",
            {
                "request_id": f"{tag}-{i}-d",
                "kv_url": p_url,
                "handle": pre["handle"],
                "kv_token": pre["kv_token"],
                "sampling": {"max_tokens": new, "stop_at_eos": False},
            },
        )
        return pre, res

    t0 = time.perf_counter()
    pairs = await asyncio.gather(*(one(i, p) for i, p in enumerate(batch)))
    dt = time.perf_counter() - t0
    await asyncio.sleep(0.2)
    moved = [r for r in d_engine.take_telemetry(4096) if r["kind"] == "kv_transfer"]
    return {
        "tokens_per_s": sum(len(r["tokens"]) for _, r in pairs) / dt,
        "wall_s": dt,
        "kv_bytes_per_hand_off": statistics.mean(pre["kv_bytes"] for pre, _ in pairs),
        "kv_transfers": len(moved),
        "kv_bytes_per_transfer": statistics.mean(r["kv_bytes"] for r in moved) if moved else 0,
        "kv_s_per_transfer": statistics.mean(r["duration_s"] for r in moved) if moved else 0,
    }


async def data_plane_overhead(http: Any, url: str, engine: Any, new: int, reps: int) -> dict[str, Any]:
    """One request at a time, three ways: raw AsyncLLM, PEARL's engine adapter, PEARL's worker over HTTP."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from agents.dataplane import GenerateRequest
    from agents.dataplane import SamplingParams as PS

    ps = prompts(reps, 128, 99)
    raw, adapter, http_s = [], [], []
    for i, p in enumerate(ps):
        t0 = time.perf_counter()
        raw_sp = SamplingParams(max_tokens=new, ignore_eos=True, logprobs=0)
        async for _ in engine.llm.generate(TokensPrompt(prompt_token_ids=p), raw_sp, f"raw-{i}"):
            pass
        raw.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await engine.generate(GenerateRequest(request_id=f"ad-{i}", sampling=PS(max_tokens=new, stop_at_eos=False)), p)
        adapter.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        await post(
            http,
            url,
            "generate",
            {"request_id": f"http-{i}", "prompt_tokens": p, "sampling": {"max_tokens": new, "stop_at_eos": False}},
        )
        http_s.append(time.perf_counter() - t0)
    m = {k: statistics.median(v) for k, v in (("async_llm_s", raw), ("adapter_s", adapter), ("http_worker_s", http_s))}
    m["overhead_s"] = m["http_worker_s"] - m["async_llm_s"]
    m["overhead_pct"] = 100 * m["overhead_s"] / m["async_llm_s"]
    return m


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from aiohttp import ClientSession
    from safetensors.torch import save

    from agents import models
    from agents.engines.vllm_engine import VLLMEngine

    model = Path(tempfile.mkdtemp()) / "tiny"
    models.load_model("tiny").save_pretrained(model, safe_serialization=True)
    batch = prompts(args.requests, args.prompt_tokens, 1)
    out: dict[str, Any] = {
        "requests": args.requests,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
    }
    runners = []
    async with ClientSession() as http:
        try:
            t0 = time.perf_counter()
            p = VLLMEngine(model=str(model), worker_id=1, kv_connector="NixlConnector")
            r, p_url = await serve(p)
            runners.append(r)
            d = VLLMEngine(model=str(model), worker_id=2, kv_connector="NixlConnector")
            r, d_url = await serve(d)
            runners.append(r)
            out["vllm_start_s_two_workers"] = time.perf_counter() - t0
            await colocated(http, p_url, prompts(2, 32, 5), 4, "warm")
            p.set_role("prefill")
            d.set_role("decode")
            await disaggregated(http, p_url, d_url, prompts(2, 32, 6), 4, "warm-pd", d)  # NIXL handshake
            p.set_role("colocated")
            out["vllm_colocated"] = await colocated(http, p_url, batch, args.new_tokens, "co")
            p.set_role("prefill")
            d.set_role("decode")
            out["vllm_1p1d"] = await disaggregated(
                http, p_url, d_url, prompts(args.requests, args.prompt_tokens, 2), args.new_tokens, "pd", d
            )
            p.set_role("colocated")
            out["data_plane"] = await data_plane_overhead(http, p_url, p, args.new_tokens, 8)
            snapshot = save(models.state_dict_for_wire(models.load_model("tiny", seed=1)))
            installs = []
            for v in (1, 2, 3):
                await p.load_weights(v, snapshot)
                installs.append(p.install_s)
            out["vllm_weight_install_s"] = statistics.median(installs)
            out["weight_bytes"] = len(snapshot)
        finally:
            for r in runners:
                await r.cleanup()
        if args.torch:
            from agents.engines.torch_engine import TorchEngine

            tp, td = TorchEngine(worker_id=4), TorchEngine(worker_id=5)
            runners = []
            try:
                r, tp_url = await serve(tp)
                runners.append(r)
                r, td_url = await serve(td)
                runners.append(r)
                out["torch_colocated"] = await colocated(http, tp_url, batch, args.new_tokens, "tco")
                tp.set_role("prefill")
                td.set_role("decode")
                res = await disaggregated(
                    http, tp_url, td_url, prompts(args.requests, args.prompt_tokens, 2), args.new_tokens, "tpd", td
                )
                out["torch_1p1d"] = res
                installs = []
                for v in (1, 2, 3):
                    t0 = time.perf_counter()
                    await tp.load_weights(v, snapshot)
                    installs.append(time.perf_counter() - t0)
                out["torch_weight_install_s"] = statistics.median(installs)
            finally:
                for r in runners:
                    await r.cleanup()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--no-torch", dest="torch", action="store_false", help="skip the torch engine's run")
    print(json.dumps(asyncio.run(run(p.parse_args())), indent=2))


if __name__ == "__main__":
    main()
