"""What a cluster manager (Ray today) says about its nodes, as typed PEARL events, and the one pure
rule that turns them into what PEARL must do.

The adapter (agents/ray_adapter.py) reports the *level* of every node each time it looks (up,
draining with its deadline, dead with its death reason), never edges: a bridge that restarts reads the
same levels again and `reconcile` asks for nothing that PEARL's nodes already show. That is what makes
the bridge stateless.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

DrainReason = Literal["preemption", "idle_termination", "unknown"]
# Ray's NodeDeathInfo.Reason names, kept as Ray spells them (they go into PEARL's event as recorded)
DEATH_REASONS = (
    "UNSPECIFIED",
    "EXPECTED_TERMINATION",
    "UNEXPECTED_TERMINATION",
    "AUTOSCALER_DRAIN_PREEMPTED",
    "AUTOSCALER_DRAIN_IDLE",
)
POOL_LABEL = "pearl.io/pool"  # a Ray node label: reserved (default), elastic or training
HARDWARE_LABEL = "pearl.io/hardware"  # the GPUs' hardware profile (default: cpu, logical slots)
_HEX = re.compile(r"^[0-9a-f]{16,64}$")


@dataclass(frozen=True, slots=True)
class NodeUp:
    """An alive node that is not draining."""

    ray_node_id: str
    address: str  # the node's IP as Ray knows it (NodeManagerAddress)
    hostname: str = ""
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    is_head: bool = False

    @property
    def gpus(self) -> int:
        return int(self.resources.get("GPU", 0))


@dataclass(frozen=True, slots=True)
class NodeDraining:
    """An alive node Ray is draining. `deadline` is a Unix time (s), None when the drain has none.
    Ray (2.60) exposes a live drain's deadline but not its reason; the adapter infers the reason
    (a deadline means preemption: an idle-termination drain is refused on a node whose agent holds
    its GPUs) and the node's death reason confirms it afterwards."""

    ray_node_id: str
    address: str
    deadline: float | None
    reason: DrainReason = "unknown"
    up: NodeUp | None = None  # what the node looked like (its resources, labels)


@dataclass(frozen=True, slots=True)
class NodeDead:
    """A node Ray declared dead, with Ray's death reason and message (e.g. UNEXPECTED_TERMINATION,
    "health check failed due to missing too many heartbeats")."""

    ray_node_id: str
    address: str
    reason: str
    message: str = ""


NodeEvent = NodeUp | NodeDraining | NodeDead


def pearl_node_name(ray_node_id: str) -> str:
    """The PEARL node name of a Ray node: stable for the raylet's life (a restarted raylet is a new
    Ray node, so a new PEARL node; the old one is gone with Ray's death reason)."""
    if not _HEX.match(ray_node_id):
        raise ValueError(f"not a Ray node id: {ray_node_id!r}")
    return f"ray-{ray_node_id[:12]}"


def pool_of(up: NodeUp) -> str:
    pool = up.labels.get(POOL_LABEL, "reserved")
    return pool if pool in ("reserved", "elastic", "training") else "reserved"


def hardware_of(up: NodeUp) -> str:
    return up.labels.get(HARDWARE_LABEL, "cpu")[:32] or "cpu"


def eligible(up: NodeUp, *, include_head: bool = False) -> bool:
    """A node gets a PEARL agent when it has at least one GPU (logical ones count) and is not the
    head, unless asked (a one-node cluster)."""
    return up.gpus >= 1 and (include_head or not up.is_head)


@dataclass(frozen=True, slots=True)
class PearlNodeView:
    """What PEARL's database says about a Ray-bound node (read by the bridge's service)."""

    name: str
    ray_node_id: str
    status: str  # ready | not_ready | draining | gone
    pool: str
    preemption_deadline: float | None = None  # Unix time
    ray_death_recorded: bool = False  # an event of this node already carries Ray's death reason
    live_workers: int = 0  # PEARL workers still alive on it (a drain is over when none is left)


# What the bridge must do; each is idempotent and asked for only when PEARL does not show it yet.
@dataclass(frozen=True, slots=True)
class PlaceAgent:
    node: NodeUp


