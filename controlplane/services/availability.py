"""Preemptible capacity that comes and goes: hold the elastic pool at a target number of GPUs.

An availability trace (the simulator's `AvailabilityTrace`, the same file format) says how many
rollout GPUs exist at each moment; on a live cluster the elastic nodes whose agents run are the
supply, and this use case takes nodes away with a preemption notice (the node drains, its partial
trajectories are kept, it is removed at the deadline) or gives them back, in a stable order, so the
planner sees the same capacity changes the simulator replays."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from controlplane.core.state import NodeStatus, Pool
from controlplane.models import Node
from controlplane.services import draining, leases
from controlplane.services.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class AvailabilityChange:
    """What one call did: the elastic GPUs up before and after, the nodes noticed and returned."""

    target_gpus: int
    before_gpus: int
    after_gpus: int
    preempted: tuple[str, ...]
    returned: tuple[str, ...]


def _gpus(node: Node) -> int:
    return node.gpus.count()


def _leased(node: Node, now: datetime) -> bool:
    """Whether the node's agent still holds its lease: the effective expiry (its Redis renewal, else the row's),
    as `draining.undrain_node` decides it; the row's lease alone is coarse while Redis renews."""
    expiry, _ = leases.effective_expiry(node.pk, epoch=node.epoch, row_lease=node.lease_expires)
    return expiry is not None and expiry > now


def set_elastic_capacity(*, gpus: int, notice_s: float, actor: str) -> AvailabilityChange:
    """Keep the elastic nodes that are up (ready) at the largest whole-node count of GPUs not above
    `gpus`: give back nodes under notice or preempted whose agents still hold a lease (first by name), or
    send preemption notices with `notice_s` seconds of warning (last by name). Nodes already under
    notice count as gone. Idempotent: a second call with the same target changes nothing."""
    if gpus < 0:
        raise InvalidInput("the elastic capacity must be >= 0 GPUs", field="gpus")
    if not 0 < notice_s <= draining.MAX_PREEMPTION_NOTICE_S:
        raise InvalidInput("the preemption notice must be within (0, 24 h]", field="notice_s")
    now = timezone.now()
    elastic = list(Node.objects.filter(pool=Pool.ELASTIC).order_by("name"))
    up = [n for n in elastic if n.status == NodeStatus.READY]
    # taken away by a preemption (not drained by an operator), with an agent still there to serve
    back = [
        n
        for n in elastic
        if (n.status == NodeStatus.GONE or (n.status == NodeStatus.DRAINING and n.preemption_deadline))
        and _leased(n, now)
    ]
    before = sum(_gpus(n) for n in up)
    have, preempted, returned = before, [], []
    for n in back:  # grow: the first nodes by name come back while they fit
        if have + _gpus(n) > gpus:
            break
        draining.undrain_node(node_id=n.pk, actor=actor)
        have += _gpus(n)
        returned.append(n.name)
    noticed: list[int] = []
    for n in reversed(up):  # shrink: the last nodes by name go first, all in one notice call
        if have <= gpus:
            break
        noticed.append(n.pk)
        have -= _gpus(n)
        preempted.append(n.name)
    if noticed:
        deadline = now + timedelta(seconds=notice_s)
        draining.preemption_notices(deadlines=dict.fromkeys(noticed, deadline), actor=actor)
    return AvailabilityChange(gpus, before, have, tuple(preempted), tuple(returned))


def elastic_target(trace_gpus: int, trace_peak: int, *, reserved: int, elastic: int) -> int:
    """A trace's rollout GPUs (reserved included, as the paper's traces count them) scaled to this
    cluster: the trace's peak maps to reserved + elastic; what lies above the reserved pool is the
    elastic supply, never more than the elastic nodes have."""
    if trace_peak <= 0:
        return 0
    scaled = trace_gpus * (reserved + elastic) / trace_peak
    return max(0, min(elastic, round(scaled - reserved)))
