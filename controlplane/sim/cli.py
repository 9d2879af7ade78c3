"""`python -m controlplane.sim list | run | compare | calibrate` (see README.md)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from controlplane.core.policies import names
from controlplane.sim.cluster import RunResult, run_policy
from controlplane.sim.scenario import Scenario, ScenarioError, get_scenario, list_scenarios, load_scenario_file
from controlplane.sim.traces import TraceError, load_trace


def _load(args: argparse.Namespace) -> Scenario:
    sc = load_scenario_file(args.scenario_file) if getattr(args, "scenario_file", None) else get_scenario(args.scenario)
    if getattr(args, "trace", None):
        from dataclasses import replace

        tr = load_trace(args.trace)
        sc = replace(sc, trace=tr)
    if args.seed is not None:
        sc = sc.with_seed(args.seed)
    return sc


def compare(
    sc: Scenario, policies: Sequence[str] | None = None, *, record_timeline: bool = False
) -> dict[str, RunResult]:
    """Run every policy of the scenario on the same seed (paired comparison)."""
    return {p: run_policy(sc, p, record_timeline=record_timeline) for p in (policies or sc.policies)}


def compare_json(sc: Scenario, results: dict[str, RunResult]) -> dict[str, Any]:
    return {"scenario": sc.name, "seed": sc.seed, "policies": {p: r.summary() for p, r in results.items()}}


def _table(sc: Scenario, results: dict[str, RunResult], wall: float) -> str:
    cols = ["policy", "tok/s", "steps", "rollout_s", "train_s", "trans", "borrow_gpu_s", "misses", "lost", "mape%"]
    rows = [cols]
    base = results.get(names.FIXED)
    for p, r in results.items():
        rows.append(
            [
                p,
                f"{r.throughput_tok_s:,.0f}",
                str(r.steps),
                f"{r.rollout_s_mean:.1f}",
                f"{r.train_s_mean:.1f}",
                str(r.transitions),
                f"{r.borrowed_gpu_s:,.0f}",
                str(r.return_deadline_misses),
                str(r.lost_tokens),
                "-" if r.predictor_mape is None else f"{r.predictor_mape:.1f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(cols))]
    lines = [
        f"scenario {sc.name} (seed {sc.seed}, {sc.duration_s:.0f} s virtual, trace mean "
        f"{sc.trace.mean(sc.duration_s):.1f} GPUs) — {wall:.1f} s wall"
    ]
    for i, row in enumerate(rows):
        lines.append("  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    if base and base.throughput_tok_s > 0:
        lines.append(
            "throughput vs fixed (ROLL): "
            + ", ".join(f"{p} {r.throughput_tok_s / base.throughput_tok_s:.2f}x" for p, r in results.items())
        )
    return "\n".join(lines)


def _multi(sc: Scenario, args: argparse.Namespace) -> int:
    """A `jobs:` scenario: its sharing policies side by side (`sim.multi`); `run` runs one of them."""
    from controlplane.sim.multi import compare_multi, compare_multi_json, multi_table

    if args.cmd == "run":
        policies = [args.policy]
    else:
        policies = [p.strip() for p in args.policies.split(",")] if args.policies else list(sc.policies)
    t0 = time.perf_counter()
    results = compare_multi(sc, policies)
    if args.json:
        print(json.dumps(compare_multi_json(sc, results)))
    else:
        print(multi_table(sc, results, time.perf_counter() - t0))
    return 0


def _with_scenario_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Where the scenario comes from (a shipped name or a file), its seed and an optional trace."""
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--scenario")
    g.add_argument("--scenario-file")
    p.add_argument("--seed", type=int)
    p.add_argument("--trace", help="CSV time_s,available_gpus replacing the scenario's trace")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m controlplane.sim", description="PEARL discrete-event cluster simulator"
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="list the shipped scenarios")
    r = _with_scenario_args(sub.add_parser("run", help="run one policy on one scenario"))
    r.add_argument("--policy", required=True)
    r.add_argument("--json", action="store_true")
    c = _with_scenario_args(sub.add_parser("compare", help="run every policy of a scenario on the same seed"))
    c.add_argument("--policies", help="comma-separated subset (default: the scenario's list)")
    c.add_argument("--json", action="store_true", help="print exactly one JSON object")
    c.add_argument("--html", help="write an HTML report (plotly inlined) to this path")
    k = sub.add_parser("calibrate", help="the paper's §1 motivation statistics at a scenario's workload and engine")
    k.add_argument("--scenario", default="paper-qwen3-8b-seg1")
    k.add_argument("--scenario-file")
    k.add_argument("--seed", type=int)
    k.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "calibrate":
            from controlplane.sim.calibration import motivation

            base = load_scenario_file(args.scenario_file) if args.scenario_file else get_scenario(args.scenario)
            m = motivation(base, seed=args.seed)
            if args.json:
                print(json.dumps(m))
            else:
                for key, v in m["stats"].items():
                    paper = m["paper"].get(key)
                    ok = m["within"].get(key)
                    band = f"   paper {paper:g}   in band: {ok}" if paper is not None else ""
                    print(f"{key:32s} sim {v:10.4f}" + band)
            return 0
        if args.cmd == "list":
            for name in list_scenarios():
                sc = get_scenario(name)
                print(f"{name:32s} {sc.description}")
            return 0
        sc = _load(args)
        if sc.jobs:
            return _multi(sc, args)
        if args.cmd == "run":
            res = run_policy(sc, args.policy)
            if args.json:
                print(json.dumps({"scenario": sc.name, "seed": sc.seed, "policy": args.policy, **res.summary()}))
            else:
                print(_table(sc, {args.policy: res}, res.wall_s))
            return 0
        policies = [p.strip() for p in args.policies.split(",")] if args.policies else None
        t0 = time.perf_counter()
        results = compare(sc, policies, record_timeline=bool(args.html))
        wall = time.perf_counter() - t0
        if args.html:
            from controlplane.sim.report import write_scenario_html

            write_scenario_html(sc, results, args.html)
        if args.json:
            print(json.dumps(compare_json(sc, results)))
        else:
            print(_table(sc, results, wall))
            if args.html:
                print(f"HTML report: {args.html}")
        return 0
    except (ScenarioError, TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
