"""Nodes as the REST API lists them, and the GPUs the launch form and job admission may count on."""

from __future__ import annotations

from django.db.models import Count, Q, QuerySet

from controlplane.core.state import NodeStatus, Pool
from controlplane.models import GPU, Node


def nodes(*, name: str | None = None) -> QuerySet[Node]:
    """The node list (by name; `?name=` picks one), each with `present_gpus`: its GPU slots present now."""
    qs = Node.objects.annotate(present_gpus=Count("gpus", filter=Q(gpus__present=True)))
    return qs.filter(name=name) if name else qs


def present_gpus(node: Node) -> int:
    """A node's GPU slots present now: the list's annotation, or one count for a node read on its own."""
    annotated = getattr(node, "present_gpus", None)
    return annotated if annotated is not None else GPU.objects.filter(node=node, present=True).count()


def available_gpus() -> dict[str, int]:
    """GPUs present on nodes that can take work, by pool."""
    counts = {p.value: 0 for p in Pool}
    for pool in (
        GPU.objects.filter(present=True).exclude(node__status=NodeStatus.GONE).values_list("node__pool", flat=True)
    ):
        counts[pool] += 1
    return counts
