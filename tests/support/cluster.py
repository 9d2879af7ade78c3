"""A cluster made through the real services, without agent processes: nodes registered as their agents
would, jobs created as the API would, and agents that report their desired state as done."""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controlplane.models import Job, Node, Transition


def make_node(
    name: str, *, pool: str = "reserved", slots: int = 4, hardware: str = "cpu", incarnation: str = "i1"
) -> Node:
    """Register a node the way its agent would (through the service, with its own token)."""
    from controlplane.core.agent_link import Register, SlotSpec
    from controlplane.core.state import Pool
    from controlplane.models import AgentCredential
    from controlplane.services.credentials import issue_agent_token
    from controlplane.services.registration import register_node

    issue_agent_token(node_name=name)
    cred = AgentCredential.objects.filter(node_name=name).latest("created")
    msg = Register(
        node=name,
        pool=Pool(pool),
        hardware=hardware,
        incarnation=incarnation,
        slots=[SlotSpec(index=i, hardware=hardware, memory_mb=1024) for i in range(slots)],
    )
    return register_node(credential_id=cred.pk, message=msg)


def swe_spec(name: str, **overrides: Any) -> dict[str, Any]:
    """The live fault and sharing tests' job: a Qwen3-8B-profile SWE-like job on emulated H800 engines (one
    training GPU, TP 1, groups of 4, staleness 1), its fields as `pearl submit` takes them; `overrides` win."""
    return {
        "name": name,
        "model": "qwen3-8b",
        "hardware": "h800",
        "engine": "emulated",
        "environment": "swe-like",
        "tp": 1,
        "group_size": 4,
        "training_gpus": 1,
        "max_staleness": 1,
        "max_trajectory_tokens": 8192,
    } | overrides


def make_job(name: str = "job1", **spec: Any) -> Job:
    """Create a job through the service (one rollout GPU, no training GPU unless `spec` says otherwise)."""
    from controlplane.services.jobs import create_job

    full = {"name": name, "rollout_gpus": 1, "training_gpus": 0} | spec
    return create_job(spec=full, actor="test")


def agents_converge(*, skip: tuple[str, ...] = (), starting: Collection[int] = ()) -> None:
    """Every live node's agent (but those named in `skip`: slow or silent ones) reports its desired state as
    done, through the heartbeat service: each worker running in its role and activity, holding the weights
    the job allows, idle, on an endpoint of the node. What a real agent does after reconciling
    (agents/node.py), without processes. The workers (ids) in `starting` are reported still starting: no
    endpoint, no weights, no devices yet."""
    from controlplane.core.agent_link import Heartbeat, ObservedWorker
    from controlplane.core.state import Activity, NodeStatus, Role
    from controlplane.models import Job, Node
    from controlplane.selectors.cluster import desired_state
    from controlplane.services.heartbeat import record_heartbeat

    for node in Node.objects.filter(status__in=[NodeStatus.READY, NodeStatus.DRAINING]).exclude(name__in=skip):
        ds = desired_state(node)
        versions = dict(Job.objects.values_list("name", "weight_version"))
        workers = []
        for w in ds.workers:
            up = w.worker_id not in starting
            idle = not up or (w.role == Role.TRAINING and w.activity != Activity.ACTIVE)
            workers.append(
                ObservedWorker(
                    worker_id=w.worker_id,
                    role=w.role,
                    state="running" if up else "starting",
                    inflight=0,
                    activity=Activity.INACTIVE if idle else w.activity,
                    weight_version=versions.get(w.job, 0) if up else 0,
                    endpoint=f"http://127.0.0.1:{20000 + w.worker_id}" if up else "",
                    generation=ds.generation,
                    devices=list(w.gpus) if up else [],
                )
            )
        record_heartbeat(
            node_id=node.pk,
            message=Heartbeat(epoch=node.epoch, generation=ds.generation, workers=workers),
            channel=node.agent_channel,
        )


def run_transition(transition: Transition | None, rounds: int = 20) -> Transition:
    """Execute a transition to its end, the agents converging between executor passes (None: the planner
    made none, which fails the test)."""
    from controlplane.services import executor

    assert transition is not None, "no transition was planned"

    for _ in range(rounds):
        tr = executor.execute_transition(transition_id=transition.pk)
        if tr.status != "running":
            return tr
        agents_converge()
    raise AssertionError(f"transition {transition.pk} still running after {rounds} rounds")
