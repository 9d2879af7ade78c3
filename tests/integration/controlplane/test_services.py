"""Service use cases and the invariants of docs/design.md §3 (incl. a long random fuzz of service calls)."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from controlplane.core.invariants import check_invariants
from controlplane.core.state import Activity, NodeStatus, Pool, Role
from controlplane.models import Event, Node, Worker, WorkerGPU
from controlplane.selectors.cluster import desired_state, training_flags, worker_views
from controlplane.services import draining, expiry, heartbeat, jobs, registration, workers
from controlplane.services.errors import Conflict, InvalidInput, InvariantViolation, PermissionDenied, ServiceError
from controlplane.services.workers import WorkerChange
from tests.support.cluster import agents_converge, make_job, make_node

pytestmark = pytest.mark.django_db


def test_register_creates_node_gpus_and_event():
    node = make_node("n1", slots=3)
    assert node.status == NodeStatus.READY
    assert [g.index for g in node.gpus.order_by("index")] == [0, 1, 2]
    assert Event.objects.filter(kind="node.registered", node=node).count() == 1


def test_token_of_node_a_cannot_register_node_b():
    from controlplane.core.agent_link import Register, SlotSpec
    from controlplane.models import AgentCredential
    from controlplane.services.credentials import issue_agent_token

    issue_agent_token(node_name="node-a")
    cred = AgentCredential.objects.get(node_name="node-a")
    msg = Register(node="node-b", pool=Pool.RESERVED, hardware="cpu", incarnation="x", slots=[SlotSpec(0, "cpu", 1)])
    with pytest.raises(PermissionDenied):
        registration.register_node(credential_id=cred.pk, message=msg)
    assert not Node.objects.filter(name="node-b").exists()


def test_an_agents_heartbeat_and_reports_check_its_token_in_the_use_case():
    """What the agent socket calls: a revoked token records nothing (None / False), a valid one records."""
    from controlplane.core.agent_link import Fault, Heartbeat
    from controlplane.models import AgentCredential
    from controlplane.services import agent_reports
    from controlplane.services.credentials import revoke_agent_tokens

    node = make_node("n1")
    cred = AgentCredential.objects.get(node_name="n1")
    beat = Heartbeat(epoch=node.epoch, generation=node.generation)
    fault = Fault(epoch=node.epoch, worker_id=0, kind="refused", detail="stale command")
    kw: dict[str, Any] = {"credential_id": cred.pk, "node_id": node.pk, "channel": node.agent_channel}
    assert heartbeat.record_agent_heartbeat(message=beat, **kw) is not None
    assert agent_reports.record_agent_report(message=fault, **kw) is True
    assert Event.objects.filter(kind="worker.fault", node=node).count() == 1
    revoke_agent_tokens(node_name="n1")
    assert heartbeat.record_agent_heartbeat(message=beat, **kw) is None
    assert agent_reports.record_agent_report(message=fault, **kw) is False
    assert heartbeat.record_agent_heartbeat(message=beat, **{**kw, "credential_id": None}) is None
    assert Event.objects.filter(kind="worker.fault", node=node).count() == 1


def test_new_incarnation_bumps_epoch():
    n = make_node("n1", incarnation="a")
    again = make_node("n1", incarnation="b")
    assert again.epoch == n.epoch + 1


def test_gpu_cannot_host_two_active_rollout_workers():
    n = make_node("n1")
    job = make_job()
    workers.start_worker(job_id=job.pk, node_id=n.pk, gpu_indexes=[0], role="colocated", activity="active")
    with pytest.raises(InvariantViolation):
        workers.start_worker(job_id=job.pk, node_id=n.pk, gpu_indexes=[0], role="colocated", activity="inactive")
    assert Worker.objects.filter(alive=True).count() == 1


def test_stable_slots_reuse_lowest_free():
    n = make_node("n1", slots=4)
    job = make_job()
    for i in range(3):
        workers.start_worker(job_id=job.pk, node_id=n.pk, gpu_indexes=[i], role="colocated", activity="active")
    workers.stop_worker(job_id=job.pk, slot=1)
    w = workers.start_worker(job_id=job.pk, node_id=n.pk, gpu_indexes=[3], role="colocated", activity="active")
    assert w.slot == 1
    assert sorted(Worker.objects.filter(alive=True).values_list("slot", flat=True)) == [0, 1, 2]


def test_mixed_modes_refused_and_group_switch_allowed():
    n = make_node("n1", slots=4)
    job = make_job()
    for i in range(2):
        workers.start_worker(job_id=job.pk, node_id=n.pk, gpu_indexes=[i], role="colocated", activity="active")
    with pytest.raises(Conflict):  # role change of an active worker without draining
        workers.change_workers(job_id=job.pk, changes=[WorkerChange(slot=0, role="prefill")])
    with pytest.raises(InvariantViolation):  # one drained + re-roled worker re-activated next to a colocated one
        workers.change_workers(
            job_id=job.pk, changes=[WorkerChange(slot=0, role="prefill", activity="inactive")]
        ) and workers.change_workers(job_id=job.pk, changes=[WorkerChange(slot=0, activity="active")])
    # drain both, re-role, admit as a group
    workers.change_workers(job_id=job.pk, changes=[WorkerChange(slot=1, activity="transitioning")])
    workers.change_workers(job_id=job.pk, changes=[WorkerChange(slot=1, role="decode")])
    workers.change_workers(
        job_id=job.pk, changes=[WorkerChange(slot=0, activity="active"), WorkerChange(slot=1, activity="active")]
    )
    roles = dict(Worker.objects.filter(alive=True, activity="active").values_list("slot", "role"))
    assert roles == {0: "prefill", 1: "decode"}


def test_the_update_waits_until_borrowed_workers_are_back():
    t = make_node("t1", pool="training", slots=2)
    make_node("r1")
    job = make_job(training_gpus=2)
    workers.start_worker(job_id=job.pk, node_id=t.pk, gpu_indexes=[0, 1], role="training", activity="inactive")
    workers.start_worker(job_id=job.pk, node_id=t.pk, gpu_indexes=[0, 1], role="colocated", activity="active")
    agents_converge()  # the agent reports the borrowed worker serving
    with pytest.raises(Conflict):  # no update before Training Begin
        jobs.start_update(job_id=job.pk)
    jobs.set_training_active(job_id=job.pk, active=True)  # parks it at once
    assert dict(Worker.objects.filter(alive=True).values_list("role", "activity")) == {
        "training": "inactive",
        "colocated": "inactive",
    }
    with pytest.raises(Conflict, match=r"borrowed worker\(s\) \[1\] are not returned"):
        jobs.start_update(job_id=job.pk)  # its agent has not confirmed the return yet
    agents_converge()  # the return, reported
    jobs.start_update(job_id=job.pk)
    states = dict(Worker.objects.filter(alive=True).values_list("role", "activity"))
    assert states == {"training": "active", "colocated": "inactive"}
    with pytest.raises(InvariantViolation):  # overlap worker cannot come back while training computes
        workers.change_workers(job_id=job.pk, changes=[WorkerChange(slot=1, activity="active")])
    jobs.set_training_active(job_id=job.pk, active=False)
    workers.change_workers(job_id=job.pk, changes=[WorkerChange(slot=1, activity="active")])
    with pytest.raises(Conflict):
        jobs.set_training_active(job_id=job.pk, active=False)


def test_lease_expiry_marks_not_ready_bumps_epoch_and_fences():
    n = make_node("n1")
    job = make_job()
    workers.start_worker(job_id=job.pk, node_id=n.pk, gpu_indexes=[0], role="colocated", activity="active")
    epoch = Node.objects.get(pk=n.pk).epoch
    assert expiry.expire_leases(now=timezone.now()) == []
    expired = expiry.expire_leases(now=timezone.now() + timedelta(seconds=3600))
    n.refresh_from_db()
    assert expired == ["n1"] and n.status == NodeStatus.NOT_READY and n.epoch == epoch + 1
    assert not WorkerGPU.objects.filter(active=True).exists()
    assert desired_state(n).epoch == n.epoch
    assert Event.objects.filter(kind="node.lease_expired").count() == 1


def test_preemption_notice_only_for_elastic_and_removes_after_deadline():
    r = make_node("r1", pool="reserved")
    e = make_node("e1", pool="elastic")
    with pytest.raises(Conflict):
        draining.preemption_notice(node_id=r.pk, deadline=timezone.now() + timedelta(seconds=30), actor="t")
    with pytest.raises(InvalidInput):
        draining.preemption_notice(node_id=e.pk, deadline=timezone.now() - timedelta(seconds=1), actor="t")
    job = make_job()
    workers.start_worker(job_id=job.pk, node_id=e.pk, gpu_indexes=[0], role="colocated", activity="active")
    draining.preemption_notice(node_id=e.pk, deadline=timezone.now() + timedelta(seconds=30), actor="t")
    assert Worker.objects.get(alive=True).activity == Activity.TRANSITIONING
    assert draining.remove_preempted(now=timezone.now() + timedelta(seconds=60)) == ["e1"]
    assert not Worker.objects.filter(alive=True).exists()


def test_create_job_rejects_gpu_counts_above_cluster():
    make_node("n1", slots=2)
    make_node("t1", pool="training", slots=2)
    with pytest.raises(InvalidInput) as err:
        make_job(rollout_gpus=3)
    assert err.value.field == "rollout_gpus"
    with pytest.raises(InvalidInput):
        make_job(training_gpus=4)


def test_stop_job_twice_conflicts():
    make_node("n1")
    make_node("t1", pool="training")
    job = make_job()
    jobs.stop_job(job_id=job.pk, actor="t")
    with pytest.raises(Conflict):
        jobs.stop_job(job_id=job.pk, actor="t")


def test_overrides_validated_and_audited():
    make_node("n1")
    make_node("t1", pool="training")
    job = make_job(rollout_gpus=4, training_gpus=1)  # at most 5 rollout workers
    with pytest.raises(InvalidInput):
        jobs.set_overrides(
            job_id=job.pk, changes={"force_mode": "colocated", "force_n_prefill": 2, "force_n_decode": 1}, actor="t"
        )
    with pytest.raises(InvalidInput, match="at most 5"):
        jobs.set_overrides(job_id=job.pk, changes={"force_n_prefill": 2, "force_n_decode": 4}, actor="t")
    jobs.set_overrides(
        job_id=job.pk, changes={"force_n_prefill": 2, "force_n_decode": 3, "borrowing": False}, actor="alice"
    )
    ev = Event.objects.filter(kind="override.set").latest("created")
    assert ev.actor == "alice" and ev.data["before"]["borrowing"] is True and ev.data["after"]["borrowing"] is False


def test_events_are_append_only():
    ev = Event.objects.create(kind="x", message="m")
    with pytest.raises(ValueError):
        ev.save()
    with pytest.raises(ValueError):
        ev.delete()


def _assert_valid() -> None:
    views = worker_views()
    problems = check_invariants(views, training_flags({v.job for v in views}))
    assert problems == []


def test_fuzz_random_service_calls_keep_invariants():
    """Long random sequences of service calls: each either succeeds or is refused, never corrupts."""
    rng = random.Random(1234)
    make_node("r1", slots=4)
    make_node("e1", pool="elastic", slots=4)
    t = make_node("t1", pool="training", slots=4)
    job_a, job_b = make_job("a", rollout_gpus=2), make_job("b", rollout_gpus=2)
    all_nodes = list(Node.objects.all())
    roles = ["prefill", "decode", "colocated", "training", "bogus"]
    acts = ["active", "inactive", "transitioning"]
    ok = refused = 0
    for _ in range(400):
        job = rng.choice([job_a, job_b])
        op = rng.random()
        try:
            if op < 0.35:
                node = rng.choice(all_nodes)
                k = rng.choice([1, 1, 2])
                idx = rng.sample(range(4), k)
                workers.start_worker(
                    job_id=job.pk, node_id=node.pk, gpu_indexes=idx, role=rng.choice(roles), activity=rng.choice(acts)
                )
            elif op < 0.7:
                slots = list(Worker.objects.filter(job=job, alive=True).values_list("slot", flat=True))
                if not slots:
                    continue
                picks = rng.sample(slots, rng.randint(1, len(slots)))
                workers.change_workers(
                    job_id=job.pk,
                    changes=[
                        WorkerChange(slot=s, role=rng.choice([None, *roles[:3]]), activity=rng.choice([None, *acts]))
                        for s in picks
                    ],
                )
            elif op < 0.8:
                slots = list(Worker.objects.filter(job=job, alive=True).values_list("slot", flat=True))
                if slots:
                    workers.stop_worker(job_id=job.pk, slot=rng.choice(slots))
            elif op < 0.9:
                jobs.set_training_active(job_id=job.pk, active=not job.__class__.objects.get(pk=job.pk).training_active)
            else:
                expiry.expire_leases(now=timezone.now() + timedelta(seconds=rng.choice([0, 3600])))
                for n in Node.objects.filter(status=NodeStatus.NOT_READY):
                    make_node(n.name, pool=n.pool, slots=4, incarnation=f"i{rng.random()}")
            ok += 1
        except ServiceError:
            refused += 1
        _assert_valid()
    assert ok > 50 and refused > 20  # both paths were really exercised
    assert t.gpus.count() == 4


def _trainers_up(node: Node, endpoints: dict[int, str], version: int = 0) -> Any:
    """A training node's heartbeat: these training workers (id -> endpoint) running, idle, at `version`."""
    from controlplane.core.agent_link import Heartbeat, ObservedWorker

    return Heartbeat(
        epoch=node.epoch,
        generation=0,
        workers=[
            ObservedWorker(
                worker_id=wid,
                role=Role.TRAINING,
                activity=Activity.INACTIVE,
                state="running",
                weight_version=version,
                endpoint=url,
            )
            for wid, url in endpoints.items()
        ],
    )


