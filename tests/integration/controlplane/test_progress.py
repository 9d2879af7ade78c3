"""The control plane learns the rollout loop's progress, signals and checkpoint (services/progress.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from controlplane.core import loop as lp
from controlplane.core.state import Role
from controlplane.models import Decision, Event, Job
from controlplane.services import planner, progress
from controlplane.services.errors import Conflict, InvalidInput
from tests.support.cluster import make_job, make_node
from tests.unit.core.loop_world import ToyWorld, run_heap

pytestmark = pytest.mark.django_db


def _job(**kw: Any) -> Job:
    make_node("r1", slots=4, hardware="H800")
    make_node("t1", pool="training", slots=4, hardware="H800")
    spec: dict[str, Any] = {
        "rollout_gpus": 4,
        "training_gpus": 4,
        "tp": 2,
        "model": "qwen3-8b",
        "hardware": "h800",
        "batch_size": 64,
        "group_size": 16,
    }
    return make_job(**(spec | kw))


def test_progress_feeds_R_into_the_borrowing_gate():
    job = _job()
    progress.report_progress(job_id=job.pk, step=3, remaining=2)
    job.refresh_from_db()
    assert (job.step, job.remaining) == (3, 2)
    planner.plan_job(job_id=job.pk, signal="step_start")
    gate_note = Decision.objects.get(job=job).profile["gate"]
    assert "2/64" in gate_note  # (R/B) with the reported R, not B
    with pytest.raises(Conflict):
        progress.report_progress(job_id=job.pk, step=2, remaining=10)  # an older step
    with pytest.raises(InvalidInput):
        progress.report_progress(job_id=job.pk, step=3, remaining=65)
    progress.report_progress(job_id=job.pk, step=3, remaining=1)  # a restarted driver repeats its step


def test_training_signals_change_the_training_state():
    job = _job()
    progress.report_signal(job_id=job.pk, signal="training_begin", remaining=0, actor="driver:test")
    assert Job.objects.get(pk=job.pk).training_active
    assert Event.objects.filter(job=job, kind="training.begin").exists()
    progress.report_signal(job_id=job.pk, signal="training_finished", remaining=64, actor="driver:test")
    assert not Job.objects.get(pk=job.pk).training_active
    with pytest.raises(InvalidInput):
        progress.report_signal(job_id=job.pk, signal="reboot", remaining=0, actor="driver:test")


def test_the_loop_checkpoint_round_trips_and_garbage_is_refused():
    job = _job(batch_size=8, group_size=4)
    config = progress.loop_config(job)
    loop, _ = run_heap(ToyWorld({0: Role.COLOCATED, 1: Role.COLOCATED}), config, [], until=3.0)
    assert loop.rollout_active and 0 < loop.remaining < 8
    progress.save_loop_checkpoint(job_id=job.pk, state=json.loads(json.dumps(loop.checkpoint())))
    back = progress.restore_loop(job_id=job.pk)
    assert (back.step, back.version, back.remaining, back.started_trajectories) == (
        loop.step,
        loop.version,
        loop.remaining,
        loop.started_trajectories,
    )
    for bad in ({}, {"version": "x"}, {**loop.checkpoint(), "trainer": "dancing"}, {**loop.checkpoint(), "steps": [1]}):
        with pytest.raises(InvalidInput):
            progress.save_loop_checkpoint(job_id=job.pk, state=bad)
    assert isinstance(progress.restore_loop(job_id=job.pk), lp.RolloutLoop)
