"""The live cluster arbiter (issue 35) through the real services, agents converging without processes: a job's
fields and their 400s, the admission of guarantees, and one division per cluster event that the planner then
places inside, capacity moving between jobs only by draining the giver's workers first."""

from __future__ import annotations

import pytest

from controlplane.consumers.dashboard import _snapshot
from controlplane.core.arbiter import Idle
from controlplane.core.state import Activity, NodeStatus, Zone
from controlplane.models import Event, Job, Node, Transition, TransitionStep, Worker
from controlplane.selectors.jobs import job_status
from controlplane.services import arbitration, jobs, plan_queue, planner
from controlplane.services.errors import InvalidInput
from pearl_cli.main import status_text
from tests.support.cluster import make_job, make_node, rolled_out, run_transition, trained_every

pytestmark = pytest.mark.django_db

SPEC = {"rollout_gpus": 4, "training_gpus": 1, "model": "tiny", "batch_size": 16, "group_size": 4}


def _rollout(job: Job) -> int:
    return Worker.objects.filter(job=job, alive=True, zone=Zone.ROLLOUT).count()


def _place_all(division: arbitration.Rebalance) -> None:
    """What the arbiter task does: plan each job in the division's order (the shrinking first), executing the
    transitions as the agents confirm them."""
    for job_id, signal in division.plan_order:
        t = planner.plan_job(job_id=job_id, signal=signal)
        if t is not None:
            assert run_transition(t).status == "succeeded"


def _status_text(job_id: int) -> str:
    """What `pearl status` prints for the job."""
    st = job_status(job_id)
    assert st is not None
    return status_text(st)


def _cluster() -> None:
    make_node("r1", slots=4)
    make_node("t1", pool="training", slots=2)


def test_a_second_job_gets_an_equal_share_by_draining_the_first():
    _cluster()
    a = make_job("a", **SPEC)
    first = arbitration.rebalance(reason="job a arrived")
    assert first.allotted == {a.pk: 4} and first.explanation == "job a arrived: a 0→4"
    _place_all(first)
    assert _rollout(a) == 4 and Job.objects.get(pk=a.pk).status == "running"

    b = make_job("b", **SPEC)
    second = arbitration.rebalance(reason="job b arrived")
    assert second.allotted == {a.pk: 2, b.pk: 2}
    assert [j for j, _ in second.plan_order] == [a.pk, b.pk]  # the giver first
    ev = Event.objects.filter(kind=arbitration.EVENT_KIND).latest("id")
    assert ev.message == "job b arrived: a 4→2, b 0→2"
    assert ev.data["gpus"] == {"a": 2, "b": 2} and ev.data["held"] == {"a": 4, "b": 0}

    shrink = planner.plan_job(job_id=a.pk, signal="capacity_change")
    assert shrink is not None
    # it gives up two dedicated rollout workers (their agent retires each by draining it first: a turn in flight
    # finishes or goes back to the driver with its partial output), never a training worker
    stops = [
        s
        for k, s in TransitionStep.objects.filter(transition=shrink).values_list("kind", "worker_slot")
        if k == "stop_worker" and s is not None
    ]
    assert len(stops) == 2
    assert set(Worker.objects.filter(job=a, slot__in=stops).values_list("zone", flat=True)) == {Zone.ROLLOUT}
    # before the giver's workers stopped, the newcomer starts no dedicated worker on them (it may borrow its own
    # idle training GPUs meanwhile)
    early = planner.plan_job(job_id=b.pk, signal="step_start")
    if early is None:
        assert "allots it 2, none free yet" in Job.objects.get(pk=b.pk).status_reason
        assert "pending: waiting for rollout GPUs: the cluster arbiter allots it 2" in _status_text(b.pk)
    else:
        assert "start_worker" not in set(TransitionStep.objects.filter(transition=early).values_list("kind", flat=True))
        assert run_transition(early).status == "succeeded"
    assert run_transition(shrink).status == "succeeded"
    run_transition(planner.plan_job(job_id=b.pk, signal="capacity_change"))
    assert (_rollout(a), _rollout(b)) == (2, 2)
    assert Job.objects.get(pk=b.pk).status == "running"
    assert not Worker.objects.filter(job=a, alive=True, role="training").exclude(activity=Activity.INACTIVE).exists()

    # the cluster page's share chart: one point per division, each job's GPUs and why
    shares = _snapshot("cluster", None)["shares"]
    assert [p["gpus"] for p in shares] == [{"a": 4}, {"a": 2, "b": 2}]
    assert shares[-1]["why"] == "job b arrived: a 4→2, b 0→2" and shares[-1]["lent"] == {}

    # `pearl status` prints the job's share (and, while it waits, why)
    text = _status_text(b.pk)
    assert "share: allotted 2 of at most 4 rollout GPUs, holds 2; guaranteed 0, priority 0, weight 1" in text, text

    # nothing changed: no event, nothing to plan but the running jobs' own signals
    again = arbitration.rebalance(reason="periodic")
    assert again.plan_order == [] and Event.objects.filter(kind=arbitration.EVENT_KIND).count() == 2


