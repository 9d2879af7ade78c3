"""Node agent: one per machine. Registers with the control plane over the agent link and reconciles
its worker processes to the desired state it receives.

    python -m agents.node --control-plane http://127.0.0.1:8000 --slots 4 --pool elastic \
        --hardware H800 --engine emulated          # token from env PEARL_AGENT_TOKEN (or --token)

Level-triggered, like a kubelet: every `desired_state` is the node's full desired state; the agent
recomputes what to do from (desired, observed) every time and again periodically, so a missed or
repeated message changes nothing. Fencing: a desired state with a generation lower than the last
applied one, or an epoch lower than the node's current epoch, is refused (ignored and reported).
Workers are separate processes (`agents.worker`, or `agents.trainer` for role training) on ports of the
agent's bind address (loopback by default; the node's address with `--bind-address` when drivers and
workers on other hosts call them) with per-worker secrets, each pinned to its slots' devices
(CUDA_VISIBLE_DEVICES = the slot indexes of its GPU set G_w) and in its own process group; the agent
restarts a crashed worker and reports the crash with the partial outputs of the requests it had in flight
(from the worker's journal). A restarted agent first kills whatever its previous incarnation left running
(lease files, see agents.process) and reports their journals. SIGTERM or a preemption notice drains the
workers gracefully before the deadline. Weights are pulled with the scoped token of the desired state;
the agent holds no cluster-wide weights secret.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from agents.node.config import AgentConfig
from agents.node.session import NodeAgent
from agents.node.standalone import run_standalone
from controlplane.core.state import Pool


async def run_agent(cfg: AgentConfig, *, model: str = "tiny", stop: asyncio.Event | None = None) -> NodeAgent:
    """Run one node agent until `stop` is set (then it drains its workers and sends a last heartbeat)
    and return it. With `cfg.control_plane` it registers and reconciles; without, it runs standalone:
    one colocated worker per slot serving `model`. For callers that run agents in their own processes
    (a Ray actor, a test); installs no signal handler."""
    agent = NodeAgent(cfg)
    if stop is not None:
        agent.stopping = stop
    if cfg.control_plane:
        await agent.run()
    else:
        await run_standalone(agent, model)
    return agent


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m agents.node", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--control-plane",
        default="",
        help="http(s)://host:port of the control plane (or its ws URL); "
        "without it the agent runs standalone: one colocated worker per slot",
    )
    p.add_argument("--model", default="tiny", help="standalone mode: the model the workers serve")
    p.add_argument("--token", default="", help="node token (prefer env PEARL_AGENT_TOKEN: argv is visible in ps)")
    p.add_argument("--node", default="", help="node name (default: hostname-pid)")
    p.add_argument("--slots", type=int, default=1)
    p.add_argument("--pool", choices=[x.value for x in Pool], default="reserved")
    p.add_argument("--hardware", default="H800")
    p.add_argument("--memory-mb", type=int, default=0)
    p.add_argument("--engine", choices=["torch", "emulated", "vllm"], default="emulated")
    p.add_argument("--time-factor", type=float, default=1.0)
    p.add_argument(
        "--interference",
        type=float,
        default=1.0,
        help="emulated engine: prefill next to running decodes costs this x its roofline time "
        "(1 = the additive roofline); PEARL measures it and the job page shows it",
    )
    p.add_argument("--state-dir", default="")
    p.add_argument("--drain-timeout", type=float, default=10.0)
    p.add_argument("--dataplane-port", type=int, default=0)
    p.add_argument(
        "--bind-address",
        default="127.0.0.1",
        help="where the agent's data plane, workers and trainers listen: the node's address (or 0.0.0.0 "
        "with --advertise-address) when drivers and workers on other hosts call them; off loopback "
        "it needs PEARL_DATAPLANE_SECRET",
    )
    p.add_argument(
        "--advertise-address",
        default="",
        help="the address other hosts reach this node's endpoints at (default: --bind-address); the "
        "control plane records endpoints only on the address it sees the agent connect from",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    from agents.engines.emulated import check_interference

    try:
        check_interference(args.interference)
    except ValueError as exc:
        p.error(f"--interference: {exc}")
    if args.interference != 1.0 and args.engine != "emulated":
        p.error("--interference applies to the emulated engine only")
    token = args.token or os.environ.get("PEARL_AGENT_TOKEN", "")
    if args.control_plane and not token:
        sys.exit("no node token: set PEARL_AGENT_TOKEN (or --token)")
    node = args.node or f"{os.uname().nodename}-{os.getpid()}"
    try:
        cfg = AgentConfig(
            control_plane=args.control_plane,
            token=token,
            node=node,
            pool=args.pool,
            hardware=args.hardware,
            slots=args.slots,
            engine=args.engine,
            time_factor=args.time_factor,
            interference=args.interference,
            state_dir=Path(args.state_dir or f"./.pearl-agent/{node}"),
            dataplane_secret=os.environ.get("PEARL_DATAPLANE_SECRET", ""),
            dataplane_port=args.dataplane_port,
            drain_timeout_s=args.drain_timeout,
            memory_mb=args.memory_mb,
            bind_address=args.bind_address,
            advertise_address=args.advertise_address,
        )
    except ValueError as exc:
        sys.exit(str(exc))

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)  # graceful: drain workers, final heartbeat
        await run_agent(cfg, model=args.model, stop=stop)

    asyncio.run(runner())
