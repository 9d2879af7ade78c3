"""The executor at scale (issue 22): a transition's steps are issued per node in batches (one new generation,
so one desired-state message, per node and batch, however many of its workers the batch touches), and one
slow or silent node never holds up the other nodes' steps; the slow one is issued again on the step timeout
and, after MAX_ATTEMPTS, fails the transition as the executor's rules say."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.core.state import Activity
from controlplane.models import Job, Node, Transition, TransitionStep, Worker
from controlplane.services import draining, executor, jobs, planner
from tests.support.cluster import agents_converge, make_job, make_node, run_transition

pytestmark = pytest.mark.django_db


def _preempted_cluster() -> tuple[Job, Transition]:
    """Three elastic nodes of two slots, a colocated job of four one-GPU workers on n1 and n2; then a
    preemption notice on n1: the plan stops n1's two workers (forced) and starts two on n3."""
    for name in ("n1", "n2", "n3"):
        make_node(name, pool="elastic", slots=2, hardware="H800")
    job = make_job(rollout_gpus=4, training_gpus=0, tp=1, hardware="h800", model="qwen3-8b")
    jobs.set_overrides(job_id=job.pk, changes={"force_mode": "colocated"}, actor="t")
    first = planner.plan_job(job_id=job.pk, signal="step_start")
    assert run_transition(first).status == "succeeded"
    assert sorted(Worker.objects.filter(job=job, alive=True).values_list("node__name", flat=True)) == [
        "n1",
        "n1",
        "n2",
        "n2",
    ]
    n1 = Node.objects.get(name="n1")
    draining.preemption_notice(node_id=n1.pk, deadline=timezone.now() + timedelta(minutes=10), actor="t")
    agents_converge()
    tr = planner.plan_job(job_id=job.pk, signal="capacity_change")
    assert tr is not None
    kinds = sorted(TransitionStep.objects.filter(transition=tr).values_list("kind", flat=True))
    assert kinds == ["finalize", "start_worker", "start_worker", "stop_worker", "stop_worker"] + ["sync_weights"] * 2
    return job, tr


def _steps(tr: Transition, node: str) -> set[str]:
    """The statuses of the transition's steps whose worker is (or was) on `node`."""
    slots = set(Worker.objects.filter(job=tr.job, node__name=node).values_list("slot", flat=True))
    return set(TransitionStep.objects.filter(transition=tr, worker_slot__in=slots).values_list("status", flat=True))


def test_a_batch_sends_each_node_one_desired_state_and_a_slow_node_holds_up_no_other_node():
    job, tr = _preempted_cluster()
    n3_before = Node.objects.get(name="n3").generation
    tr = executor.execute_transition(transition_id=tr.pk)
    # the forced stops (n1) and the bring-ups (n3) went out together, n3's two workers in one generation
    assert Node.objects.get(name="n3").generation == n3_before + 1
    assert Worker.objects.filter(job=job, node__name="n3", alive=True).count() == 2
    agents_converge(skip=("n1",))  # n1's agent, going away, is slow to confirm its stops
    tr = executor.execute_transition(transition_id=tr.pk)
    assert tr.status == "running"
    assert _steps(tr, "n3") == {"done"}  # started and synced while n1 still has not confirmed
    assert _steps(tr, "n1") == {"running"}
    assert TransitionStep.objects.get(transition=tr, kind="finalize").status == "pending"  # it waits for all
    agents_converge()  # n1 confirms, late
    assert run_transition(tr).status == "succeeded"
    active = Worker.objects.filter(job=job, alive=True, activity=Activity.ACTIVE)
    assert sorted(active.values_list("node__name", flat=True)) == ["n2", "n2", "n3", "n3"]


