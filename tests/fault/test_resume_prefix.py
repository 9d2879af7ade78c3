"""A driver killed mid-rollout resumes its unfinished trajectories from their journaled turns (issue 34, item 1).

A live multi-turn job (SWE-like, emulated engines and trainer, the fault stack) has its rollout driver SIGKILL
itself just after it journaled a turn that did not end its trajectory (`driver.mid_rollout_after_turn`), at a
moment when its step has some trajectories durable at the trainer and others in flight. The crash point is
armed only then: its one-shot flag exists from the start and the test removes it. The node agent starts the
driver again; the step goes on with the finished trajectories (recovered from the trainer, none regenerated)
and continues the journaled ones from their last finished turn rather than from their prompts.

Checked: the steps audit (`GET /api/jobs/<id>/trajectories/steps/`) counts trajectories of the killed step
`resumed`; no finished trajectory was run again, and the exactly-once invariants hold
(`test_exactly_once._assert_exactly_once`: each update committed once, consecutive versions, no trajectory
trained twice, each batch slot once per step, the durable ones trained as they were, the task cursor)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.fault.conftest import wait_for
from tests.fault.test_exactly_once import TIME_FACTOR, _assert_exactly_once, _buffered, _ckpt, _job, _just_finished
from tests.fault.test_faults import registered

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.replan_every(2)]


def _journaled(journal: Path) -> dict[str, int]:
    """The driver's turn journal: each journaled trajectory and how many finished turns it holds."""
    out = {}
    for f in journal.glob("*.jsonl"):
        lines = f.read_bytes().split(b"\n")[1:]
        out[f.stem] = sum(1 for line in lines if line.strip())
    return out


def _steps(job_id: int) -> dict[int, dict]:
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient

    api = APIClient()
    user = User.objects.filter(username="auditor").first() or User.objects.create_user("auditor", is_staff=True)
    api.force_authenticate(user)
    r = api.get(f"/api/jobs/{job_id}/trajectories/steps/")
    assert r.status_code == 200, r.content
    return {row["step"]: row for row in r.json()}


def _records(job_id: int, step: int) -> dict[str, Any]:
    from controlplane.models import Trajectory

    rows = Trajectory.objects.filter(job_id=job_id, step=step).values("name", "resumed", "rerun", "turns", "trained")
    return {r["name"]: r for r in rows}


def test_a_driver_killed_mid_rollout_continues_its_journaled_trajectories(stack) -> None:
    from controlplane.models import Job

    flag = stack.tmp / "crashed"
    flag.write_text("disarmed")  # the crash point fires only once this is gone
    crash = {"PEARL_CRASH_AT": "driver.mid_rollout_after_turn", "PEARL_CRASH_FLAG": str(flag)}
    stack.agent("train-p", pool="training", slots=1, time_factor=TIME_FACTOR, **crash)
    stack.agent("roll-p", slots=2, time_factor=TIME_FACTOR)
    for name in ("train-p", "roll-p"):
        registered(name)
    job = _job("prefix")
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 1, 120, "a first update")
    ckpt = _ckpt(stack, "train-p", job.name)
    assert ckpt is not None
    journal = stack.tmp / "agents" / "train-p" / "drivers" / job.name / "journal"

    # armed when a step in flight has some trajectories durable at the trainer and others unfinished: the
    # driver then dies right after its next journaled turn
    wait_for(lambda: _just_finished(ckpt), 90, "a step with some trajectories finished")
    flag.unlink()
    wait_for(flag.exists, 60, "the driver's crash after a journaled turn")
    at_kill = _journaled(journal)  # what the old driver journaled (the new one is not up yet)
    step = max(int(t.split("-")[0][1:]) for t, n in at_kill.items() if n > 0)
    durable = _buffered(ckpt).get(step, set())  # what the trainer held at the kill
    continued = {t for t, n in at_kill.items() if n > 0 and t.startswith(f"s{step}-") and t not in durable}
    assert continued, at_kill

    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= step + 1, 120, "the step in flight trained")
    row = wait_for(lambda: (r := _steps(job.pk).get(step)) and r["resumed"] > 0 and r, 30, "the resumed records")
    records = _records(job.pk, step)
    resumed = {name for name, r in records.items() if r["resumed"]}
    originals = {name.split("-r")[0] for name in resumed}
    assert originals <= {t.split("-r")[0] for t in continued}, (resumed, continued)  # those journaled at the kill
    assert not originals & {t.split("-r")[0] for t in durable}  # no finished trajectory regenerated or resumed
    assert not resumed & {n for n, r in records.items() if r["rerun"]}
    assert row["resumed"] == len(resumed)
    print(json.dumps({"step": step, "audit": row, "durable_at_kill": sorted(durable), "journaled": at_kill}))

    _assert_exactly_once(ckpt, job, step, durable)
