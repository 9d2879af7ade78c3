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
others in flight) and starts it again: Daphne (the control plane alone), Redis, the Celery worker with beat, or
the rollout node's agent; the same checks after. The driver alone, the training node and the whole stack are
killed so in test_exactly_once.py, the executor mid-transition in test_executor_kill.py (without these checks).
Not covered: PostgreSQL (the tests run on the shared server or SQLite; nothing here may kill it), a kill
mid-transition with these checks, and a torch trainer's checkpoint compared bit for bit.

The default suite runs the diagonal (`DIAGONAL`: one point in the driver, one in the trainer;
`PROCESS_DIAGONAL`: Daphne), about 3.5 min here; `PEARL_CRASH_MATRIX=1` runs all five points and all four
processes (about 8 min more on this 2-core machine, each passed on 2026-12-06)."""

from __future__ import annotations

import json
import os
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


PROCESSES = ("daphne", "redis", "celery", "rollout-agent")
PROCESS_DIAGONAL = ("daphne",)


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
    argv = list(stack.procs[which].args)
    ready_before = stack.log("celery").count("ready.")
    stack.kill9(which)
    stack.start(which, argv)
    if which == "daphne":
        wait_port(int(stack.base_url.rsplit(":", 1)[1]), proc=stack.procs["daphne"])
    else:
        wait_for(lambda: stack.log("celery").count("ready.") > ready_before, 60, "celery again")


@pytest.mark.parametrize("which", PROCESSES)
def test_a_process_of_the_control_plane_or_a_rollout_node_killed_mid_rollout(stack, which: str) -> None:
    """The control plane alone (Daphne: both links drop), Redis (leases, channel layer, plan queue emptied),
    the Celery worker with beat, or the rollout node's agent (its workers die with it), SIGKILLed while a step
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
