"""Hardening figures, fuzzing: schema-driven REST calls and agent-link frames against a real Daphne.

1. schemathesis over the OpenAPI schema (every operation, positive and negative input, an operator and
   a reader token), several seeds: calls made, 5xx answers (target 0 in >= 20,000 calls), other
   check failures, and the status-code mix;
2. generated agent-link frames on one registered socket: frames tried, error replies, the link kept.

Usage: .venv/bin/python benchmarks/bench_fuzz.py [--examples 150] [--seeds 3] [--frames 2000] [--json]
Runs against its own temporary SQLite database and its own Redis (private port).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_controlplane import PY, ROOT, free_port, setup_django, wait_port
from harness import start_redis, stop


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--examples", type=int, default=150, help="cases per operation, mode and user, per seed")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--frames", type=int, default=2000)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pearl-fuzz-"))
    redis, rport = start_redis()
    port = free_port()
    redis_url = f"redis://127.0.0.1:{rport}"
    os.environ["PEARL_VAR_DIR"] = str(tmp)
    setup_django(tmp / "fuzz.sqlite3", redis_url)
    from controlplane.services.credentials import issue_agent_token
    from tests.fuzz.conftest import seed_state
    from tests.fuzz.link_fuzz import fuzz_link
    from tests.fuzz.schema_fuzz import FuzzReport, fuzz

    tokens = seed_state()
    agent_token = issue_agent_token(node_name="fz-link")
    env = dict(
        os.environ,
        DATABASE_URL=f"sqlite:///{tmp / 'fuzz.sqlite3'}",
        REDIS_URL=redis_url,
        DEBUG="0",
        PEARL_WRITE_RATE="100000000/min",
        PYTHONPATH=str(ROOT),
    )
    env.pop("PEARL_TESTING", None)
    web = subprocess.Popen(
        [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "pearl_site.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=open(tmp / "daphne.log", "wb"),  # noqa: SIM115 (open while the server runs)
        stderr=subprocess.STDOUT,
    )
    try:
        wait_port(port)
        base = f"http://127.0.0.1:{port}"
        total = FuzzReport()
        for s in range(args.seeds):
            r = fuzz(base, tokens, examples=args.examples, seed_value=1000 + s)
            total.merge(r)
            print(
                f"seed {1000 + s}: {r.calls} calls, {len(r.server_errors)} 5xx, {len(r.nonconforming)} other failures, "
                f"{r.seconds:.0f} s",
                file=sys.stderr,
            )
        link = fuzz_link(
            base.replace("http", "ws") + "/ws/agent/", agent_token, "fz-link", examples=args.frames, seed_value=7
        )
    finally:
        stop([web, redis])
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.python_implementation()} {platform.python_version()}",
        "database": "sqlite",
        "api": {
            "calls": total.calls,
            "server_errors": len(total.server_errors),
            "nonconforming": len(total.nonconforming),
            "statuses": dict(sorted(total.statuses.items())),
            "seconds": round(total.seconds, 1),
            "calls_per_s": round(total.calls / total.seconds, 1) if total.seconds else None,
            "unsatisfiable": sorted(set(total.unsatisfiable)),
            "failure_kinds": dict(total.failure_kinds.most_common(20)),
            "first_server_errors": total.server_errors[:10],
        },
        "link": {
            "frames": link.frames,
            "error_replies": link.error_replies,
            "link_kept": link.link_kept,
            "closed_1011": link.closed_1011,
            "problems": link.problems[:10],
            "seconds": round(link.seconds, 1),
        },
    }
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
