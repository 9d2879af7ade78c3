"""A real Celery worker over Redis (not eager mode), and real row locks on PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.models import Node, Worker
from tests.support.cluster import make_job, make_node
from tests.support.environment import ROOT, child_env, postgres_in_use


@pytest.mark.django_db(transaction=True)
def test_round_trip_through_real_worker(celery_worker_process):
    from controlplane import tasks

    result = tasks.echo.delay({"hello": [1, 2, 3]})
    assert result.get(timeout=30) == {"echo": {"hello": [1, 2, 3]}}


@pytest.mark.django_db(transaction=True)
def test_sweep_task_expires_leases_in_worker_process(celery_worker_process):
    from controlplane import tasks

    n = make_node("n1")
    Node.objects.filter(pk=n.pk).update(lease_expires=timezone.now() - timedelta(seconds=5))
    out = tasks.sweep.delay().get(timeout=30)
    assert out["expired"] == ["n1"]
    n.refresh_from_db()
    assert n.status == "not_ready" and n.epoch == 2


@pytest.mark.django_db(transaction=True)
def test_pickle_messages_refused_by_worker_config():
    from pearl_site.celery import app

    assert set(app.conf.accept_content) == {"json"} and app.conf.task_serializer == "json"


RACE = textwrap.dedent(
    """
    import os, sys, time
    import django
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pearl_site.settings")
    django.setup()
    from controlplane.services.workers import start_worker
    from controlplane.services.errors import ServiceError
    job_id, node_id, go_at = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    while time.time() < go_at:
        time.sleep(0.001)
    try:
        w = start_worker(job_id=job_id, node_id=node_id, gpu_indexes=[0, 1], role="colocated", activity="active")
        print("WON", w.slot)
    except ServiceError as exc:
        print("LOST", type(exc).__name__, exc)
    """
)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_processes_race_for_the_same_gpu_exactly_one_wins():
    if not postgres_in_use():
        pytest.skip("row locks need PostgreSQL (SQLite ignores SELECT ... FOR UPDATE)")
    import time

    n = make_node("n1", slots=2)
    job = make_job()
    for _round in range(5):
        go = time.time() + 1.5
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RACE, str(job.pk), str(n.pk), str(go)],
                cwd=ROOT,
                env=child_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=60) for p in procs]
        results = [next((ln for ln in o[0].splitlines() if ln.startswith(("WON", "LOST"))), o[1][-2500:]) for o in outs]
        assert sorted(r.split()[0] for r in results) == ["LOST", "WON"], results
        assert Worker.objects.filter(alive=True).count() == 1
        Worker.objects.filter(alive=True).update(alive=False)
        from controlplane.models import WorkerGPU

        WorkerGPU.objects.update(alive=False, active=False)


def _drain_kicks(job_id: int) -> None:
    from controlplane.services.dispatch import wait_for_report

    while wait_for_report(job_id, 0.01):
        pass


@pytest.mark.django_db(transaction=True)
def test_an_agent_report_wakes_the_executor_waiting_on_the_job():
    """The executor is woken by the agents' report of a change to the job's workers, not by its poll;
    a report that changes nothing a step is confirmed by wakes nobody; a kick is consumed once."""
    from controlplane.services import executor, planner
    from controlplane.services.dispatch import wait_for_report
    from tests.support.cluster import agents_converge

    make_node("r1", slots=2)
    job = make_job(rollout_gpus=2)
    tr = planner.plan_job(job_id=job.pk, signal="step_start")
    assert executor.execute_transition(transition_id=tr.pk).status == "running"  # workers asked for
    _drain_kicks(job.pk)
    assert not wait_for_report(job.pk, 0.05)
    agents_converge()  # the agent reports the workers running
    assert wait_for_report(job.pk, 10.0)
    assert not wait_for_report(job.pk, 0.05)
    agents_converge()  # the same report again: nothing changed
    assert not wait_for_report(job.pk, 0.05)


@pytest.mark.django_db(transaction=True)
def test_the_executor_task_carries_a_transition_to_its_end_as_agents_report(celery_worker_process):
    import time

    from controlplane.models import Transition
    from controlplane.services import planner
    from tests.support.cluster import agents_converge

    make_node("r1", slots=2)
    job = make_job(rollout_gpus=2)
    tr = planner.plan_job(job_id=job.pk, signal="step_start")  # its task is sent on commit
    deadline = time.monotonic() + 60
    while Transition.objects.get(pk=tr.pk).status in ("pending", "running") and time.monotonic() < deadline:
        agents_converge()
        time.sleep(0.2)
    assert Transition.objects.get(pk=tr.pk).status == "succeeded"
