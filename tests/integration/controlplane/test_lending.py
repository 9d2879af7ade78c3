"""Cross-job borrowing, live (issue 35, Deliver 3), through the real services with agents converging without
processes: the arbiter lends a job's idle training GPU to another job's rollout, the borrower's planner starts
a worker there, the owner's Training Begin takes it back before the owner's update may start, the lend ends
and the owner's overlap worker comes back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from controlplane.core.state import Activity, Zone
from controlplane.models import Event, Job, TrainingLend, TransitionStep, Worker
from controlplane.selectors.jobs import job_status
from controlplane.selectors.lending import (
    borrowed_units,
    lend_followups,
    lendable_groups,
    lendable_training_units,
    lendable_units,
)
from controlplane.services import arbitration, executor, jobs, planner
from controlplane.services.errors import Conflict
from pearl_cli.main import status_text
from tests.support.cluster import agents_converge, make_job, make_node, run_transition, trained_every

pytestmark = pytest.mark.django_db

SPEC = {"rollout_gpus": 4, "training_gpus": 1, "model": "tiny", "batch_size": 16, "group_size": 4}


def _place_all(division: arbitration.Rebalance) -> None:
    for job_id, signal in division.plan_order:
        t = planner.plan_job(job_id=job_id, signal=signal)
        if t is not None:
            assert run_transition(t).status == "succeeded"


def _status_text(job_id: int) -> str:
    st = job_status(job_id)
    assert st is not None
    return status_text(st)


def _on_loan(owner: Job) -> list[Worker]:
    """Other jobs' workers on the owner's training GPUs."""
    from controlplane.selectors.lending import on_owner_gpus

    return on_owner_gpus(owner)


def _two_jobs() -> tuple[Job, Job]:
    make_node("r1", slots=4)
    make_node("t1", pool="training", slots=2)
    a, b = make_job("a", **SPEC), make_job("b", **SPEC)
    _place_all(arbitration.rebalance(reason="jobs arrived"))
    assert Job.objects.get(pk=a.pk).allotted_rollout_gpus == 2 == Job.objects.get(pk=b.pk).allotted_rollout_gpus
    return a, b


def test_an_idle_training_gpu_serves_another_job_until_its_owner_trains():
    a, b = _two_jobs()
    trained_every(a, 200.0)
    assert lendable_units(a) == 1  # its Training Begin parked its overlap worker: the training GPU is idle

    # a division after a's update: a's idle training GPU is lent to b (b wants 4 and holds 2); a's parked overlap
    # worker stops, b is planned and starts a worker of its own there
    division = arbitration.rebalance(reason="a's Training Finished")
    lend = TrainingLend.objects.get()
    assert (lend.owner_id, lend.borrower_id, lend.gpus) == (a.pk, b.pk, 1) and lend.due is not None
    assert b.pk in [j for j, _ in division.plan_order]
    assert "b 2→3 (+1 lent)" in division.explanation, division.explanation
    ev = Event.objects.filter(kind=arbitration.EVENT_KIND).latest("id")
    assert ev.data["lent"] == {"b": 1}
    assert not Worker.objects.filter(job=a, alive=True, zone=Zone.OVERLAP).exclude(role="training").exists()
    _place_all(division)
    [w] = _on_loan(a)
    assert (w.job_id, w.zone, w.activity, w.node.name) == (b.pk, Zone.ROLLOUT, Activity.ACTIVE, "t1")
    # b's share of the cluster is unchanged: the worker on a's training GPU is a lend, not its allotment
    assert Job.objects.get(pk=b.pk).allotted_rollout_gpus == 2
    assert arbitration.rebalance(reason="periodic").plan_order == []  # the lend holds: nothing moves
    # where a person looks: `pearl status` of each job, the job page's share (the same `sharing` read)
    assert "  borrows 1 training GPU(s) of job a until a's next Training Begin" in _status_text(b.pk)
    assert "  lends 1 training GPU(s) to job b until its next Training Begin" in _status_text(a.pk)
    assert "holds 2;" in _status_text(b.pk)  # its share: the lent GPU is not counted there

    # a's Training Begin takes the GPU back at once (the agent parks the worker; its turns resume elsewhere), and
    # a's update waits until b's worker there is reported back
    jobs.set_training_active(job_id=a.pk, active=True)
    assert Worker.objects.get(pk=w.pk).activity == Activity.INACTIVE
    with pytest.raises(Conflict, match=r"job b's worker \d+ on its lent training GPUs is not back yet"):
        jobs.start_update(job_id=a.pk)
    agents_converge()
    jobs.start_update(job_id=a.pk)

    # the next division ends the lend; b's planner stops its worker there
    division = arbitration.rebalance(reason="a's Training Begin")
    assert not TrainingLend.objects.exists()
    assert "b 3→2" in division.explanation, division.explanation
    _place_all(division)
    assert not _on_loan(a)
    stops = TransitionStep.objects.filter(transition__job=b, kind="stop_worker", worker_slot=w.slot)
    assert stops.filter(status="done").exists()

    # after a's update its next plan starts its overlap worker again, parked on its training GPU
    jobs.set_training_active(job_id=a.pk, active=False)
    planner.plan_job(job_id=a.pk, signal="training_finished")
    back = Worker.objects.filter(job=a, alive=True, zone=Zone.OVERLAP).exclude(role="training")
    assert back.count() == 1 and back.get().activity == Activity.INACTIVE


def test_a_start_or_an_admission_the_owners_training_begin_overtook_does_not_happen():
    a, b = _two_jobs()
    trained_every(a, 200.0)
    arbitration.rebalance(reason="a's Training Finished")
    assert TrainingLend.objects.filter(owner=a, borrower=b).exists()
    t = planner.plan_job(job_id=b.pk, signal="capacity_change")
    jobs.set_training_active(job_id=a.pk, active=True)  # before b's transition started its worker there
    done = run_transition(t)
    assert done.status == "failed" and "a's Training Begin arrived before worker" in done.error, done.error
    assert not _on_loan(a)
    agents_converge()
    jobs.start_update(job_id=a.pk)

    # one step later: b's worker has started there when a's Training Begin comes, before b's finalize admits it
    jobs.set_training_active(job_id=a.pk, active=False)
    trained_every(a, 200.0)
    arbitration.rebalance(reason="periodic")  # the lend holds (a lends its empty unit): b is to fill it
    assert lend_followups() == {b.pk}  # what is planned once a transition ends (plan_queue.replan_short_jobs)
    t = planner.plan_job(job_id=b.pk, signal="capacity_change")
    assert executor.execute_transition(transition_id=t.pk).status == "running"  # the start is issued
    [w] = _on_loan(a)
    agents_converge()  # its agent reports it running
    jobs.set_training_active(job_id=a.pk, active=True)
    assert Worker.objects.get(pk=w.pk).activity == Activity.INACTIVE  # parked at once
    assert run_transition(t).status == "succeeded"
    assert Worker.objects.get(pk=w.pk).activity == Activity.INACTIVE  # b's finalize left it out
    agents_converge()
    jobs.start_update(job_id=a.pk)
    _place_all(arbitration.rebalance(reason="a's Training Begin"))  # the lend ends: b stops its worker there
    assert not _on_loan(a) and not TrainingLend.objects.exists()
    assert lend_followups() == set()  # a trains: its overlap worker comes back after its update
    jobs.set_training_active(job_id=a.pk, active=False)
    assert lend_followups() == {a.pk}


def test_a_lent_worker_still_starting_at_its_owners_training_begin_stops_and_the_update_waits_until_it_is_gone():
    a, b = _two_jobs()
    trained_every(a, 200.0)
    arbitration.rebalance(reason="a's Training Finished")
    t = planner.plan_job(job_id=b.pk, signal="capacity_change")
    assert executor.execute_transition(transition_id=t.pk).status == "running"  # the start is issued
    [w] = _on_loan(a)
    agents_converge(starting={w.pk})  # its agent is still starting it (a process, b's weights) at a's Training Begin

    # parking it would wait for its start to end: it stops at once instead, and a's update waits until its agent
    # no longer runs it (the agent abandons the start: tests/integration/agents/test_node_agent.py)
    jobs.set_training_active(job_id=a.pk, active=True)
    assert not Worker.objects.get(pk=w.pk).alive
    with pytest.raises(Conflict, match=rf"job b's worker {w.slot} on its lent training GPUs is not back yet"):
        jobs.start_update(job_id=a.pk)
    agents_converge()  # its agent no longer reports it
    jobs.start_update(job_id=a.pk)

    # b's transition does not wait for a start that cannot end: the step is skipped, the rest goes on
    assert run_transition(t).status == "succeeded"
    step = TransitionStep.objects.get(transition=t, kind="start_worker", worker_slot=w.slot)
    assert step.status == "skipped"
    assert not Event.objects.filter(kind__in=["plan.error", "transition.failed"]).exists()
    _place_all(arbitration.rebalance(reason="a's Training Begin"))  # the lend ends
    assert not TrainingLend.objects.exists() and not _on_loan(a)


def test_a_job_lends_nothing_before_its_period_is_known_or_with_lending_off():
    a, b = _two_jobs()
    arbitration.rebalance(reason="periodic")
    assert not TrainingLend.objects.exists()  # a has not trained twice: its next Training Begin is unknown
    assert (  # where a person looks: why its idle training GPU goes to no other job
        "  lends no training GPU to other jobs: its next Training Begin cannot be predicted yet" in _status_text(a.pk)
    )
    trained_every(a, 200.0)
    with override_settings(PEARL={**__import__("django.conf").conf.settings.PEARL, "CROSS_JOB_LENDING": False}):
        arbitration.rebalance(reason="periodic")
        assert "lends no training GPU to other jobs: cross-job lending is off" in _status_text(a.pk)
    assert not TrainingLend.objects.exists()
    units, room = borrowed_units(Job.objects.get(pk=b.pk))
    assert (units, room) == ([], 0)


def test_a_job_whose_idle_window_buys_no_lend_says_what_it_would_save_and_cost():
    a, b = _two_jobs()
    # b's workers took 30 s to serve (its measured reload), a's updates come every 12 s, the last 1 s ago: a's
    # return must start in 10 s, before a worker of b would serve there
    starts = TransitionStep.objects.filter(transition__job=b, kind="start_worker", status="done")
    for pk, finished in starts.values_list("pk", "finished"):
        assert finished is not None
        TransitionStep.objects.filter(pk=pk).update(started=finished - timedelta(seconds=30))
    trained_every(a, 12.0)
    arbitration.rebalance(reason="a's Training Finished")
    assert not TrainingLend.objects.exists()
    assert (
        "lends no training GPU to other jobs: no lend pays in the 10 s before its return must start: b would save 0 s"
        " of its step before the return, less than the 30 s the lend costs (30 s b's reload, 0 s the return)"
    ) in _status_text(a.pk)
    # at its Training Begin nothing of it is idle: the reason of its idle time is not shown
    Job.objects.filter(pk=a.pk).update(training_active=True)
    assert "lends no training GPU" not in _status_text(a.pk)
    Job.objects.filter(pk=a.pk).update(training_active=False)
    # with room in its period it lends, and its status no longer says why not
    trained_every(a, 200.0)
    arbitration.rebalance(reason="a's Training Finished")
    assert TrainingLend.objects.filter(owner=a, borrower=b).exists()
    assert Job.objects.get(pk=a.pk).unlent_reason == "" and "lends no training GPU" not in _status_text(a.pk)


@pytest.mark.parametrize(
    ("owner_tp", "owner_training", "borrower_tp", "workers"),
    [(2, 2, 1, 2), (1, 2, 2, 1)],
    ids=["tp2-unit-holds-two-tp1-workers", "two-tp1-units-hold-a-tp2-worker"],
)
def test_jobs_of_different_tps_lend_whole_workers_and_take_them_back(owner_tp, owner_training, borrower_tp, workers):
    make_node("r1", slots=4)
    make_node("t1", pool="training", slots=4)
    a = make_job("a", **(SPEC | {"tp": owner_tp, "training_gpus": owner_training}))
    b = make_job("b", **(SPEC | {"tp": borrower_tp, "training_gpus": borrower_tp}))
    _place_all(arbitration.rebalance(reason="jobs arrived"))
    assert Job.objects.get(pk=a.pk).allotted_rollout_gpus == 2 == Job.objects.get(pk=b.pk).allotted_rollout_gpus
    trained_every(a, 200.0)

    # a's two idle training GPUs go to b in one lend, as many whole workers of b as they hold
    division = arbitration.rebalance(reason="a's Training Finished")
    lend = TrainingLend.objects.get()
    assert (lend.owner_id, lend.borrower_id, lend.gpus) == (a.pk, b.pk, 2), division.explanation
    _place_all(division)
    there = _on_loan(a)
    assert len(there) == workers and {w.job_id for w in there} == {b.pk}
    assert sorted(g.gpu.index for w in there for g in w.bindings.filter(alive=True)) == [0, 1]
    assert all(w.activity == Activity.ACTIVE and w.node.name == "t1" for w in there)
    assert arbitration.rebalance(reason="periodic").plan_order == []  # the lend holds: nothing moves
    assert "  lends 2 training GPU(s) to job b until its next Training Begin" in _status_text(a.pk)

    # a's Training Begin takes every one of them back before its update
    jobs.set_training_active(job_id=a.pk, active=True)
    assert {Worker.objects.get(pk=w.pk).activity for w in there} == {Activity.INACTIVE}
    with pytest.raises(Conflict, match="on its lent training GPUs is not back yet"):
        jobs.start_update(job_id=a.pk)
    agents_converge()
    jobs.start_update(job_id=a.pk)
    _place_all(arbitration.rebalance(reason="a's Training Begin"))
    assert not TrainingLend.objects.exists() and not _on_loan(a)

    # after its update a's own overlap workers come back on its training GPUs, one per training unit
    jobs.set_training_active(job_id=a.pk, active=False)
    planner.plan_job(job_id=a.pk, signal="training_finished")
    back = Worker.objects.filter(job=a, alive=True, zone=Zone.OVERLAP).exclude(role="training")
    assert back.count() == owner_training // owner_tp


def test_one_idle_tp1_training_gpu_is_not_lent_to_a_tp2_job_and_its_status_says_why():
    make_node("r1", slots=4)
    make_node("t1", pool="training", slots=4)
    a = make_job("a", **SPEC)
    make_job("b", **(SPEC | {"tp": 2, "training_gpus": 2}))
    _place_all(arbitration.rebalance(reason="jobs arrived"))
    trained_every(a, 200.0)
    arbitration.rebalance(reason="a's Training Finished")
    assert not TrainingLend.objects.exists()
    assert "b's workers need 2 of its units on one lend, it has 1 idle" in _status_text(a.pk)


def test_two_idle_tp1_training_gpus_on_two_nodes_are_not_lent_to_a_tp2_job_and_its_status_says_why():
    """A TP2 worker needs its two GPUs on one node: a's units on t1 and t2 hold none of b's workers, though they
    are two (side by side on one node they do: `two-tp1-units-hold-a-tp2-worker` above)."""
    make_node("r1", slots=4)
    make_node("t1", pool="training", slots=1)
    make_node("t2", pool="training", slots=1)
    make_node("t3", pool="training", slots=2)
    a = make_job("a", **(SPEC | {"training_gpus": 2}))
    make_job("b", **(SPEC | {"tp": 2, "training_gpus": 2}))
    _place_all(arbitration.rebalance(reason="jobs arrived"))
    assert sorted(n for (n,) in Worker.objects.filter(job=a, role="training").values_list("node__name")) == ["t1", "t2"]
    trained_every(a, 200.0)
    assert lendable_units(a) == 2 and lendable_groups(a, lendable_training_units(a), [2]) == {2: 0}
    arbitration.rebalance(reason="a's Training Finished")
    assert not TrainingLend.objects.exists()
    assert "b's workers need 2 of its units side by side on one node; its 2 idle ones are not" in _status_text(a.pk)


def test_jobs_whose_tps_do_not_divide_lend_nothing_and_say_why():
    make_node("r1", slots=6)
    make_node("t1", pool="training", slots=5)
    a = make_job("a", **(SPEC | {"tp": 2, "training_gpus": 2}))
    make_job("b", **(SPEC | {"tp": 3, "training_gpus": 3, "rollout_gpus": 3}))
    _place_all(arbitration.rebalance(reason="jobs arrived"))
    trained_every(a, 200.0)
    arbitration.rebalance(reason="a's Training Finished")
    assert not TrainingLend.objects.exists()
    assert "its TP 2 and b (TP 3) neither divide the other" in _status_text(a.pk)


@pytest.mark.parametrize("leaves", ["owner stops", "owner pauses", "borrower pauses"])
def test_a_lend_ends_when_its_owner_or_borrower_leaves_and_nothing_stays_on_the_owners_gpus(leaves):
    a, b = _two_jobs()
    trained_every(a, 200.0)
    _place_all(arbitration.rebalance(reason="a's Training Finished"))
    [w] = _on_loan(a)
    if leaves == "owner stops":
        jobs.stop_job(job_id=a.pk, actor="test")
    elif leaves == "owner pauses":
        jobs.pause_job(job_id=a.pk, actor="test")
    else:
        jobs.pause_job(job_id=b.pk, actor="test")
        run_transition(planner.plan_job(job_id=b.pk, signal="periodic"))  # its release stops every rollout worker
    _place_all(arbitration.rebalance(reason=leaves))
    assert not TrainingLend.objects.exists()
    assert not Worker.objects.filter(pk=w.pk, alive=True).exists()  # b's worker there drained and stopped
    if leaves == "borrower pauses":  # a's overlap worker comes back with its next plan
        planner.plan_job(job_id=a.pk, signal="periodic")
        assert Worker.objects.filter(job=a, alive=True, zone=Zone.OVERLAP).exclude(role="training").count() == 1
