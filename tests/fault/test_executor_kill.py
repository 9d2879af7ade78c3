"""The Celery worker that executes a transition is killed (SIGKILL) at each of its phases in turn.

Progress lives in the database and a lease keeps two executors off one transition, so after each
kill a fresh worker's periodic re-plan picks the transition up where it was, once the dead worker's
lease has run out. The agents here are the heartbeat service answering with the desired state
(`agents_converge`), between kills: a step issued by one executor is confirmed to the next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fault.conftest import assert_invariants, wait_for
from tests.support.cluster import agents_converge, make_job, make_node
from tests.support.environment import child_env, redis_available
from tests.support.processes import start_process

# a minute of kills; the crash suite (also `long`) kills the executor mid-transition of a live job
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.long]


def _celery(tmp_path: Path, n: int) -> subprocess.Popen:
    log = tmp_path / f"celery-{n}.log"
    proc = start_process(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "pearl_site",
            "worker",
            "--pool=solo",
            "-l",
            "info",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"kill-{os.getpid()}-{n}@%h",
        ],
        child_env(),
        log,
    )
    wait_for(lambda: "ready." in log.read_text(errors="ignore") or proc.poll() is not None, 60, "celery")
    assert proc.poll() is None, log.read_text()[-3000:]
    return proc


def _phase_of(tr) -> int | None:
    """The executor phase whose steps are issued and waiting for the agents (None: nothing waiting)."""
    from controlplane.models import TransitionStep
    from controlplane.services.executor import _phase

    waiting = [s for s in TransitionStep.objects.filter(transition=tr) if s.status == TransitionStep.Status.RUNNING]
    return min(_phase(s) for s in waiting) if waiting else None


def _kill_at_every_phase(tr, tmp_path: Path, proc: subprocess.Popen, n: int) -> tuple[subprocess.Popen, int, list[int]]:
    """Run `tr` to its end, killing the executing Celery worker each time it waits on the agents."""
    from controlplane import tasks
    from controlplane.models import Transition

    phases: list[int] = []
    while True:
        state = wait_for(
            lambda: (lambda t: t if t.status in ("succeeded", "failed") or _phase_of(t) is not None else None)(
                Transition.objects.get(pk=tr.pk)
            ),
            60,
            "the executor to wait on the agents",
        )
        if state.status in ("succeeded", "failed"):
            return proc, n, phases
        phase = _phase_of(state)
        assert phase is not None
        phases.append(phase)
        proc.send_signal(signal.SIGKILL)  # mid-transition: steps issued, none confirmed
        proc.wait()
        agents_converge()  # the agents carry out what was issued while no executor runs
        n += 1
        proc = _celery(tmp_path, n)
        # the dead executor's lease runs out; the periodic re-plan hands the transition to this worker
        deadline = time.monotonic() + 60
        while (
            _phase_of(Transition.objects.get(pk=tr.pk)) == phase
            and Transition.objects.get(pk=tr.pk).status == "running"
        ):
            assert time.monotonic() < deadline, f"transition {tr.pk} never resumed after the kill at phase {phase}"
            tasks.replan_all.delay()
            agents_converge()
            time.sleep(1.0)


def test_a_transition_completes_whichever_phase_its_executor_is_killed_in(tmp_path):
    if not redis_available():
        pytest.skip("Redis is not reachable")
    from controlplane.models import GPU, Job, Transition, WorkerGPU
    from controlplane.services.draining import drain_node

    make_node("r1", slots=4, hardware="H800")
    make_node("t1", pool="training", slots=2, hardware="H800")
    proc, n = _celery(tmp_path, 0), 0
    try:
        job = make_job(
            "kill-exec",
            model="qwen3-8b",
            hardware="h800",
            tp=1,
            rollout_gpus=4,
            training_gpus=2,
            batch_size=16,
            group_size=4,
        )  # the plan task runs in Celery; its transition too
        first = wait_for(lambda: Transition.objects.filter(job=job).first(), 60, "a first transition")
        proc, n, phases = _kill_at_every_phase(first, tmp_path, proc, n)
        first.refresh_from_db()
        assert first.status == "succeeded", first.steps.values_list("kind", "status")

        # move the job off r1: drains and stops there, starts on r2, each phase again under a kill
        make_node("r2", slots=4, hardware="H800")
        agents_converge()
        node = drain_node(
            node_id=Job.objects.get(pk=job.pk).workers.filter(node__name="r1").first().node_id, actor="test"
        )
        second = wait_for(
            lambda: Transition.objects.filter(job=job).exclude(pk=first.pk).first(), 60, "a second transition"
        )
        proc, n, more = _kill_at_every_phase(second, tmp_path, proc, n)
        second.refresh_from_db()
        assert second.status == "succeeded", second.steps.values_list("kind", "status")
        phases += more
        assert len(set(phases)) >= 3, phases  # killed in bring-up, weight sync, drain/stop phases at least
        assert not Transition.objects.filter(job=job, status__in=["pending", "running"]).exists()

        # no GPU is ever bound to two live workers; the cluster invariants hold
        bound = list(WorkerGPU.objects.filter(alive=True).values_list("gpu_id", "kind"))
        assert len(bound) == len(set(bound))
        assert not GPU.objects.filter(node=node, bindings__alive=True, bindings__kind="rollout").exists()
        assert_invariants()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
