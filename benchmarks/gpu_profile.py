"""One-shot engine profile for the day a GPU is lent: measured coefficients for the simulator and predictor.

At the Qwen3-8B and Qwen3-30B-A3B shapes (their published configs, random bf16 weights: nothing is
downloaded), with the Qwen3 model PEARL's torch engine runs (`transformers`), it measures
- decode step time over batch x context (a preallocated KV cache of that context, one new token per row),
- prefill throughput at 2K / 8K / 32K tokens,
- a mixed iteration: a prefill chunk next to a running decode batch, as the torch engine runs them (two
  passes in one iteration), against each alone: the PD interference I the runtime tracker measures,
- weight install: safetensors bytes of every layer parsed and copied into the live parameters,
- and, where vLLM is installed (`--vllm`), vLLM's decode step and prefill time at the same shapes with
  `load_format="dummy"` (random weights, no checkpoint), from its per-request stats.
It writes one JSON profile per model, with the raw points and the fitted `EngineCoefficients` fields of
`controlplane/core/PROFILES.md` §3 (t_prefill, decode_a, decode_b, kv_bytes_per_token, prefill_interference).
Everything fits one 8-minute run on one GPU (`--budget-s`, points past it are skipped and say so).

    python benchmarks/gpu_profile.py --out benchmarks/out/gpu_profile.json          # on a GPU
    python benchmarks/gpu_profile.py --tiny                                          # CPU, tiny shapes, < 1 min
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Published configs (Hugging Face config.json of Qwen/Qwen3-8B and Qwen/Qwen3-30B-A3B), no weights.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-8b": dict(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
    ),
    "qwen3-30b-a3b": dict(
        moe=True,
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        moe_intermediate_size=768,
        num_hidden_layers=48,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        num_experts=128,
        num_experts_per_tok=8,
        norm_topk_prob=True,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
        rope_theta=1000000.0,
    ),
    # the same two architectures at the tests' tiny size (CPU)
    "tiny": dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
    "tiny-moe": dict(
        moe=True,
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        tie_word_embeddings=True,
        max_position_embeddings=8192,
    ),
}
FULL = dict(
    models=["qwen3-8b", "qwen3-30b-a3b"],
    batches=[1, 8, 32, 64, 128],
    contexts=[2048, 8192, 32768],
    prefill=[2048, 8192, 32768],
    chunk=2048,
    mixed_batch=32,
    mixed_context=8192,
    reps=3,
)
TINY = dict(
    models=["tiny", "tiny-moe"],
    batches=[1, 4, 16],
    contexts=[128, 512],
    prefill=[128, 512, 1024],
    chunk=128,
    mixed_batch=4,
    mixed_context=256,
    reps=2,
)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.skipped: list[str] = []

    def left(self) -> float:
        return self.end - time.monotonic()

    def allow(self, what: str, need_s: float = 0.0) -> bool:
        if self.left() > need_s:
            return True
        self.skipped.append(what)
        return False


def config(name: str) -> Any:
    from transformers import Qwen3Config, Qwen3MoeConfig

    kw = dict(SHAPES[name])
    moe = kw.pop("moe", False)
    cfg = (Qwen3MoeConfig if moe else Qwen3Config)(**kw)
    cfg._attn_implementation = "sdpa"
    return cfg


def build(name: str, device: torch.device, dtype: torch.dtype) -> Any:
    """The model with random weights, made on the device directly (no host copy of 16-61 GB)."""
    from transformers import Qwen3ForCausalLM, Qwen3MoeForCausalLM

    cfg = config(name)
    cls = Qwen3MoeForCausalLM if getattr(cfg, "num_experts", 0) else Qwen3ForCausalLM
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):  # random init where the weights live: no host copy
            model = cls(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Any, device: torch.device, reps: int) -> float:
    """Median wall seconds of `fn()` over `reps` runs after one warm-up."""
    fn()
    sync(device)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync(device)
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def kv_bytes_per_token(cfg: Any, dtype: torch.dtype) -> int:
    itemsize = torch.tensor([], dtype=dtype).element_size()
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize


def static_cache(model: Any, batch: int, length: int) -> Any:
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=length)


def decode_step(model: Any, batch: int, context: int, device: torch.device) -> Any:
    """One decode iteration of `batch` rows at `context` tokens of KV each (a preallocated cache, as the
    torch engine keeps; the cache's contents do not change the work)."""
    cache = static_cache(model, batch, context + 1)
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), device=device)
    pos = torch.tensor([context], device=device)

    def run() -> None:
        with torch.inference_mode():
            model(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True)

    return run


