"""`pearl profile DIR --hardware H800 --tp 2`: the planner's prior for a model directory, derived from its
config.json through the sourced profiles' roofline formulas (core.model_dir), before any telemetry corrects it.
Local: reads the directory on this machine, asks no server."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from controlplane.core.model_dir import ModelDirError, inspect_model_dir, profile_from_config
from controlplane.core.profiles import GB, Profile
from pearl_cli.client import CliError


def read_config(path: str) -> dict[str, Any]:
    """A directory's config.json (or a config.json given by its path), parsed."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {file}: {exc}", 2) from None
    if not isinstance(config, dict):
        raise CliError(f"{file} is not a JSON object", 2)
    return config


def profile_of(path: str, hardware: str, tp: int) -> tuple[Profile, str | None]:
    """The derived profile, and why the directory could not run as a job's model (None if it can)."""
    config = read_config(path)
    try:
        profile = profile_from_config(hardware, config, tp, name=str(Path(path).resolve()))
    except ValueError as exc:  # unknown hardware, does not fit, a config without the dimensions
        raise CliError(str(exc), 2) from None
    problem = None
    if Path(path).is_dir():
        try:
            inspect_model_dir(
                str(Path(path).resolve()),
                is_dir=os.path.isdir,
                list_dir=lambda d: sorted(os.listdir(d)),
                read_text=lambda f: Path(f).read_text(encoding="utf-8"),
            )
        except (ModelDirError, OSError) as exc:
            problem = str(exc)
    return profile, problem


def as_dict(p: Profile) -> dict[str, Any]:
    m = p.spec
    return {
        "model": p.model,
        "hardware": p.hardware,
        "tp": p.tp,
        "layers": m.layers,
        "hidden": m.hidden,
        "q_heads": m.q_heads,
        "kv_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "experts": m.experts,
        "experts_topk": m.experts_topk,
        "params_total": m.params_total,
        "params_linear_active": m.params_linear_active,
        "weight_dtype_bytes": m.weight_dtype_bytes,
        "weight_bytes": p.weight_bytes,
        "kv_bytes_per_token": p.kv_bytes_per_token,
        "hbm_kv_capacity": p.hbm_kv_capacity,
        "t_prefill_s_per_token": p.t_prefill,
        "decode_a_s": p.decode_a,
        "decode_b_s_per_seq": p.decode_b,
        "reference_context": p.reference_context,
        "bandwidth_bytes_per_s": p.bandwidth,
        "train_tokens_per_s_per_gpu": p.train_tokens_per_s_per_gpu,
        "worker_start_s": p.reconfig.worker_start_s,
    }


def _count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def text(p: Profile, problem: str | None) -> str:
    m = p.spec
    moe = f", {m.experts} experts ({m.experts_topk} active)" if m.is_moe else ""
    lines = [
        f"{p.model} on {p.tp}x{p.hardware} (derived from config.json; the tracker corrects it online)",
        f"  model         {m.layers} layers, hidden {m.hidden}, {m.q_heads} heads / {m.kv_heads} KV heads "
        f"x {m.head_dim}{moe}; {_count(m.params_total)} params ({_count(m.params_linear_active)} linear active), "
        f"{m.weight_dtype_bytes:g} bytes each",
        f"  weights       {p.weight_bytes / GB:.2f} GB; KV {p.kv_bytes_per_token / 1024:.1f} KiB/token; "
        f"KV capacity {p.hbm_kv_capacity / GB:.1f} GB per worker",
        f"  prefill       {p.t_prefill * 1e6:.2f} us/token (2k-token prompt)",
        f"  decode        A = {p.decode_a * 1e3:.3f} ms/iteration, b = {p.decode_b * 1e6:.2f} us/sequence "
        f"(at {p.reference_context} tokens of context)",
        f"  KV hand-off   {p.bandwidth / GB:.1f} GB/s",
        f"  training      {p.train_tokens_per_s_per_gpu:,.0f} tokens/s per GPU",
        f"  worker start  {p.reconfig.worker_start_s:.1f} s (the sourced model nearest in weight bytes)",
    ]
    if problem:
        lines.append(f"  note: as a job's model this directory would be refused: {problem}")
    return "\n".join(lines)


def cmd_profile(_c: Any, args: argparse.Namespace) -> None:
    profile, problem = profile_of(args.dir, args.hardware, args.tp)
    print(json.dumps(as_dict(profile) | {"refused": problem}, indent=2) if args.json else text(profile, problem))