def test_jobs_of_different_tps_get_equal_gpus_and_the_tp2_one_places_its_share():
    """Jobs of TP 1 and 2 are divided in GPUs: the TP2 job's odd GPU buys nothing alone, the two after it do (it
    got 2 of 8 GPUs, one worker, before the arbiter looked past the flat GPU)."""
    make_node("r1", slots=8)
    make_node("t1", pool="training", slots=4)
    one = make_job("one", **SPEC | {"rollout_gpus": 8})
    two = make_job("two", **SPEC | {"rollout_gpus": 8, "tp": 2, "training_gpus": 2})
    division = arbitration.rebalance(reason="two jobs")
    assert division.unit_gpus == 1 and division.allotted == {one.pk: 4, two.pk: 4}
    _place_all(division)
    assert _rollout(one) == 4 and _rollout(two) == 2  # two TP2 workers


def test_a_job_its_trainer_bounds_leaves_the_units_it_cannot_use_to_the_other():
    """A job whose updates take longer than any rollout the predictor gives it (here 10,000 s each) gains
    nothing from a unit past its first: the arbiter weighs the step time, not the rollout alone, as the
    simulator does (`best_step_time`)."""
    _cluster()
    make_node("r2", slots=4)
    slow, quick = make_job("slow", **SPEC | {"rollout_gpus": 8}), make_job("quick", **SPEC | {"rollout_gpus": 8})
    assert sorted(arbitration.rebalance(reason="two jobs").allotted.values()) == [4, 4]
    trained_every(slow, 20_000.0, update_s=10_000.0)
    # until its predictor has measured a rollout of it, its curve is its prior's: it keeps its share
    assert sorted(arbitration.rebalance(reason="slow trained").allotted.values()) == [4, 4]
    rolled_out(slow)
    division = arbitration.rebalance(reason="slow measured")
    assert division.allotted[slow.pk] < division.allotted[quick.pk], division


def test_an_on_policy_job_with_long_updates_keeps_its_share():
    """On-policy (max staleness 0) a rollout waits for the update: the step is their sum, so every unit still
    shortens it, however long the update."""
    _cluster()
    make_node("r2", slots=4)
    spec = SPEC | {"rollout_gpus": 8}
    on_policy, quick = make_job("onp", **spec | {"max_staleness": 0}), make_job("quick", **spec)
    arbitration.rebalance(reason="two jobs")
    trained_every(on_policy, 20_000.0, update_s=10_000.0)
    division = arbitration.rebalance(reason="onp trained")
    assert division.allotted == {on_policy.pk: 4, quick.pk: 4}


def test_a_higher_priority_guarantee_is_met_from_a_lower_priority_job():
    _cluster()
    low = make_job("low", **SPEC)
    _place_all(arbitration.rebalance(reason="job low arrived"))
    assert _rollout(low) == 4
    high = make_job("high", **SPEC | {"priority": 5, "min_rollout_gpus": 3})
    division = arbitration.rebalance(reason="job high arrived")
    assert division.allotted[high.pk] >= 3 and division.allotted[low.pk] >= 1
    _place_all(division)
    planner.plan_job(job_id=high.pk, signal="capacity_change")  # what replan_short_jobs asks once units came free
    assert _rollout(high) >= 3 and _rollout(low) + _rollout(high) == 4