def prefill_pass(model: Any, tokens: int, device: torch.device) -> Any:
    ids = torch.randint(0, model.config.vocab_size, (1, tokens), device=device)

    def run() -> None:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)

    return run


def install_weights(model: Any, device: torch.device) -> tuple[float, int]:
    """Seconds to install a full snapshot that arrived as safetensors bytes: parse each layer's bytes and
    copy into the live parameters (the bytes are made first, layer by layer, outside the timing)."""
    from safetensors.torch import load, save

    groups: dict[str, dict[str, torch.Tensor]] = {}
    for name, p in model.state_dict().items():
        key = ".".join(name.split(".")[:3]) if ".layers." in name else name.split(".")[0]
        groups.setdefault(key, {})[name] = p
    params = dict(model.state_dict())
    total_s, total_b = 0.0, 0
    for group in groups.values():
        blob = save({k: v.detach().to("cpu").contiguous() for k, v in group.items()})
        t0 = time.perf_counter()
        with torch.no_grad():
            for k, v in load(blob).items():
                params[k].copy_(v, non_blocking=False)
        sync(device)
        total_s += time.perf_counter() - t0
        total_b += len(blob)
    return total_s, total_b


def fit_decode(points: list[dict[str, Any]], context: int) -> tuple[float, float]:
    """A + b·n through the decode points at one context (least squares), the predictor's linear form."""
    pts = [(p["batch"], p["s"]) for p in points if p["context"] == context]
    if len(pts) < 2:
        return (pts[0][1], 0.0) if pts else (0.0, 0.0)
    n, t = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
    b, a = np.polyfit(n, t, 1)
    return float(a), float(b)


