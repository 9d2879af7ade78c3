"""A restarted rollout driver goes on from its loop's checkpoint against a control plane that may have moved on
since that checkpoint was taken (checkpoints are sent every `CHECKPOINT_EVERY_S`, signals at once).

The stall of issue 34: the launcher killed right after a Training Finished, the control plane's job was
`training_active: false` while the driver's last checkpoint still had its update in progress; the restarted
driver asked for the update, was refused ("Training Begin comes before the update") and asked again twice a
second for good, never saying Training Begin again."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from agents.driver import RolloutDriver
from agents.driver.link import ControlLink
from controlplane.core import driver_link as dl
from controlplane.core import loop as lp
from controlplane.core.state import Role
from controlplane.core.wire import ErrorReply
from tests.unit.core.loop_world import ToyWorld, run_heap

JOB = dl.JobView(
    name="j",
    environment="calculator",
    model="tiny",
    engine="emulated",
    batch_size=4,
    group_size=2,
    max_staleness=1,
    max_trajectory_tokens=4096,
    return_deadline_s=30.0,
)


class ControlPlane:
    """The driver link's far end, as `services.progress.report_signal` and `services.jobs.start_update`
    answer: an update is granted only while training is active (after Training Begin)."""

    def __init__(self, link: ControlLink, *, training_active: bool) -> None:
        self.link = link
        self.training_active = training_active
        self.frames: list[dict[str, Any]] = []
        self.granted: list[int] = []

    async def send_str(self, data: str) -> None:
        frame = json.loads(data)
        self.frames.append(frame)
        if frame["type"] == "signal" and frame["signal"] in ("training_begin", "training_finished"):
            self.training_active = frame["signal"] == "training_begin"
        elif frame["type"] == "update":
            if self.training_active:
                self.granted.append(frame["step"])
                reply: Any = dl.UpdateGranted(frame["step"])
            else:
                reply = ErrorReply("conflict", "job j: Training Begin comes before the update", "training_active")
            asyncio.get_running_loop().call_soon(self.link._receive, dl.DRIVER_LINK.dump(reply))


def _checkpoint_mid_update() -> dict[str, Any]:
    """A loop's checkpoint taken while its step-0 update was in progress (TrainerPhase.TRAINING)."""
    world = ToyWorld({0: Role.COLOCATED, 1: Role.COLOCATED}, train_s=50.0)
    loop, _ = run_heap(world, lp.LoopConfig(batch_size=4, group_size=2), [], until=200.0)
    assert loop.trainer is lp.state.TrainerPhase.TRAINING and loop.training_active
    return json.loads(json.dumps(loop.checkpoint()))


@pytest.mark.parametrize("control_plane_training", [False, True])
def test_a_driver_restored_mid_update_gets_its_update_whatever_the_control_plane_saw_since(
    control_plane_training: bool,
) -> None:
    async def body() -> None:
        link = ControlLink("http://127.0.0.1:1", "j", "t", http=None)  # type: ignore[arg-type]
        cp = ControlPlane(link, training_active=control_plane_training)
        view = dl.ClusterView(workers=[], weight_version=0, training_active=control_plane_training, borrowed=0)
        checkpoint = _checkpoint_mid_update()
        step = checkpoint["ready"][0]
        driver = RolloutDriver(JOB, link=link, token="t", checkpoint=checkpoint | {"clock_epoch": 0.0})
        driver.cluster = view
        driver._train = _no_trainer  # type: ignore[method-assign]  # the update itself is not this test's
        link.driver, link.ws = driver, cp
        link._receive(dl.DRIVER_LINK.dump(dl.Welcome(job=JOB, cluster=view, dataplane_token="t")))
        run = asyncio.create_task(driver.run())
        for _ in range(40):
            await asyncio.sleep(0.1)
            if cp.granted:
                break
        driver.stop()
        await run
        sent = [(f["type"], f.get("signal", f.get("step"))) for f in cp.frames]
        assert cp.granted == [step], sent
        # Training Begin reaches the control plane before the update is asked for (not refused first)
        assert sent.index(("signal", "training_begin")) < sent.index(("update", step)), sent

    asyncio.run(body())


async def _no_trainer(cmd: lp.Train) -> None:
    return None