def test_a_silent_node_is_issued_again_on_the_timeout_then_fails_the_transition(settings):
    job, tr = _preempted_cluster()
    executor.execute_transition(transition_id=tr.pk)
    settings.PEARL = {**settings.PEARL, "STEP_TIMEOUT_S": 0.0}  # every step issued so far is late from here on
    n3 = Node.objects.get(name="n3")
    agents_converge(skip=("n3",))  # n3's agent never confirms its bring-ups
    tr = executor.execute_transition(transition_id=tr.pk)  # timed out once: issued again, n1's stops done
    assert tr.status == "running"
    assert _steps(tr, "n1") == {"done"}
    starts = TransitionStep.objects.filter(transition=tr, kind="start_worker")
    assert {s.attempts for s in starts} == {2}
    assert Node.objects.get(name="n3").generation == n3.generation + 1  # one resend for its two workers
    for _ in range(executor.MAX_ATTEMPTS):
        tr = executor.execute_transition(transition_id=tr.pk)
        if tr.status != "running":
            break
    assert tr.status == "failed" and "not confirmed by the agent" in tr.error
    # all-or-nothing expansion: the workers it started on n3 are rolled back
    assert not Worker.objects.filter(job=job, node__name="n3", alive=True).exists()


def test_a_vllm_jobs_steps_wait_the_longer_vllm_step_timeout(settings):
    """A vLLM engine takes minutes to start: its job's steps are late only after VLLM_STEP_TIMEOUT_S."""
    job, tr = _preempted_cluster()
    Job.objects.filter(pk=job.pk).update(engine="vllm")
    executor.execute_transition(transition_id=tr.pk)
    settings.PEARL = {**settings.PEARL, "STEP_TIMEOUT_S": 0.0, "VLLM_STEP_TIMEOUT_S": 3600.0}
    agents_converge(skip=("n3",))  # n3's engines are still starting
    tr = executor.execute_transition(transition_id=tr.pk)
    assert tr.status == "running"
    assert {s.attempts for s in TransitionStep.objects.filter(transition=tr, kind="start_worker")} == {1}
    settings.PEARL = {**settings.PEARL, "VLLM_STEP_TIMEOUT_S": 0.0}  # past it, as any other job's
    tr = executor.execute_transition(transition_id=tr.pk)
    assert {s.attempts for s in TransitionStep.objects.filter(transition=tr, kind="start_worker")} == {2}


def _grown_cluster(k: int, prefix: str, hardware: str) -> Transition:
    """2k elastic nodes of two slots of `hardware`, a colocated job of 2k one-GPU workers on the first k;
    then a preemption notice on those k: the plan stops their 2k workers and starts 2k on the other k."""
    names = [f"{prefix}{i:02d}" for i in range(2 * k)]
    for name in names:
        make_node(name, pool="elastic", slots=2, hardware=hardware)
    job = make_job(f"job-{prefix}", rollout_gpus=2 * k, training_gpus=0, tp=1, hardware=hardware, model="qwen3-8b")
    jobs.set_overrides(job_id=job.pk, changes={"force_mode": "colocated"}, actor="t")
    assert run_transition(planner.plan_job(job_id=job.pk, signal="step_start")).status == "succeeded"
    held = sorted(set(Worker.objects.filter(job=job, alive=True).values_list("node__name", flat=True)))
    assert held == names[:k]
    for node in Node.objects.filter(name__in=held):
        draining.preemption_notice(node_id=node.pk, deadline=timezone.now() + timedelta(minutes=10), actor="t")
    agents_converge()
    tr = planner.plan_job(job_id=job.pk, signal="capacity_change")
    assert tr is not None
    return tr


def test_a_batch_costs_the_same_queries_and_dashboard_messages_whatever_number_of_nodes_it_touches(
    monkeypatch, django_capture_on_commit_callbacks
):
    """The first pass (k nodes' forced stops, k nodes' bring-ups) writes the generations, the timeline and
    the dashboard's node deltas in a constant number of queries and dashboard messages; only the agents'
    own notices (one per node: each has its own socket) follow the number of nodes."""
    from channels.layers import get_channel_layer
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from controlplane.services.events import DASHBOARD_GROUP

    layer = get_channel_layer()
    sent: list[str] = []
    real = layer.group_send

    async def spy(group: str, message: dict) -> None:
        sent.append(group)
        await real(group, message)

    monkeypatch.setattr(layer, "group_send", spy)
    cost = {}
    for k, prefix, hardware in ((1, "a", "H800"), (4, "b", "H20")):
        tr = _grown_cluster(k, prefix, hardware)
        sent.clear()
        with CaptureQueriesContext(connection) as queries, django_capture_on_commit_callbacks(execute=True):
            executor.execute_transition(transition_id=tr.pk)
        agents = sum(g.startswith("agent.node.") for g in sent)
        cost[k] = (len(queries), sent.count(DASHBOARD_GROUP), agents)
        assert agents == 2 * k  # each touched node's agent hears of its new generation once
    assert cost[1][:2] == cost[4][:2], cost


