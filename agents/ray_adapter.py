"""The one module that imports Ray (an optional extra: `pip install -e '.[ray]'`).

It reads Ray's node table (`ray.nodes()`, straight from the GCS) and its drains
(`get_draining_nodes()`, private: `{node_hex: deadline_ms}`) and turns them into the typed events of
controlplane.core.cluster_events; it places one PEARL node agent per Ray node as a detached actor
with hard node affinity, holding the node's GPUs, restarted by Ray when it dies; and it can ask Ray to
drain a node (`GcsClient.drain_node`, what `ray drain-node` calls). Everything here may change with
Ray's private API; nothing else in PEARL touches it.

The agent actor runs the ordinary node agent (`agents.node.run_agent`) on its own event loop thread:
it dials the control plane over the agent link from the node's own address, as an agent started by
hand would. If the agent ends by itself the actor exits, so Ray starts it again (the agent's new
incarnation re-registers with a new epoch and kills what the old one left).
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from agents.process import normal_priority
from controlplane.core.cluster_events import (
    DEATH_REASONS,
    NodeDead,
    NodeDraining,
    NodeEvent,
    NodeUp,
    hardware_of,
    pearl_node_name,
    pool_of,
)

NAMESPACE = "pearl"
ACTOR_PREFIX = "pearl-agent-"
# DrainNodeReason values of Ray's autoscaler proto (what `ray drain-node --reason` names)
DRAIN_REASONS = {"idle_termination": 1, "preemption": 2}


def connect(address: str) -> None:
    """Join the Ray cluster at HOST:PORT as a driver in PEARL's namespace (no-op if connected)."""
    if not ray.is_initialized():
        ray.init(
            address=address,
            namespace=NAMESPACE,
            logging_level=logging.ERROR,
            log_to_driver=False,
            configure_logging=False,
        )


def disconnect() -> None:
    if ray.is_initialized():
        ray.shutdown()


def _death_reason(value: Any) -> str:
    if isinstance(value, int) and 0 <= value < len(DEATH_REASONS):
        return DEATH_REASONS[value]
    return str(value or "UNSPECIFIED")


def observe() -> list[NodeEvent]:
    """Every node Ray knows, as its current level: NodeUp, NodeDraining (deadline in Unix seconds;
    a deadline means a preemption drain: Ray refuses an idle-termination drain on a node whose agent
    holds GPUs, and KubeRay's SIGTERM drain always has one) or NodeDead (Ray's reason and message)."""
    from ray._private.state import state

    draining: dict[str, int] = dict(state.get_draining_nodes())
    events: list[NodeEvent] = []
    for n in ray.nodes():
        node_id, address = str(n["NodeID"]), str(n.get("NodeManagerAddress", ""))
        if not n.get("Alive"):
            events.append(
                NodeDead(
                    node_id, address, _death_reason(n.get("DeathReason")), str(n.get("DeathReasonMessage", ""))[:500]
                )
            )
            continue
        resources = {k: float(v) for k, v in (n.get("Resources") or {}).items() if not k.startswith("node:")}
        up = NodeUp(
            node_id,
            address,
            str(n.get("NodeManagerHostname", "")),
            resources,
            {str(k): str(v) for k, v in (n.get("Labels") or {}).items()},
            is_head="node:__internal_head__" in (n.get("Resources") or {}),
        )
        if node_id in draining:
            deadline_ms = int(draining[node_id] or 0)
            deadline = deadline_ms / 1000.0 if deadline_ms > 0 else None
            events.append(
                NodeDraining(
                    node_id, address, deadline, "preemption" if deadline is not None else "idle_termination", up
                )
            )
        else:
            events.append(up)
    return events


def drain(ray_node_id: str, *, reason: str, message: str, deadline_s: float | None = None) -> tuple[bool, str]:
    """Ask Ray to drain a node (PEARL shrinking its elastic pool, or a test playing the cloud):
    (accepted, Ray's rejection message). Ray does not kill the node at the deadline: the caller does."""
    from ray._private.worker import global_worker

    # ray._raylet is compiled and has no stub; looked up at run time so mypy sees it alike with or without Ray.
    GcsClient = importlib.import_module("ray._raylet").GcsClient

    if global_worker.node is None:
        raise RuntimeError("not connected to Ray: call connect() first")
    deadline_ms = int((time.time() + deadline_s) * 1000) if deadline_s is not None else 0
    gcs = GcsClient(address=global_worker.node.gcs_address)
    accepted, rejection = gcs.drain_node(ray_node_id, DRAIN_REASONS[reason], message, deadline_ms)
    return bool(accepted), str(rejection or "")


def agent_actors() -> set[str]:
    """Ray node ids that have a PEARL agent actor (alive, restarting or pending) in PEARL's namespace."""
    names = ray.util.list_named_actors(all_namespaces=False)
    return {n[len(ACTOR_PREFIX) :] for n in names if isinstance(n, str) and n.startswith(ACTOR_PREFIX)}