def test_a_job_with_several_training_workers_has_one_trainer_the_first_by_slot():
    """Its samples and updates go to one trainer: the first training worker by slot, even while a later one has
    come up first (it was the first with an endpoint, and a driver posted part of a step to it: lost samples)."""
    from controlplane.selectors.cluster import weights_url

    t = make_node("t1", pool="training", slots=2)
    make_node("r1", slots=1)
    job = make_job(training_gpus=2)
    first, second = (
        workers.start_worker(job_id=job.pk, node_id=t.pk, gpu_indexes=[i], role="training", activity="inactive")
        for i in (0, 1)
    )

    def report(*up: Worker) -> None:
        heartbeat.record_heartbeat(
            node_id=t.pk, message=_trainers_up(t, {w.pk: f"http://127.0.0.1:{9000 + w.slot}" for w in up})
        )

    report(second)  # the second trainer is up first
    assert weights_url(job.pk) == ""  # no trainer yet: the driver waits for it
    report(first, second)
    assert weights_url(job.pk) == f"http://127.0.0.1:{9000 + first.slot}"


def test_trainer_heartbeat_publishes_weights_and_rollout_workers_get_url():

    t = make_node("t1", pool="training", slots=2)
    r = make_node("r1", slots=2)
    job = make_job(training_gpus=2)
    trainer = workers.start_worker(
        job_id=job.pk, node_id=t.pk, gpu_indexes=[0, 1], role="training", activity="inactive"
    )
    workers.start_worker(job_id=job.pk, node_id=r.pk, gpu_indexes=[0], role="colocated", activity="active")
    gen_before = Node.objects.get(pk=r.pk).generation
    hb = _trainers_up(t, {trainer.pk: "http://127.0.0.1:9999"}, version=3)
    assert heartbeat.record_heartbeat(node_id=t.pk, message=hb).refused == []
    job.refresh_from_db()
    assert job.weight_version == 3
    assert Event.objects.filter(kind="weights.published", job=job).count() == 1
    r.refresh_from_db()
    assert r.generation > gen_before
    (w,) = desired_state(r).workers
    assert w.weights_url == "http://127.0.0.1:9999" and w.min_weight_version == 2
    assert heartbeat.record_heartbeat(node_id=t.pk, message=hb).refused == []  # same version again: nothing new
    assert Event.objects.filter(kind="weights.published", job=job).count() == 1