def test_a_job_that_ends_gives_its_share_back():
    _cluster()
    a, b = make_job("a", **SPEC), make_job("b", **SPEC)
    division = arbitration.rebalance(reason="two jobs")
    assert sorted(division.allotted.values()) == [2, 2]
    Job.objects.filter(pk=b.pk).update(status="stopped")
    after = arbitration.rebalance(reason="job b stopped")
    assert after.allotted == {a.pk: 4} and after.explanation == "job b stopped: b 2→0, a 2→4"
    assert Job.objects.get(pk=b.pk).allotted_rollout_gpus == 0
    assert arbitration.rebalance(reason="periodic").explanation == ""  # said once


def test_a_guarantee_the_reserved_pool_cannot_hold_beside_the_others_is_refused_with_the_arithmetic(api):
    _cluster()
    make_job("a", **SPEC | {"min_rollout_gpus": 3})
    with pytest.raises(InvalidInput) as exc:
        make_job("b", **SPEC | {"min_rollout_gpus": 2})
    assert exc.value.field == "min_rollout_gpus"
    assert "reserved pool has 4 GPUs, the live jobs' guarantees take 3 (a: 3), 1 are left (3 + 2 > 4)" in str(exc.value)
    body = {"name": "c", **SPEC, "min_rollout_gpus": 2}
    r = api.post("/api/jobs/", body, format="json")
    assert r.status_code == 400 and r.json()["field"] == "min_rollout_gpus", r.json()
    assert api.post("/api/jobs/", {**body, "min_rollout_gpus": 1}, format="json").status_code == 201


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"weight": 0}, "weight"),
        ({"weight": -1.5}, "weight"),
        ({"weight": "2"}, "weight"),
        ({"priority": 1.5}, "priority"),
        ({"min_rollout_gpus": -1}, "min_rollout_gpus"),
        ({"min_rollout_gpus": 5}, "min_rollout_gpus"),
    ],
)
def test_bad_sharing_fields_are_400s_naming_the_field(api, change, field):
    _cluster()
    r = api.post("/api/jobs/", {"name": "x", **SPEC, **change}, format="json")
    assert r.status_code == 400 and r.json()["field"] == field, r.json()


def test_the_sharing_fields_are_stored_and_shown(api):
    _cluster()
    r = api.post(
        "/api/jobs/", {"name": "x", **SPEC, "priority": 2, "weight": 1.5, "min_rollout_gpus": 2}, format="json"
    )
    assert r.status_code == 201, r.json()
    got = api.get(f"/api/jobs/{r.json()['id']}/").json()
    assert (got["priority"], got["weight"], got["min_rollout_gpus"], got["allotted_rollout_gpus"]) == (2, 1.5, 2, None)


def test_launch_demo_jobs_share_the_spot_pool():
    from django.core.management.base import CommandError

    from controlplane.management.commands.launch import DEMO_NODES, Command, shared_demo_jobs

    for name, pool, slots, hw in DEMO_NODES:
        make_node(name, pool=pool, slots=slots, hardware=hw)
    Command()._demo_job({"cluster": DEMO_NODES, "demo_jobs": 3})
    jobs = list(Job.objects.order_by("name"))
    assert len(jobs) == 3 and {(j.rollout_gpus, j.training_gpus, j.tp, j.weight) for j in jobs} == {(8, 2, 2, 1.0)}
    division = arbitration.rebalance(reason="demo")
    assert division.unit_gpus == 2 and division.capacity_gpus == 8
    assert sorted(division.allotted.values()) == [2, 2, 4]  # 4 TP2 units over 3 equal jobs
    with pytest.raises(CommandError, match="8 H800 training GPUs cannot give each job a 2-GPU group"):
        shared_demo_jobs(DEMO_NODES, 5, 1)


def test_the_launch_form_has_the_sharing_fields(client, django_user_model):
    _cluster()
    client.force_login(django_user_model.objects.create_user("former", password="x"))
    page = client.get("/jobs/new/").content.decode()
    assert 'id="id_priority" name="priority" value="0"' in page
    assert 'type="number" id="id_weight" name="weight" value="1.0" step="any"' in page
    assert 'id="id_min_rollout_gpus" name="min_rollout_gpus" value="0"' in page


