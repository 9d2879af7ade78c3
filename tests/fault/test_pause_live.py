"""Pause and resume a live job (issue 34, item 2): real Daphne, Celery, node agents with emulated engines, the
trainer and the rollout driver. The job is paused through the API mid-rollout, with some of its step's
trajectories finished and others running: its rollout workers drain and are released (rows, GPU bindings and
the agent's processes), its trainer and driver stay, and nothing moves while it is paused; resumed, it goes on
at the same step and weight version, and the trainer's audit shows the step trained exactly once with every
trajectory that had finished, none of them run again (no trajectory lost, none trained twice)."""

from __future__ import annotations

import json
import time

import pytest

from tests.fault.conftest import assert_invariants, record_timing, wait_for
from tests.fault.test_exactly_once import BATCH, _assert_exactly_once, _buffered, _ckpt, _job, _just_finished
from tests.fault.test_faults import registered

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.replan_every(2)]

TIME_FACTOR = 0.2  # emulated H800 time x0.2: a step's trajectories finish over seconds, not all at once


def _operator():
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(User.objects.create_user("pauser", is_staff=True))
    return api


def _released(job, node: str) -> bool:
    """No rollout worker of the job on `node`: no live row, no GPU binding, no process its agent reports."""
    from controlplane.models import Node, Worker, WorkerGPU

    n = Node.objects.get(name=node)
    return (
        not Worker.objects.filter(job=job, node=n, alive=True).exists()
        and not WorkerGPU.objects.filter(gpu__node=n, alive=True).exists()
        and not [o for o in n.observed or [] if o.get("state") in ("starting", "running", "draining")]
    )


def test_a_job_paused_mid_rollout_releases_its_rollout_workers_and_resumes_its_step(stack):
    from controlplane.models import Event, Job, Worker

    stack.agent("train-p", pool="training", slots=1, time_factor=TIME_FACTOR)
    stack.agent("roll-p", slots=2, time_factor=TIME_FACTOR)
    for name in ("train-p", "roll-p"):
        registered(name)
    job = _job("pausable")
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 1, 120, "a first update")
    ckpt = _ckpt(stack, "train-p", job.name)
    assert ckpt is not None
    trainer = Worker.objects.get(job=job, alive=True, role="training")

    step, _ = wait_for(lambda: _just_finished(ckpt), 90, "a step with some trajectories finished")
    api = _operator()
    t0 = time.monotonic()
    r = api.post(f"/api/jobs/{job.pk}/pause/")
    assert r.status_code == 200 and r.json()["status"] == "paused", r.content
    durable = _buffered(ckpt).get(step, set())  # what the trainer acknowledged when the pause came
    assert 0 < len(durable) < BATCH
    wait_for(lambda: _released(job, "roll-p"), 60, "the rollout workers released")
    released_s = time.monotonic() - t0
    # the trainer stays and, with it, the driver; an update in progress finishes: then nothing moves
    wait_for(lambda: not Job.objects.get(pk=job.pk).training_active, 60, "the update in progress finished")
    time.sleep(1.0)
    before, buffered = Job.objects.get(pk=job.pk), _buffered(ckpt)
    time.sleep(3.0)
    paused = Job.objects.get(pk=job.pk)
    assert paused.status == "paused" and (paused.step, paused.weight_version) == (before.step, before.weight_version)
    assert _buffered(ckpt) == buffered  # no rollout while paused
    assert Worker.objects.get(pk=trainer.pk).alive
    assert_invariants()

    t1 = time.monotonic()
    r = api.post(f"/api/jobs/{job.pk}/resume/")
    assert r.status_code == 200 and r.json()["status"] == "running", r.content
    wait_for(lambda: _buffered(ckpt) != buffered, 60, "a trajectory finished after the resume")
    rollout_back_s = time.monotonic() - t1
    record_timing("job_pause_resume", released_s=released_s, rollout_back_s=rollout_back_s)
    print(
        f"released {released_s:.1f} s after the pause (step {step}: {len(durable)} of {BATCH} durable then); "
        f"a trajectory finished {rollout_back_s:.1f} s after the resume"
    )
    assert r.json()["step"] == before.step and r.json()["weight_version"] == before.weight_version
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= max(before.weight_version, step) + 2, 150, "updates")
    assert Worker.objects.get(pk=trainer.pk).alive  # the same trainer throughout
    kinds = list(Event.objects.filter(job=job, kind__in=["job.paused", "job.resumed"]).values_list("kind", "actor"))
    assert sorted(kinds) == [("job.paused", "pauser"), ("job.resumed", "pauser")]
    _assert_exactly_once(ckpt, job, step, durable)
    updates = [json.loads(line) for line in (ckpt / "updates.jsonl").read_text().splitlines()]
    paused_step = next(u for u in updates if u["step"] == step)
    # the driver never restarted: no trajectory of the step, finished or in flight at the pause, was started over
    assert not [t for t in paused_step["trajectories"] if "-r" in t], paused_step