@dataclass(frozen=True)
class NodeAgentSpec:
    """What a node's agent is started with (everything but its node comes from the bridge's flags)."""

    control_plane: str
    token: str
    dataplane_secret: str = ""
    engine: str = "emulated"
    time_factor: float = 1.0
    state_root: str = "/tmp/pearl-agents"
    drain_timeout_s: float = 10.0


def place_agent(node: NodeUp, spec: NodeAgentSpec) -> str:
    """Start the PEARL agent of `node` as a detached, named actor pinned to it (soft=False: it runs
    there or not at all), holding all of its GPUs (so Ray schedules nothing else on them) and
    restarted by Ray whenever it dies. Returns the actor's name. Raises ValueError if one exists."""
    name = ACTOR_PREFIX + node.ray_node_id
    AgentActor.options(  # type: ignore[attr-defined]
        name=name,
        namespace=NAMESPACE,
        lifetime="detached",
        max_restarts=-1,
        max_task_retries=0,
        num_cpus=0,
        num_gpus=node.gpus,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node.ray_node_id, soft=False),
    ).remote(pearl_node_name(node.ray_node_id), pool_of(node), hardware_of(node), node.gpus, spec)
    return name


def agent_info(ray_node_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """The agent actor's own account: its PEARL node name, pid, Ray node id, GPU ids, restarts."""
    actor = ray.get_actor(ACTOR_PREFIX + ray_node_id, namespace=NAMESPACE)
    info: Any = ray.get(actor.info.remote(), timeout=timeout_s)
    return dict(info)


def stop_agent(ray_node_id: str, timeout_s: float = 30.0) -> None:
    """Stop a node's agent for good: it drains its workers first, then the actor is removed."""
    try:
        actor = ray.get_actor(ACTOR_PREFIX + ray_node_id, namespace=NAMESPACE)
    except ValueError:
        return
    try:
        ray.get(actor.stop.remote(), timeout=timeout_s)
    finally:
        ray.kill(actor, no_restart=True)
    # ray.kill returns at once; the actor (and the GPUs it holds) is gone when its name is released, which an
    # idle-termination drain right after needs (else Ray answers "no longer idle")
    deadline = time.monotonic() + timeout_s
    while ray_node_id in agent_actors() and time.monotonic() < deadline:
        time.sleep(0.05)


@ray.remote
class AgentActor:
    """A PEARL node agent inside Ray. Its slots are the GPUs Ray assigned it (logical on a CPU box)."""

    def __init__(self, node: str, pool: str, hardware: str, slots: int, spec: NodeAgentSpec) -> None:
        from agents.node import run_agent
        from agents.node.config import AgentConfig

        ctx = ray.get_runtime_context()
        self.node, self.ray_node_id = node, ctx.get_node_id()
        self.gpu_ids = [str(g) for g in ctx.get_accelerator_ids().get("GPU", [])]
        self.started = time.time()
        # the node's Ray IP: the address it dials the control plane from, so the one the control plane
        # records its endpoints on; off loopback only with a data-plane secret (AgentConfig refuses otherwise)
        self.address = ray.util.get_node_ip_address() if spec.dataplane_secret else "127.0.0.1"
        cfg = AgentConfig(
            control_plane=spec.control_plane,
            token=spec.token,
            node=node,
            pool=pool,
            hardware=hardware,
            slots=max(1, len(self.gpu_ids) or slots),
            engine=spec.engine,
            time_factor=spec.time_factor,
            state_dir=Path(spec.state_root) / node,
            dataplane_secret=spec.dataplane_secret,
            drain_timeout_s=spec.drain_timeout_s,
            bind_address=self.address,
        )
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._done = threading.Event()
        self._stopping = False

        self.niceness: int | None = None

        def serve() -> None:
            self.niceness = normal_priority()  # before the agent starts anything: its workers inherit it
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(run_agent(cfg, stop=self._stop))
            finally:
                self._done.set()
                if not self._stopping:  # the agent ended by itself: let Ray start a new one
                    os._exit(1)

        # the agent's workers die with the thread that spawned them (PR_SET_PDEATHSIG): this one,
        # which lives as long as the actor
        threading.Thread(target=serve, name=f"agent-{node}", daemon=True).start()

    def info(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "pid": os.getpid(),
            "ray_node_id": self.ray_node_id,
            "gpu_ids": self.gpu_ids,
            "address": self.address,
            "started": self.started,
            "restarts": ray.get_runtime_context().was_current_actor_reconstructed,
            "niceness": self.niceness,  # the agent thread's (Ray starts actors at nice 15)
        }

    def stop(self) -> bool:
        self._stopping = True
        self._loop.call_soon_threadsafe(self._stop.set)
        return self._done.wait(timeout=60)
