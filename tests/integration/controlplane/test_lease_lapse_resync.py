"""Every node's lease lapses under a running job (the control plane was away longer than the lease: the crash
suite's Daphne restart on a loaded machine), then the agents register again on a new epoch: the job's fenced
workers, parked meanwhile, serve again and the job goes on (issue 34: no job stalls for good after a restart).
The services are driven as the Celery tasks drive them, the agents converging without processes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.core.state import Activity, NodeStatus, Zone
from controlplane.models import Job, Node, Worker
from controlplane.selectors.driver import cluster_view
from controlplane.services import arbitration, expiry, jobs, planner
from tests.support.cluster import agents_converge, make_job, make_node, run_transition

pytestmark = pytest.mark.django_db

SPEC = {"rollout_gpus": 2, "training_gpus": 1, "model": "tiny", "batch_size": 16, "group_size": 4}


def _rollout(job: Job) -> dict[int, str]:
    """The job's live dedicated rollout workers: slot -> activity."""
    return dict(Worker.objects.filter(job=job, alive=True, zone=Zone.ROLLOUT).values_list("slot", "activity"))


def _routed(job: Job) -> list[int]:
    """The dedicated workers the job's driver routes turns to (its cluster view)."""
    return sorted(w.worker for w in cluster_view(Job.objects.get(pk=job.pk)).workers if not w.overlap)


def _place(division: arbitration.Rebalance) -> None:
    """The arbiter task's plans, in the division's order, each transition run to its end."""
    for job_id, signal in division.plan_order:
        t = planner.plan_job(job_id=job_id, signal=signal)
        if t is not None:
            assert run_transition(t).status == "succeeded"


@pytest.mark.parametrize("signal", ["periodic", "capacity_change"])
def test_a_running_job_serves_again_once_its_expired_nodes_register_on_a_new_epoch(signal: str) -> None:
    """`periodic`: the periodic re-plan's division saw the capacity come back first, so its plan is the job's
    next one; `capacity_change`: the arbiter task's (or the registration's) plan is."""
    make_node("r1", slots=2)
    make_node("t1", pool="training", slots=1)
    job = make_job("a", **SPEC)
    # it borrows none of its training GPUs (as the crash suite's job at the kill): a borrowed overlap worker's
    # activation would bring the dedicated workers back with it
    jobs.set_overrides(job_id=job.pk, changes={"borrowing": False}, actor="test")
    _place(arbitration.rebalance(reason="job a arrived"))
    agents_converge()
    serving = _rollout(job)
    assert list(serving.values()) == [Activity.ACTIVE] * 2
    assert _routed(job) == sorted(serving)

    # the control plane was away longer than the lease: the sweeper expires both nodes and fences their workers
    assert sorted(expiry.expire_leases(now=timezone.now() + timedelta(minutes=5))) == ["r1", "t1"]
    gone = arbitration.rebalance(reason="capacity change")
    assert gone.capacity_gpus == 0 and gone.allotted == {job.pk: 0}
    _place(gone)
    assert planner.plan_job(job_id=job.pk, signal="capacity_change") is None
    # no capacity went to another job: the fenced workers stay parked for the nodes' resync
    assert _rollout(job) == {slot: Activity.INACTIVE for slot in serving}

    # the agents come back: each registers again (a new epoch) with the processes it kept
    epochs = dict(Node.objects.values_list("name", "epoch"))
    make_node("r1", slots=2)
    make_node("t1", pool="training", slots=1)
    assert all(n.status == NodeStatus.READY and n.epoch == epochs[n.name] + 1 for n in Node.objects.all())
    back = arbitration.rebalance(reason="periodic" if signal == "periodic" else "capacity change")
    assert back.allotted == {job.pk: 2}
    tr = planner.plan_job(job_id=job.pk, signal=signal)
    assert tr is not None, Job.objects.get(pk=job.pk).status_reason
    assert run_transition(tr).status == "succeeded"
    agents_converge()
    # the same workers serve again (reactivated in place, no new process), and the driver routes to them
    assert _rollout(job) == {slot: Activity.ACTIVE for slot in serving}
    assert _routed(job) == sorted(serving)
    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING
