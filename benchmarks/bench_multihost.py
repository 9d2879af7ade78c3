"""Multi-host figures (issue 21, Measure): runs the multi-host scenarios (tests/multihost: every host
its own network namespace, a real Ray cluster, the bridge) with PEARL_FAULT_TIMINGS set, then prints
one table per fault from what they recorded: detection, recovery, trajectories resumed, lost and
duplicated, the bridge's reaction from a Ray drain to PEARL's notice, and the cost of a Ray node.
With --scale it also grows one cluster through the given node counts (tests/multihost/test_ray_scale.py)
until memory, registration or the leases give out, and says which did.

    as root: .venv/bin/python benchmarks/bench_multihost.py --runs 2 [--scale 4,8,12,16 [--scale-mode logical]]
    one module: .venv/bin/python benchmarks/bench_multihost.py --only tests/multihost/test_ray_job.py
    from a file a run left: .venv/bin/python benchmarks/bench_multihost.py --report /tmp/t.jsonl

Root only (network namespaces); never runs `ray stop` (the tests kill only the process groups they start).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FAULT_TESTS = ["tests/multihost/test_ray_cluster.py", "tests/multihost/test_ray_job.py"]
SCALE_TEST = "tests/multihost/test_ray_scale.py"


def run(paths: list[str], timings: Path, env: dict[str, str]) -> tuple[int, float]:
    t0 = time.monotonic()
    rc = subprocess.run(
        [str(ROOT / "scripts/test.sh"), "-q", "-p", "no:randomly", *paths],
        cwd=ROOT,
        env=os.environ | env | {"PEARL_FAULT_TIMINGS": str(timings)},
    ).returncode
    return rc, time.monotonic() - t0


def _fmt(values: list[Any]) -> str:
    nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if not nums:
        return " / ".join(str(v) for v in values)
    if all(isinstance(v, int) for v in nums):
        return " / ".join(str(v) for v in nums)
    if len(nums) == 1:
        return f"{nums[0]:.2f}"
    return f"{min(nums):.2f} / {statistics.median(nums):.2f} / {max(nums):.2f}"


def report(timings: Path) -> str:
    """A markdown table per recorded fault: each figure's values (min / median / max over the runs)."""
    by_fault: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in timings.read_text().splitlines():
        if line.strip():
            rec = json.loads(line)
            by_fault[rec.pop("fault")].append(rec)
    out = []
    for fault, recs in by_fault.items():
        if fault == "ray_scale":
            continue
        keys = list(dict.fromkeys(k for r in recs for k in r))
        out.append(
            f"| {fault} (n={len(recs)}) | " + " | ".join(f"{k}: {_fmt([r[k] for r in recs if k in r])}" for k in keys)
        )
    scale = by_fault.get("ray_scale", [])
    if scale:
        keys = list(dict.fromkeys(k for r in scale for k in r))
        out += ["", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        out += ["| " + " | ".join(_fmt([r.get(k, "")]) for k in keys) + " |" for r in scale]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=1, help="runs of the fault scenarios (0: none)")
    ap.add_argument("--only", default="", help="run these test files instead of both fault modules (comma-separated)")
    ap.add_argument("--scale", default="", help="node counts to grow one cluster through, e.g. 4,8,12,16")
    ap.add_argument(
        "--scale-mode",
        choices=["namespaces", "logical"],
        default="namespaces",
        help="namespaces: each Ray node its own host; logical: raylets sharing one host and address",
    )
    ap.add_argument("--timings", default="", help="JSON-lines file to append to (default: a new temporary one)")
    ap.add_argument("--report", default="", help="only print the tables of an existing timings file")
    args = ap.parse_args()
    if args.report:
        print(report(Path(args.report)))
        return 0
    timings = Path(args.timings or tempfile.mkstemp(prefix="multihost-", suffix=".jsonl")[1])
    failed = 0
    paths = [p for p in args.only.split(",") if p] or FAULT_TESTS
    for i in range(args.runs):
        rc, wall = run(paths, timings, {})
        print(f"run {i + 1}: rc={rc}, {wall:.0f} s", file=sys.stderr)
        failed += rc != 0
    if args.scale:
        env = {"PEARL_MULTIHOST_SCALE": args.scale, "PEARL_MULTIHOST_SCALE_MODE": args.scale_mode}
        rc, wall = run([SCALE_TEST], timings, env)
        print(f"scale: rc={rc}, {wall:.0f} s", file=sys.stderr)
        failed += rc != 0
    print(f"timings: {timings}")
    print(report(timings))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
