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


def train_once(job: Job) -> None:
    """One update of the job as its driver and trainer drive it: Training Begin, the update, Training Finished."""
    from controlplane.services import jobs

    jobs.set_training_active(job_id=job.pk, active=True)
    agents_converge()
    jobs.start_update(job_id=job.pk)
    jobs.set_training_active(job_id=job.pk, active=False)


def rolled_out(job: Job, steps: int = 2) -> None:
    """Its driver's STEP records of `steps` rollouts (a few short turns each): its predictor has measured it
    (`FittedProfile.measured`), so the arbiter takes its curve's word."""
    from controlplane.core import telemetry as tm
    from controlplane.models import TelemetrySample

    for k in range(steps):
        rec = tm.step(
            job=job.name,
            step=k,
            batch_size=job.batch_size,
            turns_max=4,
            new_prompt_tokens_mean=128.0,
            generated_tokens_mean=64.0,
            makespan_s=30.0,
        )
        TelemetrySample.objects.create(job=job, kind="step", record=rec.to_json())


def trained_every(job: Job, period_s: float, *, update_s: float = 5.0) -> None:
    """Two updates of `update_s` each, `period_s` apart, the last one just now (its next Training Begin is
    predicted then: `selectors.lending.cadence`)."""
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.core import telemetry as tm
    from controlplane.models import Event, TelemetrySample

    train_once(job)
    train_once(job)
    now = timezone.now()
    tb = Event.objects.filter(job=job, kind="training.begin").order_by("-id").values_list("pk", flat=True)
    TelemetrySample.objects.filter(job=job, kind="train").delete()
    for k, pk in enumerate(list(tb)):
        Event.objects.filter(pk=pk).update(created=now - timedelta(seconds=1 + k * period_s))
        # its driver's record of that update, in the loop's clock (here wall time: real engines' scale 1)
        begin = now.timestamp() - 1 - k * period_s
        rec = tm.train(time_s=begin + update_s + 0.5, job=job.name, step=k, duration_s=update_s, return_latency_s=0.5)
        TelemetrySample.objects.create(job=job, kind="train", record=rec.to_json())
