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
from tests.support.driver import Sink, holding, job_view
from tests.unit.core.loop_world import ToyWorld, run_heap

JOB = job_view()


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
        driver._trainer_call = holding({})  # type: ignore[method-assign]
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


def test_a_restarted_driver_recovers_what_the_trainer_holds_and_reruns_only_the_rest() -> None:
    """The driver died with its checkpoint showing none of step 0 finished; the trainer holds two of its
    trajectories (acknowledged before the old driver counted them, after its last checkpoint)."""
    world = ToyWorld({0: Role.COLOCATED}, turns=2)
    early, _ = run_heap(world, lp.LoopConfig(batch_size=4, group_size=2), [], until=0.1)
    assert early.step == 0 and early.remaining == 4
    checkpoint = json.loads(json.dumps(early.checkpoint())) | {"clock_epoch": 0.0}

    async def body() -> None:
        driver = RolloutDriver(JOB, link=Sink(), token="t", checkpoint=checkpoint)
        driver._trainer_call = holding({"s0-t0": 1.0, "s0-t3": 0.5})  # type: ignore[method-assign]
        started: list[str] = []
        driver._start_episode = lambda ref, step: started.append(ref.trajectory)  # type: ignore[method-assign]
        run = asyncio.create_task(driver.run())
        await asyncio.sleep(0.2)
        driver.stop()
        await run
        assert sorted(started) == ["s0-t1-r1", "s0-t2-r1"]  # only the unfinished ones run again
        assert driver.reruns == {"s0-t1-r1", "s0-t2-r1"}
        done = {t.tid: t.reward for t in driver.loop.trajs.values() if t.state is lp.TrajState.DONE}
        assert done == {"s0-t0": 1.0, "s0-t3": 0.5} and driver.loop.remaining == 2
        assert not driver.recovered

    asyncio.run(body())
