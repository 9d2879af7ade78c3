"""The node agent without a control plane (demo and lightweight mode): one active colocated worker per
slot, serving until stopped."""

from __future__ import annotations

import asyncio
import json
import os

from agents.node.session import NodeAgent
from controlplane.core import agent_link as link
from controlplane.core.state import Activity, Role


async def run_standalone(agent: NodeAgent, model: str) -> None:
    """No control plane (demo/lightweight mode): one active colocated worker per slot, serving
    until SIGTERM; endpoints and secrets go to <state-dir>/workers.json (mode 0600)."""
    workers = [
        link.DesiredWorker(
            worker_id=i + 1,
            gpus=[i],
            role=Role.COLOCATED,
            activity=Activity.ACTIVE,
            engine=agent.cfg.engine,
            model=model,
        )
        for i in range(agent.cfg.slots)
    ]
    async with agent.serving():
        agent.apply(link.DesiredState(generation=1, epoch=0, status="ready", workers=workers))
        while not agent.stopping.is_set() and not (
            len(agent.workers) == len(workers) and all(m.state == "running" for m in agent.workers.values())
        ):
            await asyncio.sleep(0.1)
        listing = [
            {"worker_id": w, "endpoint": m.proc.endpoint, "secret": m.proc.secret}
            for w, m in agent.workers.items()
            if m.proc is not None
        ]
        path = agent.cfg.state_dir / "workers.json"
        agent.cfg.state_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(listing, f)
        ready = {"workers": [x["endpoint"] for x in listing], "secrets_file": str(path)}
        print("PEARL_AGENT_READY " + json.dumps(ready), flush=True)
        await agent.stopping.wait()
