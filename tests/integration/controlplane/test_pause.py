"""Pause and resume (issue 34): a paused job gives its rollout GPUs back (drained first), keeps its trainer,
driver, checkpoint and records, and runs again where it was; a bad transition is a 409 that changes nothing."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from controlplane.core.state import Activity
from controlplane.models import Event, Job, TransitionStep, Worker, WorkerGPU
from controlplane.selectors.cluster import desired_state
from controlplane.selectors.jobs import live_job_ids
from controlplane.services import jobs, planner
from tests.support.cluster import make_job, make_node, run_transition

pytestmark = pytest.mark.django_db


def _running_job() -> Job:
    """A job on 2 dedicated workers and 2 borrowed overlap workers (ungated: every idle training GPU lent)."""
    make_node("r1", slots=4, hardware="H800")
    make_node("t1", pool="training", slots=4, hardware="H800")
    job = make_job(
        rollout_gpus=4,
        training_gpus=4,
        tp=2,
        model="qwen3-8b",
        hardware="h800",
        batch_size=64,
        group_size=16,
        policy_options={"gate": False},
    )
    assert run_transition(planner.plan_job(job_id=job.pk, signal="step_start")).status == "succeeded"
    job.refresh_from_db()
    assert job.status == "running" and len(_serving(job)) == 4
    Job.objects.filter(pk=job.pk).update(step=3, weight_version=2)  # where the driver's loop is
    return Job.objects.get(pk=job.pk)


def _serving(job: Job) -> list[Worker]:
    return list(Worker.objects.filter(job=job, alive=True, activity=Activity.ACTIVE).exclude(role="training"))


def _rollout_bindings(job: Job) -> int:
    return WorkerGPU.objects.filter(worker__job=job, alive=True, kind="rollout", active=True).count()


def test_pause_releases_the_rollout_workers_drained_first_and_resume_places_them_again(api):
    job = _running_job()
    trainers = set(Worker.objects.filter(job=job, alive=True, role="training").values_list("pk", flat=True))
    r = api.post(f"/api/jobs/{job.pk}/pause/")
    assert r.status_code == 200 and r.json()["status"] == "paused"
    paused = Event.objects.get(job=job, kind="job.paused")
    assert paused.actor == "op" and paused.data == {"step": 3, "weight_version": 2}

    tr = planner.plan_job(job_id=job.pk, signal="capacity_change")
    assert tr is not None and tr.decision_id is None and tr.plan["target"] == "paused"
    kinds = list(TransitionStep.objects.filter(transition=tr).order_by("index").values_list("kind", "worker_slot"))
    for kind, slot in kinds:  # every removal is drained first: a turn in flight finishes or comes back as a prefix
        if kind in ("stop_worker", "deactivate_overlap"):
            assert ("drain", slot) in kinds[: kinds.index((kind, slot))]
    assert run_transition(tr).status == "succeeded"
    job.refresh_from_db()
    assert job.status == "paused" and (job.n_prefill, job.n_decode, job.n_colocated) == (0, 0, 0)
    assert _serving(job) == [] and _rollout_bindings(job) == 0
    assert not Worker.objects.filter(job=job, alive=True, zone="rollout").exists()  # dedicated GPUs given back
    asleep = Worker.objects.filter(job=job, alive=True, zone="overlap").exclude(role="training")
    assert len(asleep) == 2 and {w.activity for w in asleep} == {Activity.INACTIVE}
    # the trainer stays (its checkpoint and step buffer are on its node), and so does the driver it hosts
    assert set(Worker.objects.filter(job=job, alive=True, role="training").values_list("pk", flat=True)) == trainers
    assert [d.job for d in desired_state(Worker.objects.get(pk=min(trainers)).node).drivers] == [job.name]
    assert planner.plan_job(job_id=job.pk, signal="step_start") is None  # the driver's signals place nothing
    assert planner.plan_job(job_id=job.pk) is None
    assert job.pk in live_job_ids()  # the periodic re-plan retries a release that did not finish

    r = api.post(f"/api/jobs/{job.pk}/resume/")
    assert r.status_code == 200 and r.json()["status"] == "running"
    resumed = Event.objects.get(job=job, kind="job.resumed")
    assert resumed.actor == "op" and resumed.data == {"step": 3, "weight_version": 2}
    assert run_transition(planner.plan_job(job_id=job.pk, signal="capacity_change")).status == "succeeded"
    job.refresh_from_db()
    assert job.status == "running" and len(_serving(job)) == 4
    assert (job.step, job.weight_version) == (3, 2)  # where it was
    assert set(Worker.objects.filter(job=job, alive=True, role="training").values_list("pk", flat=True)) == trainers


def test_a_pause_during_a_transition_releases_once_it_ends(api):
    job = _running_job()
    Worker.objects.filter(job=job, alive=True, zone="overlap").exclude(role="training").update(
        activity=Activity.INACTIVE
    )
    WorkerGPU.objects.filter(worker__job=job, kind="rollout", worker__zone="overlap").update(active=False)
    tr = planner.plan_job(job_id=job.pk, signal="step_start")  # lends them again: in flight when the pause comes
    assert tr is not None
    assert api.post(f"/api/jobs/{job.pk}/pause/").status_code == 200
    assert planner.plan_job(job_id=job.pk, signal="capacity_change") is None  # deferred: one transition at a time
    run_transition(tr)
    release = planner.plan_job(job_id=job.pk, signal="capacity_change")
    assert run_transition(release).status == "succeeded"
    assert _serving(Job.objects.get(pk=job.pk)) == []


def test_a_paused_job_can_be_stopped_and_every_worker_goes(api):
    job = _running_job()
    jobs.pause_job(job_id=job.pk, actor="test")
    run_transition(planner.plan_job(job_id=job.pk, signal="capacity_change"))
    assert api.post(f"/api/jobs/{job.pk}/stop/").json()["status"] == "stopped"
    assert not Worker.objects.filter(job=job, alive=True).exists()
    assert job.pk not in live_job_ids()


@pytest.mark.parametrize(
    ("status", "action", "why"),
    [
        ("pending", "pause", "job job1 is pending; only a running job can be paused"),
        ("paused", "pause", "job job1 is paused; only a running job can be paused"),
        ("stopped", "pause", "job job1 is already stopped; it cannot be paused"),
        ("failed", "pause", "job job1 is already failed; it cannot be paused"),
        ("running", "resume", "job job1 is running; only a paused job can be resumed"),
        ("pending", "resume", "job job1 is pending; only a paused job can be resumed"),
        ("stopped", "resume", "job job1 is already stopped; it cannot be resumed"),
    ],
)
def test_a_bad_transition_is_a_409_naming_the_status_and_changes_nothing(api, status, action, why):
    make_node("r1", slots=4)
    job = make_job()
    Job.objects.filter(pk=job.pk).update(status=status)
    events = Event.objects.count()
    r = api.post(f"/api/jobs/{job.pk}/{action}/")
    assert r.status_code == 409, r.content
    assert r.json()["error"] == "conflict" and r.json()["field"] == "status" and r.json()["detail"] == why
    assert Job.objects.get(pk=job.pk).status == status and Event.objects.count() == events


def test_pause_and_resume_of_a_missing_or_malformed_job(api):
    assert api.post("/api/jobs/999/pause/").status_code == 404
    assert api.post("/api/jobs/999/resume/").status_code == 404
    r = api.post("/api/jobs/x1/pause/")
    assert r.status_code == 400 and r.json()["field"] == "id"


def test_only_operators_pause_and_resume(viewer):
    make_node("r1", slots=4)
    job = make_job()
    Job.objects.filter(pk=job.pk).update(status="running")
    c = APIClient()
    c.force_authenticate(viewer)
    assert c.post(f"/api/jobs/{job.pk}/pause/").status_code == 403
    Job.objects.filter(pk=job.pk).update(status="paused")
    assert c.post(f"/api/jobs/{job.pk}/resume/").status_code == 403
    assert APIClient().post(f"/api/jobs/{job.pk}/resume/").status_code in (401, 403)
    assert Job.objects.get(pk=job.pk).status == "paused"
    assert not Event.objects.filter(kind__in=["job.paused", "job.resumed"]).exists()


def test_the_update_in_progress_finishes_while_paused():
    """Paused at Training Begin: the borrowed workers are back, the update is granted and Training Finished is
    taken; the release goes on beside it and places nothing, whatever signal the driver sends."""
    from tests.support.cluster import agents_converge

    job = _running_job()
    jobs.set_training_active(job_id=job.pk, active=True)  # the borrowed workers return at once
    jobs.pause_job(job_id=job.pk, actor="test")
    assert run_transition(planner.plan_job(job_id=job.pk, signal="training_begin")).status == "succeeded"
    agents_converge()
    jobs.start_update(job_id=job.pk)  # the trainer computes: a paused job's update is not held back
    trainers = Worker.objects.filter(job=job, alive=True, role="training")
    assert {w.activity for w in trainers} == {Activity.ACTIVE}
    jobs.set_training_active(job_id=job.pk, active=False)
    assert planner.plan_job(job_id=job.pk, signal="training_finished") is None
    assert planner.plan_job(job_id=job.pk, signal="step_start") is None
    job.refresh_from_db()
    assert job.status == "paused" and not job.training_active and _serving(job) == []