def test_a_rollout_worker_reported_before_its_trainer_in_one_heartbeat_is_not_refused():
    """An overlap rollout worker beside its trainer pulled the version the trainer publishes in the same
    heartbeat: the trainer's report is taken first, so the worker's is not refused as never published."""
    from controlplane.core.agent_link import Heartbeat, ObservedWorker

    t = make_node("t1", pool="training", slots=2)
    job = make_job(training_gpus=2, rollout_gpus=0)
    trainer = workers.start_worker(
        job_id=job.pk, node_id=t.pk, gpu_indexes=[0, 1], role="training", activity="inactive"
    )
    rollout = workers.start_worker(
        job_id=job.pk, node_id=t.pk, gpu_indexes=[0, 1], role="colocated", activity="inactive"
    )
    hb = Heartbeat(
        epoch=t.epoch,
        generation=0,
        workers=[
            ObservedWorker(
                worker_id=rollout.pk,
                role=Role.COLOCATED,
                activity=Activity.INACTIVE,
                state="running",
                weight_version=1,
                endpoint="http://127.0.0.1:9998",
            ),
            ObservedWorker(
                worker_id=trainer.pk,
                role=Role.TRAINING,
                activity=Activity.INACTIVE,
                state="running",
                weight_version=1,
                endpoint="http://127.0.0.1:9999",
            ),
        ],
    )
    assert heartbeat.record_heartbeat(node_id=t.pk, message=hb).refused == []
    assert Worker.objects.get(pk=rollout.pk).weight_version == 1