def test_a_running_job_allotted_nothing_gives_every_unit_to_a_higher_priority_guarantee():
    _cluster()
    low = make_job("low", **SPEC)
    jobs.set_overrides(job_id=low.pk, changes={"borrowing": False}, actor="test")  # no overlap worker to run on
    _place_all(arbitration.rebalance(reason="job low arrived"))
    high = make_job("high", **SPEC | {"priority": 5, "min_rollout_gpus": 4})
    division = arbitration.rebalance(reason="job high arrived")
    assert division.allotted == {low.pk: 0, high.pk: 4}
    tr = planner.plan_job(job_id=low.pk, signal="capacity_change")
    assert tr is not None and run_transition(tr).status == "succeeded"
    assert _rollout(low) == 0 and Job.objects.get(pk=low.pk).status == "running"
    assert "the cluster arbiter allots it 0" in Job.objects.get(pk=low.pk).status_reason
    planner.plan_job(job_id=high.pk, signal="capacity_change")
    run_transition(Transition.objects.filter(job=high).order_by("-id").first())
    assert _rollout(high) == 4


def test_jobs_planned_one_after_the_other_never_pick_the_same_free_gpus():
    _cluster()
    a, b = make_job("a", **SPEC), make_job("b", **SPEC)
    division = arbitration.rebalance(reason="two jobs")
    assert sorted(division.allotted.values()) == [2, 2]
    # the arbiter's task plans a, then b, before a's transition has started its workers
    trs = [planner.plan_job(job_id=j, signal=s) for j, s in division.plan_order]
    assert all(t is not None for t in trs)

    def starts(t: Transition) -> set[tuple[int, int]]:
        rows = TransitionStep.objects.filter(transition=t, kind="start_worker").values_list("args", flat=True)
        return {(r["node"], g) for r in rows for g in r["gpus"]}

    first, second = (starts(t) for t in trs if t is not None)
    assert len(first) == 2 and len(second) == 2 and not first & second
    assert all(run_transition(t).status == "succeeded" for t in trs if t is not None)
    assert (_rollout(a), _rollout(b)) == (2, 2)


def test_the_job_page_carries_the_share_for_its_card(client, django_user_model):
    _cluster()
    a = make_job("a", **SPEC | {"priority": 3, "min_rollout_gpus": 1})
    arbitration.rebalance(reason="job a arrived")
    client.force_login(django_user_model.objects.create_user("viewer", password="x"))
    page = client.get(f"/jobs/{a.pk}/").content.decode()
    assert '"sharing": {"priority": 3, "weight": 1.0, "min_rollout_gpus": 1, "max_rollout_gpus": 4' in page
    assert '"allotted_rollout_gpus": 4, "held_rollout_gpus": 0, "borrows": {}, "lends": {}, "not_lending": ' in page


def test_a_training_phase_change_divides_again_only_where_another_job_shares_the_cluster():
    _cluster()
    a = make_job("a", **SPEC)
    assert plan_queue.phase_arbitration_reason(a, training=True) is None  # alone: nothing to move between jobs
    make_job("b", **SPEC)
    assert plan_queue.phase_arbitration_reason(a, training=True) == "a Training Begin"
    assert plan_queue.phase_arbitration_reason(a, training=False) == "a Training Finished"


def test_a_running_job_left_with_no_capacity_keeps_its_workers_parked():
    # its node is no longer ready (a lapsed lease): the arbiter allots it 0 because there is nothing to allot,
    # not because another job took its units, so the planner keeps its workers for the node's resync
    _cluster()
    a = make_job("a", **SPEC)
    jobs.set_overrides(job_id=a.pk, changes={"borrowing": False}, actor="test")
    _place_all(arbitration.rebalance(reason="job a arrived"))
    assert _rollout(a) == 4
    Node.objects.filter(name="r1").update(status=NodeStatus.NOT_READY)
    division = arbitration.rebalance(reason="capacity change")
    assert division.allotted == {a.pk: 0} and division.capacity_gpus == 0
    assert planner.idle_reason(Job.objects.get(pk=a.pk)) is Idle.NO_CAPACITY
    assert planner.plan_job(job_id=a.pk, signal="capacity_change") is None
    assert _rollout(a) == 4
    assert "the cluster arbiter allots it 0 (no capacity" in Job.objects.get(pk=a.pk).status_reason
    # a job whose units went to a higher-priority guarantee is told so
    Node.objects.filter(name="r1").update(status=NodeStatus.READY)
    make_job("high", **SPEC | {"priority": 5, "min_rollout_gpus": 4})
    assert arbitration.rebalance(reason="job high arrived").allotted[a.pk] == 0
    assert planner.idle_reason(Job.objects.get(pk=a.pk)) is Idle.ELSEWHERE
