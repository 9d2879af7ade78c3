"""A user's own Llama directory trains as a job, end to end through real processes only (issue 36): the job is
submitted with `model: /path/to/dir`, the planner places it on the profile derived from the directory's
config.json, the node agents start `python -m agents.worker --model DIR` and the trainer on the directory, the
rollout driver runs calculator episodes through its chat template, and GRPO updates are published and pulled."""

from __future__ import annotations

import pytest

from tests.integration.agents.test_agents_via_control_plane import start_agent
from tests.integration.agents.test_control_plane_link import wait_for
from tests.support.hf_models import model_dir
from tests.support.processes import stop_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.long]


def test_a_llama_directory_trains_as_a_job(control_plane_server, celery_worker_process, tmp_path):
    from controlplane.models import Job, TelemetrySample, Transition, Worker
    from controlplane.services.jobs import create_job

    path = str(model_dir(tmp_path / "models", "llama"))
    cp = control_plane_server
    agents = [
        start_agent(cp, "train-own", "training", 1, "torch", tmp_path),
        start_agent(cp, "roll-own", "reserved", 2, "torch", tmp_path),
    ]
    try:
        for name in ("train-own", "roll-own"):
            wait_for(lambda n=name: _heartbeat(n) or None, what=name)
        job = create_job(
            spec={
                "name": "own-llama",
                "model": path,
                "engine": "torch",
                "hardware": "cpu",
                "environment": "calculator",
                "tp": 1,
                "batch_size": 8,
                "group_size": 4,
                "rollout_gpus": 2,
                "training_gpus": 1,
                "max_staleness": 1,
            },
            actor="test",
        )
        wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 2, timeout=240, what="two GRPO updates")
        job = Job.objects.get(pk=job.pk)
        assert job.status == "running" and job.model == path
        assert not Transition.objects.filter(job=job, status="failed").exists()
        assert Worker.objects.filter(job=job, role="training").exists()
        # turns were served by the directory's model: the engines' TURN records came back
        wait_for(lambda: TelemetrySample.objects.filter(job=job, kind="turn").exists(), timeout=60, what="TURNs")
    finally:
        stop_processes(agents, grace_s=60)


def _heartbeat(name: str) -> bool:
    from controlplane.models import Node

    return Node.objects.filter(name=name, last_heartbeat__isnull=False).exists()
