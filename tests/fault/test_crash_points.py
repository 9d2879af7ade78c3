"""The crash suite (issue 34, item 3): a live job (emulated engines and trainer, the fault stack: Redis, Daphne, a
Celery worker with beat, node agents) killed at a named point of its step by the process itself
(`PEARL_CRASH_AT`, `agents/crash.py`: SIGKILL, once, after the point passed once), then restarted by its node
agent; afterwards the exactly-once invariants hold (`_assert_exactly_once`, from the trainer's audit: each
step's update committed once, consecutive weight versions, no trajectory trained twice, each batch slot once
per step, what was durable at the kill trained in its step and not regenerated, the task cursor where its
step says) and the trainer's checkpoint is the one a run without a crash has at the same step (the emulated
trainer's whole state: its version, updates and which step published each version, compared exactly).
No process of the stack outlives it (the `stack` fixture's check).

The default suite runs one point per process (the diagonal: `DIAGONAL`); `PEARL_CRASH_MATRIX=1` runs every
point. The kills of whole processes (the driver mid-rollout, the training node, the whole stack) are in
test_exactly_once.py, the executor's in test_executor_kill.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agents.crash import POINTS
from tests.fault.conftest import wait_for
from tests.fault.test_exactly_once import BATCH, TIME_FACTOR, _assert_exactly_once, _buffered, _ckpt, _job
from tests.fault.test_faults import registered

pytestmark = [pytest.mark.slow, pytest.mark.replan_every(2)]

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