def _count_checks(monkeypatch) -> list[list[int]]:
    """Every invariant check that reads the database (the job ids it covered), in order."""
    from controlplane.services import invariants

    calls: list[list[int]] = []
    real = invariants._check

    def spy(job_ids: list[int], gpu_ids: set[int]) -> None:
        calls.append(list(job_ids))
        real(job_ids, gpu_ids)

    monkeypatch.setattr(invariants, "_check", spy)
    return calls


def test_an_executor_pass_checks_the_invariants_once_for_its_whole_batch(monkeypatch):
    """The first pass stops n1's workers and starts two on n3 (two service calls), the finalize pass admits
    them: each pass reads the job's workers for the invariants once, not once per service call."""
    job, tr = _preempted_cluster()
    calls = _count_checks(monkeypatch)
    executor.execute_transition(transition_id=tr.pk)
    assert calls == [[job.pk]]
    assert not Worker.objects.filter(job=job, node__name="n1", alive=True).exists()
    assert Worker.objects.filter(job=job, node__name="n3", alive=True).count() == 2
    calls.clear()
    agents_converge()
    tr = executor.execute_transition(transition_id=tr.pk)  # syncs confirmed, then the finalize is issued
    assert calls == [[job.pk]]
    assert TransitionStep.objects.get(transition=tr, kind="finalize").status == "running"


def test_a_batch_that_breaks_an_invariant_commits_none_of_its_calls():
    """checked_once checks at the end of the batch, still inside its transaction: a violation found there
    rolls back every call of the batch, the valid ones before it included."""
    from django.db import transaction

    from controlplane.services.errors import InvariantViolation
    from controlplane.services.invariants import checked_once
    from controlplane.services.workers import WorkerChange, change_workers, start_worker

    make_node("d1", slots=2, hardware="H800")
    job = make_job(rollout_gpus=2, training_gpus=0, tp=1, hardware="h800", model="qwen3-8b")
    d1 = Node.objects.get(name="d1")
    p = start_worker(job_id=job.pk, node_id=d1.pk, gpu_indexes=[0], role="prefill", activity="transitioning")
    d = start_worker(job_id=job.pk, node_id=d1.pk, gpu_indexes=[1], role="decode", activity="transitioning")
    generation = Node.objects.get(pk=d1.pk).generation
    lone = pytest.raises(InvariantViolation, match="without both a prefill and a decode")
    with lone, transaction.atomic(), checked_once():
        change_workers(job_id=job.pk, changes=[WorkerChange(d.slot, role="colocated")])  # valid alone
        change_workers(job_id=job.pk, changes=[WorkerChange(p.slot, activity="active")])  # a lone prefill
    assert sorted(Worker.objects.filter(job=job).values_list("role", "activity")) == [
        ("decode", "transitioning"),
        ("prefill", "transitioning"),
    ]
    assert Node.objects.get(pk=d1.pk).generation == generation


@pytest.mark.django_db(transaction=True)
def test_a_batch_check_outside_a_transaction_is_refused():
    """Outside a transaction the calls of a batch would commit one by one before the check: refused."""
    from controlplane.services.invariants import checked_once

    with pytest.raises(RuntimeError, match="inside a transaction"), checked_once():
        pass


def test_the_finalize_waits_for_the_workers_it_admitted_only():
    """The finalize's confirmation reads the reports of the nodes whose workers it admitted: n3's new
    workers must serve; n2's, untouched by the transition, are not waited for even while n2's report is
    stale (the transition did not change them)."""
    job, tr = _preempted_cluster()
    tr = executor.execute_transition(transition_id=tr.pk)
    agents_converge()
    tr = executor.execute_transition(transition_id=tr.pk)  # the finalize is issued
    fin = TransitionStep.objects.get(transition=tr, kind="finalize")
    n3_slots = sorted(Worker.objects.filter(job=job, node__name="n3", alive=True).values_list("slot", flat=True))
    assert fin.status == "running" and fin.args[executor.ADMITTED] == n3_slots
    Node.objects.filter(name="n2").update(observed=[])  # n2's report says nothing of its workers
    tr = executor.execute_transition(transition_id=tr.pk)
    assert tr.status == "running"  # n3's agent has not shown its workers active yet
    agents_converge(skip=("n2",))
    assert executor.execute_transition(transition_id=tr.pk).status == "succeeded"


