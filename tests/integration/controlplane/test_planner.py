"""The live loop over the core: budget -> decide -> plan -> execute, with resumable steps."""

from __future__ import annotations

import pytest

from controlplane.core.invariants import check_invariants
from controlplane.core.state import Activity
from controlplane.models import Decision, Transition, TransitionStep, Worker
from controlplane.selectors.cluster import training_flags, worker_views
from controlplane.services import draining, expiry, jobs, planner
from controlplane.services.errors import Conflict
from tests.support.cluster import make_job, make_node, run_transition

pytestmark = pytest.mark.django_db


def _cluster():
    make_node("r1", slots=4, hardware="H800")
    make_node("e1", pool="elastic", slots=4, hardware="H800")
    make_node("t1", pool="training", slots=4, hardware="H800")
    return make_job(
        rollout_gpus=8, training_gpus=4, tp=2, model="qwen3-8b", hardware="h800", batch_size=64, group_size=16
    )


def _active_roles(job):
    return sorted(
        Worker.objects.filter(job=job, alive=True, activity=Activity.ACTIVE)
        .exclude(role="training")
        .values_list("role", flat=True)
    )


def _valid():
    views = worker_views()
    assert check_invariants(views, training_flags({v.job for v in views})) == []


def test_first_plan_places_training_and_rollout_workers_and_executes():
    job = _cluster()
    tr = planner.plan_job(job_id=job.pk, signal="step_start")
    d = Decision.objects.get(job=job)
    assert d.candidates and d.reason and tr.decision_id == d.pk
    assert run_transition(tr).status == "succeeded"
    job.refresh_from_db()
    expected = job.n_prefill + job.n_decode + job.n_colocated
    assert len(_active_roles(job)) == expected == 4 + d.borrow
    assert Worker.objects.filter(job=job, role="training", alive=True).count() == 2
    _valid()
    assert planner.plan_job(job_id=job.pk) is None  # nothing changed: no transition


def test_execution_is_idempotent_after_a_crash_midway():
    job = _cluster()
    tr = planner.plan_job(job_id=job.pk)
    # Simulate an executor killed after the first two steps: run them, then restart from scratch.
    first = list(TransitionStep.objects.filter(transition=tr).order_by("index")[:2])
    Transition.objects.filter(pk=tr.pk).update(status="running")
    for st in first:
        TransitionStep.objects.filter(pk=st.pk).update(status="done")
    run_transition(tr)  # steps already done are skipped
    run_transition(tr)  # a second delivery is a no-op
    tr.refresh_from_db()
    assert tr.status == "succeeded"
    assert all(s.attempts <= 1 for s in tr.steps.all())
    _valid()


def test_training_begin_returns_the_borrowed_workers_at_once_and_the_update_waits_for_the_agents():
    """The return is due by a deadline: Training Begin parks every borrowed worker in its own transaction
    (no re-plan, no transition in between); the update waits until the agents report them asleep; the
    re-plan that follows still learns that borrowing ran into Training Begin."""
    from tests.support.cluster import agents_converge

    make_node("r1", slots=4, hardware="H800")
    make_node("e1", pool="elastic", slots=4, hardware="H800")
    make_node("t1", pool="training", slots=4, hardware="H800")
    job = make_job(
        rollout_gpus=8,
        training_gpus=4,
        tp=2,
        model="qwen3-8b",
        hardware="h800",
        batch_size=64,
        group_size=16,
        policy_options={"gate": False},
    )  # ungated: borrow every idle training GPU
    run_transition(planner.plan_job(job_id=job.pk, signal="step_start"))
    assert Decision.objects.get(job=job).borrow == 2
    assert len(_active_roles(job)) == 6
    transitions = Transition.objects.filter(job=job).count()
    jobs.set_training_active(job_id=job.pk, active=True)
    overlap = Worker.objects.filter(job=job, zone="overlap", alive=True).exclude(role="training")
    assert {w.activity for w in overlap} == {Activity.INACTIVE} and len(overlap) == 2
    assert len(_active_roles(job)) == 4 and Transition.objects.filter(job=job).count() == transitions
    job.refresh_from_db()
    assert job.returned_at_training_begin == 2
    with pytest.raises(Conflict, match="not returned"):
        jobs.start_update(job_id=job.pk)  # parked here; their agents have not confirmed yet
    agents_converge()
    jobs.start_update(job_id=job.pk)  # every borrowed worker is back
    tr = planner.plan_job(job_id=job.pk, signal="training_begin")
    assert tr is None or not tr.steps.filter(kind="deactivate_overlap").exists()
    latest = Decision.objects.filter(job=job).first()
    assert latest.borrow == 0 and latest.budget["training_active"] is True and latest.budget["borrowed"] == 2
    job.refresh_from_db()
    assert job.returned_at_training_begin == 0  # told once: a repeated Training Begin plan is not told again
    assert len(_active_roles(job)) == 4
    _valid()


