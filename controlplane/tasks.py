"""Thin Celery wrappers over services. Tasks take ids, never objects; all are idempotent (acks_late)."""
from __future__ import annotations

from celery import shared_task

from controlplane.services import nodes, telemetry


@shared_task(name="controlplane.sweep")
def sweep() -> dict[str, list[str] | int]:
    """Heartbeat sweeper: expire leases (fence before reassignment), remove preempted nodes, prune telemetry."""
    expired = nodes.expire_leases()
    gone = nodes.remove_preempted()
    pruned = telemetry.prune()
    return {"expired": expired, "gone": gone, "pruned": pruned}


@shared_task(name="controlplane.echo")
def echo(payload: dict) -> dict:
    """Round-trip probe used by health checks and tests (proves JSON serialisation through the broker)."""
    return {"echo": payload}
