"""Live agentic RL end to end, through real processes only: Daphne, a Celery worker, two node agents
with torch engines and a torch trainer, and the job's rollout driver (started by the training node's
agent). Creating the job is all the test does: the planner places it, the executor starts the workers
as the agents confirm them, the driver runs the core loop — calculator environments, turns on the
engines, GRPO updates on the trainer, weights published and pulled — and reports to the control plane."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.integration.agents.test_agents_via_control_plane import start_agent
from tests.integration.agents.test_control_plane_link import wait_for
from tests.support.processes import stop_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _driver_pids(job: str) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"agents.driver .*--job {job}"], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


def _records(job, kind: str) -> list[dict]:
    """The job's records of one kind as full dicts (the wire form omits fields at their default)."""
    from controlplane.core.telemetry import TelemetryRecord
    from controlplane.models import TelemetrySample

    return [
        TelemetryRecord.from_json(r).as_dict()
        for r in TelemetrySample.objects.filter(job=job, kind=kind).order_by("id").values_list("record", flat=True)
    ]


def test_a_job_trains_live_and_survives_a_driver_kill(control_plane_server, celery_worker_process, tmp_path):
    from controlplane.models import Event, Job, Node, Transition
    from controlplane.services.jobs import create_job

    cp = control_plane_server
    agents = [
        start_agent(cp, "train-live", "training", 1, "torch", tmp_path),
        start_agent(cp, "roll-live", "reserved", 2, "torch", tmp_path),
    ]
    try:
        for name in ("train-live", "roll-live"):
            wait_for(lambda n=name: Node.objects.filter(name=n, last_heartbeat__isnull=False).first(), what=name)
        job = create_job(
            spec={
                "name": "calc-live",
                "model": "tiny",
                "engine": "torch",
                "hardware": "cpu",
                "environment": "calculator",
                "tp": 1,
                "batch_size": 16,
                "group_size": 8,
                "rollout_gpus": 2,
                "training_gpus": 1,
                "max_staleness": 1,
            },
            actor="test",
        )
        # the planner placed it, the agents confirmed the workers, the driver runs the loop and trains
        wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 2, timeout=240, what="two GRPO updates")
        assert Job.objects.get(pk=job.pk).status == "running"
        assert Transition.objects.filter(job=job, status="succeeded").exists()
        assert not Transition.objects.filter(job=job, status="failed").exists()
        (pid,) = wait_for(lambda: _driver_pids("calc-live") or None, what="the driver process")

        # kill -9 the driver mid-run: its agent restarts it; it resumes from the control plane's checkpoint
        before = Job.objects.get(pk=job.pk)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: [p for p in _driver_pids("calc-live") if p != pid] or None, timeout=60, what="a new driver")
        wait_for(
            lambda: Job.objects.get(pk=job.pk).weight_version >= before.weight_version + 2,
            timeout=240,
            what="training goes on after the driver restart",
        )

        # the driver reports TRAIN once it sees the published version (its telemetry is flushed every 0.5 s)
        wait_for(
            lambda: len(_records(job, "train")) >= 3 and len(_records(job, "step")) >= 3,
            timeout=60,
            what="the updates' TRAIN and STEP records",
        )
        steps = _records(job, "step")
        trains = _records(job, "train")
        # every update trained a full batch once: no step trained twice, versions rise one by one
        versions = [t["weight_version"] for t in trains]
        assert versions == sorted(set(versions)) and versions == list(range(versions[0], versions[0] + len(versions)))
        assert all(s["batch_size"] == 16 and s["makespan_s"] > 0 for s in steps), steps
        assert len({s["step"] for s in steps}) == len(steps)  # one STEP record per step, none repeated
        assert all(t["return_latency_s"] <= t["return_deadline_s"] for t in trains), trains
        assert Event.objects.filter(
            job=job, kind="training.begin"
        ).exists()  # (a collected batch goes straight into the next update)
        assert Event.objects.filter(job=job, kind="training.update").count() >= 3
        # the driver's checkpoint is written at most every CHECKPOINT_EVERY_S, so it may trail the version
        wait_for(
            lambda: (Job.objects.get(pk=job.pk).loop_state or {}).get("version", 0) >= 2,
            timeout=30,
            what="a checkpoint holding the second update",
        )
        assert Job.objects.get(pk=job.pk).step >= 3
    finally:
        stop_processes(agents, grace_s=60)
        assert _driver_pids("calc-live") == []  # drivers stop with their agent