def test_lease_expiry_shrinks_the_pool():
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.models import Node

    job = _cluster()
    run_transition(planner.plan_job(job_id=job.pk))
    Node.objects.filter(name__in=["r1", "t1"]).update(lease_expires=timezone.now() + timedelta(hours=2))
    expiry.expire_leases(now=timezone.now() + timedelta(minutes=5))  # e1 is gone quiet
    tr = planner.plan_job(job_id=job.pk, signal="capacity_change")
    assert tr is not None and tr.plan["remove"]
    run_transition(tr)
    assert not Worker.objects.filter(job=job, node__name="e1", alive=True).exists()
    _valid()


def test_forced_ratio_override_wins():
    job = _cluster()
    jobs.set_overrides(
        job_id=job.pk,
        changes={"force_mode": "disaggregated", "force_n_prefill": 1, "force_n_decode": 3, "borrowing": False},
        actor="t",
    )
    tr = planner.plan_job(job_id=job.pk)
    run_transition(tr)
    assert _active_roles(job) == ["decode", "decode", "decode", "prefill"]


def test_returning_the_only_borrowed_decode_worker_pauses_the_group_instead_of_failing():
    """1P1D with the decode worker on a borrowed training GPU; Training Begin returns it: the prefill
    worker alone is no valid configuration, so the group pauses and comes back as planned."""
    make_node("r1", slots=2, hardware="H800")
    make_node("t1", pool="training", slots=2, hardware="H800")
    job = make_job(
        rollout_gpus=2,
        training_gpus=2,
        tp=2,
        model="qwen3-8b",
        hardware="h800",
        batch_size=64,
        group_size=16,
        policy_options={"gate": False},
    )
    jobs.set_overrides(
        job_id=job.pk, changes={"force_mode": "disaggregated", "force_n_prefill": 1, "force_n_decode": 1}, actor="test"
    )
    tr = planner.plan_job(job_id=job.pk, signal="step_start")
    assert run_transition(tr).status == "succeeded"
    roles = dict(Worker.objects.filter(job=job, alive=True, activity=Activity.ACTIVE).values_list("zone", "role"))
    assert roles == {"rollout": "prefill", "overlap": "decode"}
    jobs.set_training_active(job_id=job.pk, active=True)
    tr = planner.plan_job(job_id=job.pk, signal="training_begin")
    assert run_transition(tr).status == "succeeded", tr.error
    assert _active_roles(job) == ["colocated"]
    jobs.start_update(job_id=job.pk)
    _valid()