@dataclass(frozen=True, slots=True)
class Bind:
    """Record the Ray id and address on a PEARL node registered by the bridge's agent."""

    name: str
    ray_node_id: str
    address: str


@dataclass(frozen=True, slots=True)
class Notice:
    name: str
    deadline: float


@dataclass(frozen=True, slots=True)
class Drain:
    name: str
    why: str


@dataclass(frozen=True, slots=True)
class Gone:
    name: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class DeathRecorded:
    """PEARL had already let the node go (its preemption deadline passed first): only Ray's reason is news."""

    name: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Release:
    """PEARL let an elastic node go on its own (it drained it: its pool shrank, or an operator drained it)
    and no worker is left there: stop its agent (which frees the node's GPUs in Ray) and ask Ray to drain
    the node as idle, so the cluster's autoscaler can give the machine back (DrainNode IDLE_TERMINATION)."""

    name: str
    ray_node_id: str


Action = PlaceAgent | Bind | Notice | Drain | Gone | DeathRecorded | Release
DEADLINE_SLACK_S = 1.0  # a PEARL deadline this close to Ray's is the same notice (ms vs s rounding)


def released(ev: NodeEvent, view: PearlNodeView | None) -> bool:
    """PEARL is done with this elastic node but Ray is not draining it: PEARL drained it itself (a Ray drain
    shows as NodeDraining) and its last worker is gone."""
    return (
        isinstance(ev, NodeUp)
        and view is not None
        and view.ray_node_id == ev.ray_node_id
        and view.pool == "elastic"
        and view.status == "draining"
        and view.live_workers == 0
    )


def reconcile(
    observed: list[NodeEvent],
    pearl: dict[str, PearlNodeView],
    agents: set[str],
    *,
    include_head: bool = False,
    release_drained: bool = False,
) -> list[Action]:
    """The actions that make PEARL show what Ray shows; [] when it already does.

    `pearl` maps PEARL node name -> its view (Ray-bound nodes and nodes whose agent registered under a
    Ray name); `agents` holds the Ray node ids that have a live agent actor. A node Ray lists as dead is
    gone in PEARL at once (its lease need not run out), a preemption drain becomes PEARL's notice with
    Ray's deadline (a non-elastic node cannot be preempted in PEARL: it is drained), any other drain a
    drain. With `release_drained`, an elastic node PEARL drained itself is handed back to Ray once its
    workers are gone (`Release`), and no agent is placed on it again."""
    actions: list[Action] = []
    for ev in observed:
        name = pearl_node_name(ev.ray_node_id)
        view = pearl.get(name)
        if isinstance(ev, NodeDead):
            if view is not None and view.status != "gone":
                actions.append(Gone(name, ev.reason, ev.message))
            elif view is not None and view.ray_node_id == ev.ray_node_id and not view.ray_death_recorded:
                actions.append(DeathRecorded(name, ev.reason, ev.message))
            continue
        up = ev if isinstance(ev, NodeUp) else ev.up
        if up is None or not eligible(up, include_head=include_head):
            continue
        if release_drained and released(ev, view):
            actions.append(Release(name, ev.ray_node_id))  # stateless: asked again until Ray drains it
            continue
        if isinstance(ev, NodeUp) and ev.ray_node_id not in agents:
            actions.append(PlaceAgent(ev))
        if view is None:
            continue  # its agent has not registered yet; the next look binds it
        if view.ray_node_id != ev.ray_node_id:
            actions.append(Bind(name, ev.ray_node_id, ev.address))
        if isinstance(ev, NodeDraining) and view.status != "gone":
            if ev.reason == "preemption" and ev.deadline is not None and view.pool == "elastic":
                if view.preemption_deadline is None or abs(view.preemption_deadline - ev.deadline) > DEADLINE_SLACK_S:
                    actions.append(Notice(name, ev.deadline))
            elif view.status != "draining":
                actions.append(Drain(name, f"Ray drains the node ({ev.reason})"))
    return actions
