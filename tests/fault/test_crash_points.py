"""The crash suite (issue 34, item 3): a live job (emulated engines and trainer, the fault stack: Redis, Daphne, a
Celery worker with beat, node agents) killed at a named point of its step by the process itself
(`PEARL_CRASH_AT`, `agents/crash.py`: SIGKILL, once, after the point passed once), then restarted by its node
agent; afterwards the exactly-once invariants hold (`_assert_exactly_once`, from the trainer's audit: each
step's update committed once, consecutive weight versions, no trajectory trained twice, each batch slot once
per step, what was durable at the kill trained in its step and not regenerated, the task cursor where its
step says) and the trainer's checkpoint is the one a run without a crash has at the same step (the emulated
trainer's whole state: its version, updates and which step published each version, compared exactly).
No process of the stack outlives it (the `stack` fixture's check).

A second test SIGKILLs a whole process mid-rollout (a step with some trajectories durable at the trainer,
others in flight) and starts it again: Daphne (the control plane alone), Redis, the Celery worker with beat, the
rollout node's agent, or PostgreSQL (a private cluster the test starts as the postgres OS user,
`tests/fault/private_postgres.py`, skipped without root or Debian's PostgreSQL server binaries; the stack on
production's persistent connections; killed with its postmaster, back after `DATABASE_AWAY_S`, and afterwards no
database error in Daphne's or Celery's log while the job trains one more step); the same checks after. A third
kills the Celery worker mid-transition of a live job (a drained rollout node returned mid-rollout, its worker's
start issued and not yet confirmed: test_executor_kill.py's moment), then the transition must succeed and the
same checks hold. The driver alone, the training node and the whole stack are killed so in
test_exactly_once.py; the executor at every phase of a transition in test_executor_kill.py (without a live job
and these checks). Not covered: PostgreSQL killed at a named point of the step (only mid-rollout) or while a
transition runs, the executor killed in a drain or weight-sync phase of a live job (only a start), and a torch
trainer's checkpoint compared bit for bit.

The default suite runs the diagonal (`DIAGONAL`: one point in the driver, one in the trainer;
`PROCESS_DIAGONAL`: Daphne and PostgreSQL) and the mid-transition kill, about 6.5 min here; `PEARL_CRASH_MATRIX=1`
runs all five points and all five processes (about 8 min more on this 2-core machine, each passed on 2026-12-06)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from agents.crash import POINTS
from tests.fault.conftest import wait_for
from tests.fault.test_exactly_once import BATCH, TIME_FACTOR, _assert_exactly_once, _buffered, _ckpt, _job
from tests.fault.test_faults import registered

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.replan_every(2)]

DIAGONAL = ("driver.before_training_begin", "trainer.after_commit")


def _emulated_checkpoint(ckpt: Path) -> dict:
    return json.loads((ckpt / "emulated.json").read_text())


@pytest.mark.parametrize("point", sorted(POINTS))
def test_a_job_killed_at_a_named_point_resumes_exactly_once(stack, point: str) -> None:
    if point not in DIAGONAL and os.environ.get("PEARL_CRASH_MATRIX") != "1":
        pytest.skip("off the diagonal: PEARL_CRASH_MATRIX=1 runs every crash point")
    from controlplane.models import Job

    flag = stack.tmp / "crashed"
    crash = {"PEARL_CRASH_AT": point, "PEARL_CRASH_FLAG": str(flag), "PEARL_CRASH_AFTER": "1"}
    stack.agent("train-c", pool="training", slots=1, time_factor=TIME_FACTOR, **crash)
    stack.agent("roll-c", slots=2, time_factor=TIME_FACTOR)
    for name in ("train-c", "roll-c"):
        registered(name)
    job = _job("crash")
    ckpt = wait_for(lambda: _ckpt(stack, "train-c", job.name), 120, "the trainer's checkpoint directory")
    wait_for(flag.exists, 180, f"the crash at {point}")
    buffered = _buffered(ckpt)  # what the trainer held at the kill (the killed process is not back yet)
    step = min(buffered) if buffered else Job.objects.get(pk=job.pk).weight_version
    durable = buffered.get(step, set())
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= step + 2, 180, "two updates after the crash")

    _assert_exactly_once(ckpt, job, step, durable)
    updates = [json.loads(line) for line in (ckpt / "updates.jsonl").read_text().splitlines()]
    assert all(len(u["trajectories"]) == BATCH for u in updates)
    state = _emulated_checkpoint(ckpt)  # a run with no crash, after as many updates, holds exactly this
    n = state["version"]
    assert state["steps"] == n and state["trained_steps"] == {str(j): j + 1 for j in range(n)}
    assert len(updates) >= n - 1  # the audit follows the checkpoint (at most the update in flight behind)


PROCESSES = ("daphne", "redis", "celery", "rollout-agent", "postgres")
PROCESS_DIAGONAL = ("daphne", "postgres")
DATABASE_AWAY_S = 3.0  # how long the killed PostgreSQL stays down: the lease (3 s) lapses meanwhile


def _restart(stack, which: str) -> None:
    """SIGKILL one process of the stack mid-step and start it again as the launcher would."""
    from tests.support.processes import wait_port

    if which == "rollout-agent":
        stack.kill9("agent-roll-c")
        stack.agent("roll-c", slots=2, time_factor=TIME_FACTOR)
        return
    if which == "redis":
        stack.kill9("redis")
        stack.start_redis()
        return
    if which == "postgres":
        from django.db import connection

        assert stack.postgres is not None
        stack.postgres.kill9()
        time.sleep(DATABASE_AWAY_S)  # heartbeats, both links, the sweeper and the planner find it gone
        stack.postgres.start()
        connection.close()  # this process's connection died with the server
        return
    argv = list(stack.procs[which].args)
    ready_before = stack.log("celery").count("ready.")
    stack.kill9(which)
    stack.start(which, argv)
    if which == "daphne":
        wait_port(int(stack.base_url.rsplit(":", 1)[1]), proc=stack.procs["daphne"])
    else:
        wait_for(lambda: stack.log("celery").count("ready.") > ready_before, 60, "celery again")


@pytest.mark.parametrize(
    "which", [pytest.param(w, marks=pytest.mark.private_postgres) if w == "postgres" else w for w in PROCESSES]
)
def test_a_process_of_the_control_plane_or_a_rollout_node_killed_mid_rollout(stack, which: str) -> None:
    """The control plane alone (Daphne: both links drop), Redis (leases, channel layer, plan queue emptied),
    the Celery worker with beat, the rollout node's agent (its workers die with it), or PostgreSQL (every
    process's connections drop; nothing can be recorded while it is away), SIGKILLed while a step
    has some trajectories durable at the trainer and others in flight, then started again: the same checks."""
    if which not in PROCESS_DIAGONAL and os.environ.get("PEARL_CRASH_MATRIX") != "1":
        pytest.skip("off the diagonal: PEARL_CRASH_MATRIX=1 runs every process")
    from controlplane.models import Job
    from tests.fault.test_exactly_once import _just_finished

    stack.agent("train-c", pool="training", slots=1, time_factor=TIME_FACTOR)
    stack.agent("roll-c", slots=2, time_factor=TIME_FACTOR)
    for name in ("train-c", "roll-c"):
        registered(name)
    job = _job("crash-process")
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 1, 120, "a first update")
    ckpt = _ckpt(stack, "train-c", job.name)
    assert ckpt is not None
    step, _ = wait_for(lambda: _just_finished(ckpt), 90, "a step with some trajectories finished")
    _restart(stack, which)
    durable = _buffered(ckpt).get(step, set())
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= step + 2, 180, "two updates after the kill")

    _assert_exactly_once(ckpt, job, step, durable)
    state = _emulated_checkpoint(ckpt)
    n = state["version"]
    assert state["steps"] == n and state["trained_steps"] == {str(j): j + 1 for j in range(n)}
    assert all(stack.procs[p].poll() is None for p in ("daphne", "celery")), "a server did not survive the kill"
    if which == "postgres":  # its errors stopped with the outage: none while the job trains one more step
        sizes = {p: (stack.tmp / f"{p}.log").stat().st_size for p in ("daphne", "celery")}
        wait_for(lambda: Job.objects.get(pk=job.pk).weight_version > n, 120, "one more update")
        for p, size in sizes.items():
            with open(stack.tmp / f"{p}.log", "rb") as f:
                f.seek(size)
                assert b"OperationalError" not in f.read(), f"{p} still fails on the database: {stack.log(p)}"


def _waiting_transition(job):
    """A transition of `job` whose executor has issued steps and waits on the agents (test_executor_kill's
    moment: the Celery worker is inside the executor task)."""
    from controlplane.models import Transition
    from tests.fault.test_executor_kill import _phase_of

    return next((t for t in Transition.objects.filter(job=job, status="running") if _phase_of(t) is not None), None)


def test_the_celery_worker_killed_mid_transition_of_a_live_job(stack) -> None:
    """A rollout node of a job is drained mid-rollout (a step with some trajectories durable at the trainer)
    and returned to service; the Celery worker is SIGKILLed while the transition that starts the job's worker
    there again waits on its agent, and started again: the transition completes under a fresh executor (the
    dead one's lease runs out, the periodic re-plan hands it on) and the same checks hold."""
    from controlplane.models import Job, Transition, Worker
    from controlplane.services.draining import drain_node, undrain_node
    from tests.fault.test_exactly_once import _just_finished

    stack.agent("train-c", pool="training", slots=1, time_factor=TIME_FACTOR)
    for name in ("roll-c", "roll-d"):
        stack.agent(name, slots=1, time_factor=TIME_FACTOR)
    nodes = {name: registered(name) for name in ("train-c", "roll-c", "roll-d")}
    job = _job("crash-transition")
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 1, 120, "a first update")
    ckpt = _ckpt(stack, "train-c", job.name)
    assert ckpt is not None
    step, durable = wait_for(lambda: _just_finished(ckpt), 90, "a step with some trajectories finished")

    drain_node(node_id=nodes["roll-d"].pk, actor="test")
    wait_for(
        lambda: (
            not Worker.objects.filter(job=job, node=nodes["roll-d"], alive=True).exists()
            and not Transition.objects.filter(job=job, status__in=["pending", "running"]).exists()
        ),
        90,
        "the drained node's worker stopped",
    )
    before = set(Transition.objects.filter(job=job).values_list("pk", flat=True))
    undrain_node(node_id=nodes["roll-d"].pk, actor="test")
    tr = wait_for(
        lambda: (lambda t: t if t is not None and t.pk not in before else None)(_waiting_transition(job)),
        90,
        "the returned node's transition waiting on its agent",
    )
    _restart(stack, "celery")
    wait_for(lambda: Transition.objects.get(pk=tr.pk).status in ("succeeded", "failed"), 90, "the transition's end")
    assert Transition.objects.get(pk=tr.pk).status == "succeeded", list(tr.steps.values_list("kind", "status"))
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= step + 2, 180, "two updates after the kill")

    _assert_exactly_once(ckpt, job, step, durable)
    state = _emulated_checkpoint(ckpt)
    n = state["version"]
    assert state["steps"] == n and state["trained_steps"] == {str(j): j + 1 for j in range(n)}