def test_a_preemption_notice_mid_transition_fails_it_at_once_and_the_replan_runs():
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.models import Node
    from controlplane.services import executor
    from tests.support.cluster import agents_converge

    job = _cluster()
    tr = planner.plan_job(job_id=job.pk, signal="step_start")
    assert TransitionStep.objects.filter(
        transition=tr, kind="start_worker", args__node=Node.objects.get(name="e1").pk
    ).exists()
    executor.execute_transition(transition_id=tr.pk)  # workers asked for; no agent has confirmed them yet
    e1 = Node.objects.get(name="e1")
    draining.preemption_notice(node_id=e1.pk, deadline=timezone.now() + timedelta(seconds=30), actor="test")
    tr = executor.execute_transition(transition_id=tr.pk)  # not after MAX_ATTEMPTS step timeouts
    assert tr.status == "failed" and "node e1 is leaving" in tr.error
    assert not Worker.objects.filter(job=job, node=e1, alive=True, activity=Activity.ACTIVE).exists()
    agents_converge()
    again = planner.plan_job(job_id=job.pk, signal="capacity_change")
    assert again is not None and run_transition(again).status == "succeeded"
    assert not Worker.objects.filter(job=job, node=e1, alive=True).exclude(activity=Activity.INACTIVE).exists()
    _valid()


def test_a_notice_after_the_workers_started_leaves_them_out_of_the_finalize():
    """The notice lands once the elastic node's workers were started but before the group is admitted:
    the finalize admits the rest at once instead of activating workers that can never serve there (and
    waiting for them for MAX_ATTEMPTS step timeouts); the re-plan takes them out."""
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.models import Node
    from controlplane.services import executor
    from tests.support.cluster import agents_converge

    job = _cluster()
    tr = planner.plan_job(job_id=job.pk, signal="step_start")
    e1 = Node.objects.get(name="e1")
    assert TransitionStep.objects.filter(transition=tr, kind="start_worker", args__node=e1.pk).exists()
    executor.execute_transition(transition_id=tr.pk)
    agents_converge()  # the agents started every worker, e1's included
    draining.preemption_notice(node_id=e1.pk, deadline=timezone.now() + timedelta(seconds=30), actor="test")
    assert run_transition(tr).status == "succeeded"
    assert not Worker.objects.filter(job=job, node=e1, alive=True, activity=Activity.ACTIVE).exists()
    assert Worker.objects.filter(job=job, alive=True, activity=Activity.ACTIVE).exclude(role="training").exists()
    again = planner.plan_job(job_id=job.pk, signal="capacity_change")
    assert again is not None and run_transition(again).status == "succeeded"
    assert not Worker.objects.filter(job=job, node=e1, alive=True).exclude(activity=Activity.INACTIVE).exists()
    _valid()


def test_training_begin_ends_a_transition_still_lending_workers_at_once():
    """Training Begin lands while the first expansion, which borrows overlap workers, still waits for its
    agents to start the other workers: the expansion ends at its next pass (its finalize would refuse the
    borrowed workers anyway) instead of holding the Training Begin plan behind it, and nothing stays lent."""
    from controlplane.services import executor
    from tests.support.cluster import agents_converge

    make_node("r1", slots=4, hardware="H800")
    make_node("e1", pool="elastic", slots=4, hardware="H800")
    make_node("t1", pool="training", slots=4, hardware="H800")
    job = make_job(
        rollout_gpus=8,
        training_gpus=4,
        tp=2,
        model="qwen3-8b",
        hardware="h800",
        batch_size=64,
        group_size=16,
        policy="elastic",
    )
    tr = planner.plan_job(job_id=job.pk, signal="step_start")
    assert TransitionStep.objects.filter(transition=tr, kind="activate_overlap").exists()
    assert TransitionStep.objects.filter(transition=tr, kind="start_worker").exists()
    executor.execute_transition(transition_id=tr.pk)  # workers asked for; no agent has confirmed them yet
    jobs.set_training_active(job_id=job.pk, active=True, actor="test")
    tr = executor.execute_transition(transition_id=tr.pk)
    assert tr.status == "failed" and "Training Begin arrived" in tr.error
    agents_converge()
    back = planner.plan_job(job_id=job.pk, signal="training_begin")
    assert back is not None and run_transition(back).status == "succeeded"
    assert (
        not Worker.objects.filter(job=job, alive=True, zone="overlap", activity=Activity.ACTIVE)
        .exclude(role="training")
        .exists()
    )
    _valid()
