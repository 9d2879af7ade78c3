"""Hardening figures, faults: runs the real-process fault suite (tests/fault) R times and reports, per
fault, how many were injected and survived, and the detection and recovery times (median and max):

- agent_kill9: agent killed -> its lease expired and the node fenced (detect) / agent restarted -> node
  ready with every desired worker running again (recover); lease 3 s, sweep 1 s, heartbeat 0.5 s;
- worker_kill9: worker killed -> crash reported with its partial output (detect) / running again (recover);
- trainer_kill9: trainer killed -> back at its published version on a new endpoint (recover);
- redis_restart: Redis back (empty) -> a change made meanwhile reaches the agent (recover);
- lease_expiry_paused_agent: SIGSTOP -> fenced (detect) / SIGCONT -> resynced (recover);
- preemption: notice -> in-flight request drained, partial reported, worker stopped (drain);
- borrowed_return_at_training_begin: Training Begin -> the borrowed worker parked (return);
- launcher_agent_kill9: an agent under `manage.py launch` killed -> re-registered by the supervisor;
- job_pause_resume: a job paused mid-rollout -> its rollout workers drained and released (released) / resumed ->
  a trajectory finished again (rollout_back).

Usage: .venv/bin/python benchmarks/bench_faults.py [--runs 3] [--json]  (uses scripts/test.sh: its own Redis;
PostgreSQL when DATABASE_URL or 127.0.0.1:5432 has one)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    timings = Path(tempfile.mkdtemp(prefix="pearl-faults-")) / "timings.jsonl"
    outcomes: list[dict] = []
    for run in range(args.runs):
        env = dict(os.environ, PEARL_FAULT_TIMINGS=str(timings))
        r = subprocess.run(["scripts/test.sh", "tests/fault", "-q"], cwd=ROOT, env=env, capture_output=True, text=True)
        tail = [line for line in r.stdout.splitlines() if " passed" in line or " failed" in line]
        outcomes.append({"run": run + 1, "rc": r.returncode, "summary": tail[-1] if tail else r.stdout[-300:]})
        print(json.dumps(outcomes[-1]), file=sys.stderr, flush=True)
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line in timings.read_text().splitlines() if timings.exists() else []:
        rec = json.loads(line)
        for k, v in rec.items():
            if k != "fault":
                per[rec["fault"]][k].append(v)
    figures = {
        fault: {
            "survived": max(len(v) for v in vals.values()),
            **{k: {"median_s": round(statistics.median(v), 2), "max_s": round(max(v), 2)} for k, v in vals.items()},
        }
        for fault, vals in sorted(per.items())
    }
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "runs": outcomes,
        "injected_per_fault": args.runs,
        "faults": figures,
    }
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