def profile_torch(
    name: str, plan: dict[str, Any], device: torch.device, dtype: torch.dtype, budget: Budget
) -> dict[str, Any]:
    model = build(name, device, dtype)
    cfg, reps = model.config, plan["reps"]
    k = kv_bytes_per_token(cfg, dtype)
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 2 << 30
    out: dict[str, Any] = {
        "engine": "torch",
        "model": name,
        "dtype": str(dtype).replace("torch.", ""),
        "kv_bytes_per_token": k,
        "prefill": [],
        "decode_iteration_s": [],
    }
    for n in plan["prefill"]:
        if n > cfg.max_position_embeddings or not budget.allow(f"{name} prefill {n}", 20):
            continue
        with contextlib.suppress(torch.OutOfMemoryError):
            s = timed(prefill_pass(model, n, device), device, reps)
            out["prefill"].append({"tokens": n, "s": s, "tokens_per_s": n / s})
    for ctx in plan["contexts"]:
        for b in plan["batches"]:
            if b * ctx * k > 0.5 * free or not budget.allow(f"{name} decode {b}x{ctx}", 15):
                continue
            try:
                out["decode_iteration_s"].append(
                    {"batch": b, "context": ctx, "s": timed(decode_step(model, b, ctx, device), device, reps)}
                )
            except torch.OutOfMemoryError:
                break
            finally:
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    chunk, mb, mc = plan["chunk"], plan["mixed_batch"], plan["mixed_context"]
    if budget.allow(f"{name} mixed iteration", 20) and mb * mc * k < 0.5 * free:
        pre, dec = prefill_pass(model, chunk, device), decode_step(model, mb, mc, device)

        def both() -> None:
            pre()
            dec()

        alone_p, alone_d, mixed = timed(pre, device, reps), timed(dec, device, reps), timed(both, device, reps)
        out["mixed_iteration"] = {
            "prefill_tokens": chunk,
            "decode_batch": mb,
            "context": mc,
            "prefill_alone_s": alone_p,
            "decode_alone_s": alone_d,
            "mixed_s": mixed,
            "interference": max(mixed - alone_d, 1e-9) / alone_p,
        }
    if budget.allow(f"{name} weight install", 60):
        s, size = install_weights(model, device)
        out["weight_install_s"], out["weight_bytes"] = s, size
    ref = plan["contexts"][min(1, len(plan["contexts"]) - 1)]
    a, b = fit_decode(out["decode_iteration_s"], ref)
    at = next((p for p in out["prefill"] if p["tokens"] == plan["prefill"][0]), None)
    out["coefficients"] = {
        "t_prefill": at["s"] / at["tokens"] if at else None,
        "decode_a": a,
        "decode_b": b,
        "reference_context": ref,
        "kv_bytes_per_token": k,
        "prefill_interference": out.get("mixed_iteration", {}).get("interference", 1.0),
    }
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def profile_vllm(name: str, plan: dict[str, Any], dtype: torch.dtype, budget: Budget) -> dict[str, Any] | None:
    """vLLM at the same shape with `load_format="dummy"`: decode step = (last - first token) / (n - 1) of
    a batch decoding together, prefill = vLLM's own scheduled → first-token time, both per request."""
    try:
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except Exception:
        return None
    if not budget.allow(f"{name} vllm", 120):
        return None
    model_dir = Path(tempfile.mkdtemp(prefix="pearl-profile-")) / name
    config(name).save_pretrained(model_dir)
    kw: dict[str, Any] = dict(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype=str(dtype).replace("torch.", ""),
        max_model_len=max(plan["prefill"]) + 64,
        disable_log_stats=False,
    )
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        kw["enforce_eager"] = True
    else:
        kw["gpu_memory_utilization"] = 0.85
    llm = LLM(**kw)
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"engine": "vllm", "model": name, "prefill": [], "decode_iteration_s": []}

    def prompts(n: int, length: int) -> list[Any]:
        return [TokensPrompt(prompt_token_ids=rng.integers(0, 250, length).tolist()) for _ in range(n)]

    for n in plan["prefill"]:
        if not budget.allow(f"{name} vllm prefill {n}", 15):
            break
        [r] = llm.generate(prompts(1, n), SamplingParams(max_tokens=1), use_tqdm=False)
        m = r.metrics
        s = float(m.first_token_ts - m.scheduled_ts) if m and m.first_token_ts > m.scheduled_ts else float("nan")
        out["prefill"].append({"tokens": n, "s": s, "tokens_per_s": n / s})
    for ctx in plan["contexts"]:
        for b in plan["batches"]:
            if ctx + 64 > kw["max_model_len"] or not budget.allow(f"{name} vllm decode {b}x{ctx}", 20):
                continue
            rs = llm.generate(prompts(b, ctx), SamplingParams(max_tokens=32, ignore_eos=True), use_tqdm=False)
            steps = [(r.metrics.last_token_ts - r.metrics.first_token_ts) / 31 for r in rs if r.metrics]
            if steps:
                out["decode_iteration_s"].append({"batch": b, "context": ctx, "s": statistics.median(steps)})
    del llm
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny shapes on CPU (a test runs this)")
    p.add_argument("--models", default="", help="comma-separated, default: qwen3-8b,qwen3-30b-a3b (tiny,tiny-moe)")
    p.add_argument("--vllm", action="store_true", help="also profile vLLM (load_format=dummy) where it imports")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting new points after this")
    p.add_argument("--out", default="", help="write the profile JSON here (default: print)")
    args = p.parse_args(argv)
    plan: dict[str, Any] = dict(TINY if args.tiny else FULL)
    if args.models:
        plan["models"] = args.models.split(",")
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    if device.type == "cpu":
        torch.set_num_threads(1)
    budget = Budget(args.budget_s)
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    result: dict[str, Any] = {"hardware": hardware, "tp": 1, "created": time.time(), "profiles": []}
    for name in plan["models"]:
        result["profiles"].append(profile_torch(name, plan, device, dtype, budget))
        if args.vllm:
            v = profile_vllm(name, plan, dtype, budget)
            if v is not None:
                result["profiles"].append(v)
    result["skipped"] = budget.skipped
    text = json.dumps(result, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    else:
        print(text)
    return result


if __name__ == "__main__":
    main()
