"""PEARL core latency: decide() + plan_transition() at data-centre scale.

Budgets: 4,096 workers, and 65,536 GPUs = 32,768 TP2 workers. Each run is one elastic signal:
the budget grows by 1/8 (preemptible GPUs join), decide() re-chooses mode and ratio from the
current configuration, and plan_transition() maps the current worker->role map onto the target.
Medians and p95 over repeated runs, measured on this machine (prints a Markdown table).

    .venv/bin/python benchmarks/bench_core.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from controlplane.core.context import PolicyContext, Signal
from controlplane.core.decision import decide
from controlplane.core.policies import make_policy, names
from controlplane.core.predictor import swe_bench_workload
from controlplane.core.profiles import get_profile
from controlplane.core.state import Role
from controlplane.core.transitions import plan_transition


def one_signal(budget: int, *, model: str = "qwen3-8b") -> tuple[float, float, str, int]:
    """Time decide + plan for one budget change (current = the best config at 7/8 of the budget)."""
    w = swe_bench_workload(batch_size=max(64, budget * 8))  # keep ~8 trajectories per worker at scale
    c = get_profile("H800", model).coefficients(
        new_tokens=w.new_prompt_tokens, prefix=w.prefix_tokens, mean_context=w.mean_context
    )
    before = budget * 7 // 8
    cur_cfg = decide(w, c, before).configuration
    current: dict[int, Role] = {}
    slot = 0
    for role, n in cur_cfg.role_counts().items():
        for _ in range(n):
            current[slot] = role
            slot += 1
    inflight = {s: (s * 7919) % 13 for s in current}
    t0 = time.perf_counter()
    d = decide(w, c, budget, current=cur_cfg)
    t1 = time.perf_counter()
    plan = plan_transition(current, d.configuration.role_counts(), inflight=inflight)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, d.label, len(plan.steps)


def pearl_signal(budget: int) -> float:
    """Time one PEARL policy call: tracker refit + gate (two decides) + decide, 1/8 of it borrowable."""
    overlap = budget // 8
    pol = make_policy(names.PEARL, profile=get_profile("H800", "qwen3-8b"), batch_size=max(64, budget * 8))
    ctx = PolicyContext(
        now_s=0.0,
        signal=Signal.TRAINING_FINISHED,
        dedicated_workers=budget - overlap,
        reserved_workers=budget // 4,
        overlap_workers=overlap,
        training_active=False,
        current=None,
        borrowed=0,
        batch_size=max(64, budget * 8),
        remaining=max(64, budget * 8),
    )
    t0 = time.perf_counter()
    pol.on_event(ctx)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    print(f"python {platform.python_version()}, {platform.machine()}, repeats={args.repeats}\n")
    print(
        "| budget | decide median / p95 (ms) | plan median / p95 (ms) | decide+plan median / p95 (ms) | chosen "
        "| plan steps |"
    )
    print("|---|---|---|---|---|---|")
    for label, budget in (("4,096 workers", 4096), ("65,536 GPUs = 32,768 TP2 workers", 32768)):
        one_signal(budget)  # warm-up (imports, numpy)
        dec, pl, tot = [], [], []
        chosen, steps = "", 0
        for _ in range(args.repeats):
            a, b, chosen, steps = one_signal(budget)
            dec.append(a * 1e3)
            pl.append(b * 1e3)
            tot.append((a + b) * 1e3)

        def stats(xs: list[float]) -> str:
            q = statistics.quantiles(xs, n=20)[18] if len(xs) >= 2 else xs[0]
            return f"{statistics.median(xs):.2f} / {q:.2f}"

        print(f"| {label} | {stats(dec)} | {stats(pl)} | {stats(tot)} | {chosen} | {steps} |")
    print("\n| budget | pearl policy on_event median / p95 (ms) |")
    print("|---|---|")
    for label, budget in (("4,096 workers", 4096), ("32,768 TP2 workers", 32768)):
        pearl_signal(budget)
        xs = [pearl_signal(budget) * 1e3 for _ in range(args.repeats)]
        q = statistics.quantiles(xs, n=20)[18]
        print(f"| {label} | {statistics.median(xs):.2f} / {q:.2f} |")


if __name__ == "__main__":
    main()