@pytest.mark.django_db(transaction=True)
def test_a_desired_state_read_while_a_worker_starts_never_sends_it_without_its_gpus():
    """desired_state reads the bindings, then the workers: a start that commits between the two reads must not
    reach the agent as a worker with no GPUs (it ran unpinned, then was started again once the next desired state
    gave it its GPUs: a fault test's worker refused calls a second after it first ran)."""
    import threading

    from django.db import connection

    node = make_node("torn", slots=1)
    job = make_job("torn-job", rollout_gpus=1)
    bindings_read, started = threading.Event(), threading.Event()

    def pause_after_the_bindings(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if "controlplane_workergpu" in sql and not bindings_read.is_set():
            bindings_read.set()
            started.wait(30)  # the start commits here, between the two reads
        return result

    seen: dict[str, Any] = {}

    def read() -> None:
        try:
            with connection.execute_wrapper(pause_after_the_bindings):
                seen["state"] = desired_state(Node.objects.get(pk=node.pk))
        finally:
            connection.close()

    reader = threading.Thread(target=read)
    reader.start()
    assert bindings_read.wait(30)
    w = workers.start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[0], role="colocated", activity="active")
    started.set()
    reader.join(30)
    assert all(x.gpus for x in seen["state"].workers), seen["state"].workers
    (listed,) = desired_state(Node.objects.get(pk=node.pk)).workers  # the next read lists it, on its GPU
    assert (listed.worker_id, listed.gpus) == (w.pk, [0])
