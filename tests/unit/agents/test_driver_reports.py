"""The driver's report frames (`ControlLink.encode`) are what `dl.dump` gives, parsed as the control plane
parses them, without its walk over every record and trajectory; and a due checkpoint is sent only if it
changed (`RolloutDriver._checkpoint_due`)."""

from __future__ import annotations

import json

from agents.driver import RolloutDriver
from agents.driver.link import ControlLink
from controlplane.core import driver_link as dl
from controlplane.core import loop as lp
from controlplane.core import telemetry as tm
from controlplane.core.context import Signal
from controlplane.core.state import Role
from tests.support.driver import job_view

JOB = job_view(batch_size=64, group_size=16)


def _loop_in_flight() -> lp.RolloutLoop:
    loop = lp.RolloutLoop(lp.LoopConfig(batch_size=64, group_size=16))
    loop.handle(lp.Start(0.0))
    loop.handle(lp.WorkerReady(0.0, 0, Role.COLOCATED))
    for tid in list(loop.trajs):
        loop.handle(lp.TrajectoryStarted(0.1, tid, prompt_tokens=8))
    return loop


def test_report_frames_parse_as_the_dumped_messages() -> None:
    loop = _loop_in_flight()
    records = [
        tm.turn(time_s=1.5, job="j", step=0, trajectory=f"s0-t{i}", turn=1, generated_tokens=16).to_json()
        for i in range(5)
    ]
    for msg in (
        dl.TelemetryReport(records),
        dl.CheckpointReport(loop.checkpoint() | {"clock_epoch": 1.7e9}),
        dl.ProgressReport(0, 64),
        dl.SignalReport(Signal.STEP_START, 64),
    ):
        frame = json.loads(ControlLink.encode(msg))
        assert frame == json.loads(json.dumps(dl.DRIVER_LINK.dump(msg), default=str))
        assert type(dl.DRIVER_LINK.parse(frame, dl.DRIVER_MESSAGES)) is type(msg)


def test_a_due_checkpoint_is_sent_only_when_the_loop_changed() -> None:
    driver = RolloutDriver(JOB, link=None, token="t")  # type: ignore[arg-type]
    driver.loop = _loop_in_flight()
    first = driver._checkpoint_due()
    assert first is not None and len(first["trajectories"]) == 64
    driver._checkpointed, driver._checkpoint_sent_at = first, float("-inf")  # sent; the next one is due
    assert driver._checkpoint_due() is None  # nothing changed since
    tid = next(iter(driver.loop.trajs))
    driver.loop.handle(lp.TurnGenerated(1.0, tid, 0, 16))
    second = driver._checkpoint_due()
    assert second is not None and second != first
    changed = [a for a, b in zip(first["trajectories"], second["trajectories"], strict=True) if a is not b]
    assert [t["tid"] for t in changed] == [tid]  # the others are the same records, compared by identity
