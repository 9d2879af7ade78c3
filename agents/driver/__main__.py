"""`python -m agents.driver`: the command line of a job's rollout driver (how a node agent starts one)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path

import agents.driver
from agents.driver.link import run_driver

log = logging.getLogger("pearl.driver")


def main(argv: list[str] | None = None) -> None:
    summary = (agents.driver.__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog="python -m agents.driver", description=summary)
    p.add_argument("--control-plane", required=True, help="http(s)://host:port of the control plane")
    p.add_argument("--job", required=True)
    p.add_argument("--time-factor", type=float, default=1.0, help="scale of environment (tool) latencies")
    p.add_argument(
        "--state-dir", default=None, help="the driver's own directory (its turn journal); none: nothing is journaled"
    )
    # accepted so an agent can spawn the driver like a worker
    for extra in ("--role", "--worker-id", "--engine", "--hardware", "--model"):
        p.add_argument(extra, default=None)
    args = p.parse_args(argv)
    token = os.environ.get("PEARL_DRIVER_TOKEN", "")
    if not token:
        sys.exit("PEARL_DRIVER_TOKEN is not set: the driver link needs the job's driver token")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s driver %(levelname)s %(message)s")
    from agents.process import die_with_parent

    die_with_parent()  # an agent's driver stops with its agent (the restarted agent starts it again)
    started = time.monotonic()
    state_dir = Path(args.state_dir) if args.state_dir else None
    asyncio.run(run_driver(args.control_plane, args.job, token, time_factor=args.time_factor, state_dir=state_dir))
    log.info("driver for %s stopped after %.0f s", args.job, time.monotonic() - started)


if __name__ == "__main__":
    main()
