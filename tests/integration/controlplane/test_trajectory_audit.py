"""Trajectory records that can be audited (issue 34): a step's trajectories are listed as they end (`trained`
null), the step's `TrainedReport` (sent by the driver once the trainer committed the update) makes the consumed
ones `trained: true` and the ones left out `false` with why, through the driver link as the driver sends it;
the steps index counts trained / untrained / rerun / resumed."""

from __future__ import annotations

import pytest

from controlplane.core import driver_link as dl
from tests.integration.controlplane.test_agent_jobs import _agent_job, _record, nodes  # noqa: F401

pytestmark = pytest.mark.django_db


def test_records_listed_as_they_end_say_trained_only_once_the_update_committed(api, nodes):  # noqa: F811
    from agents.driver.trajectories import summarize
    from controlplane.services.errors import InvalidInput
    from controlplane.services.trajectories import mark_trained, record_trajectories

    jid = _agent_job(api)
    ended = [
        summarize("s2-t0", _record()),
        summarize("s2-t1-r1", _record(rerun=True)),  # regenerated after its driver restarted
        summarize("s2-t2", _record()),
        summarize("s2-t3", _record(status="failed", reward=None, reason="exit 1")),
    ]
    record_trajectories(job_id=jid, step=2, trajectories=ended)
    (step,) = api.get(f"/api/jobs/{jid}/trajectories/steps/").json()
    assert (step["done"], step["trained"], step["untrained"], step["rerun"], step["resumed"]) == (3, 0, 0, 1, 0)
    rows = {t["name"]: t for t in api.get(f"/api/jobs/{jid}/trajectories/?step=2").json()["results"]}
    assert all(t["trained"] is None for t in rows.values())  # listed before the update
    assert rows["s2-t1-r1"]["rerun"] is True and rows["s2-t0"]["rerun"] is False

    # the update committed: as the driver link carries it (parsed from its frame)
    why = "not trained: its group was dropped (fewer than 2 members left; 1 member(s) of the step gave up)"
    frame = dl.DRIVER_LINK.dump(dl.TrainedReport(2, 3, ["s2-t0", "s2-t1-r1"], ["s2-t2"], why))
    report = dl.DRIVER_LINK.parse(frame, dl.DRIVER_MESSAGES)
    assert mark_trained(job_id=jid, report=report) == 3
    assert mark_trained(job_id=jid, report=report) == 3  # again (a resend): the same rows, the same values
    rows = {t["name"]: t for t in api.get(f"/api/jobs/{jid}/trajectories/?step=2").json()["results"]}
    assert rows["s2-t0"]["trained"] is True and rows["s2-t1-r1"]["trained"] is True
    assert rows["s2-t2"]["trained"] is False and rows["s2-t2"]["reason"] == why
    assert rows["s2-t3"]["trained"] is None and rows["s2-t3"]["reason"] == "exit 1"  # failed: untouched
    (step,) = api.get(f"/api/jobs/{jid}/trajectories/steps/").json()
    assert (step["trained"], step["untrained"], step["rerun"]) == (2, 1, 1)
    with pytest.raises(InvalidInput):
        mark_trained(job_id=jid, report=dl.TrainedReport(2, 3, ["s2-t0"], ["s2-t0"], why))