def _held_cluster(k: int, prefix: str) -> tuple[Job, list[Node]]:
    """k elastic nodes of two slots, each holding two active workers of one colocated job."""
    names = [f"{prefix}{i:02d}" for i in range(k)]
    for name in names:
        make_node(name, pool="elastic", slots=2, hardware="H800")
    job = make_job(f"job-{prefix}", rollout_gpus=2 * k, training_gpus=0, tp=1, hardware="h800", model="qwen3-8b")
    jobs.set_overrides(job_id=job.pk, changes={"force_mode": "colocated"}, actor="t")
    assert run_transition(planner.plan_job(job_id=job.pk, signal="step_start")).status == "succeeded"
    return job, list(Node.objects.filter(name__in=names).order_by("pk"))


def test_notices_for_several_nodes_drain_each_as_one_notice_would_in_the_queries_of_one(monkeypatch):
    """One call for k nodes: each node draining with its deadline, its workers out of service, its generation
    one up and its own timeline entry; the job re-planned once; the same number of queries for 1 and 4 nodes
    (with one deadline for all, as a Ray drain of several nodes has)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from controlplane.models import Event
    from controlplane.services import plan_queue

    replans: list[tuple[int, str]] = []
    monkeypatch.setattr(plan_queue, "enqueue_plan", lambda job_id, signal: replans.append((job_id, signal)))
    cost = {}
    for k, prefix in ((1, "s"), (4, "m")):
        job, held = _held_cluster(k, prefix)
        before = {n.pk: n.generation for n in Node.objects.filter(pk__in=[n.pk for n in held])}
        deadlines = dict.fromkeys(sorted(n.pk for n in held), timezone.now() + timedelta(minutes=10))
        replans.clear()
        with CaptureQueriesContext(connection) as queries:
            out = draining.preemption_notices(deadlines=deadlines, actor="t")
        cost[k] = len(queries)
        assert [n.pk for n in out] == sorted(deadlines)
        for n in Node.objects.filter(pk__in=deadlines):
            assert (n.status, n.preemption_deadline, n.generation) == ("draining", deadlines[n.pk], before[n.pk] + 1)
        assert not Worker.objects.filter(node__in=held, activity=Activity.ACTIVE).exists()
        assert not Worker.objects.filter(node__in=held, bindings__active=True).exists()
        notices = Event.objects.filter(kind="node.preemption_notice", node__in=held)
        assert sorted(notices.values_list("node_id", flat=True)) == sorted(deadlines)
        assert replans == [(job.pk, "capacity_change")]
    assert cost[1] == cost[4], cost
    # nodes under notice get new deadlines, each its own (one UPDATE per distinct deadline)
    later = {n.pk: timezone.now() + timedelta(minutes=20 + i) for i, n in enumerate(held)}
    draining.preemption_notices(deadlines=later, actor="t")
    assert dict(Node.objects.filter(pk__in=later).values_list("pk", "preemption_deadline")) == later


def test_notices_for_several_nodes_are_all_or_nothing():
    """A node among them that may not get a notice (here a reserved one) refuses the whole call: no node drains."""
    from controlplane.services.errors import Conflict

    _, held = _held_cluster(2, "a")
    reserved = make_node("r0", slots=2, hardware="H800")
    deadline = timezone.now() + timedelta(minutes=10)
    with pytest.raises(Conflict, match="only elastic nodes"):
        draining.preemption_notices(deadlines=dict.fromkeys([*(n.pk for n in held), reserved.pk], deadline), actor="t")
    assert set(Node.objects.values_list("status", flat=True)) == {"ready"}
    assert Worker.objects.filter(node__in=held, activity=Activity.ACTIVE).count() == 4
