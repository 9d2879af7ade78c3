"""What a dead socket swallows and no level-triggered report resends (a Training Begin, an update request
not granted yet) is sent again when the driver link is welcomed back, or when the control plane says it
has no Training Begin; seen in tests/multihost: a partition mid-step left the job waiting for good."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents.driver import RolloutDriver
from agents.driver.link import ControlLink
from controlplane.core import driver_link as dl
from controlplane.core import loop as lp
from controlplane.core.context import Signal
from controlplane.core.wire import ErrorReply
from tests.support.driver import job_view

JOB = job_view()


class Socket:
    """The link's socket, keeping the frames the driver sends."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    async def send_str(self, data: str) -> None:
        self.frames.append(json.loads(data))


def _welcome() -> dict[str, Any]:
    view = dl.ClusterView(workers=[], weight_version=0, training_active=False, borrowed=0)
    return dl.DRIVER_LINK.dump(dl.Welcome(job=JOB, cluster=view, dataplane_token="t"))


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def _sent(sock: Socket) -> list[tuple[str, Any]]:
    return [(f["type"], f.get("signal", f.get("step"))) for f in sock.frames]


def test_a_reconnected_link_resends_training_begin_then_the_pending_update_request() -> None:
    async def body() -> None:
        link = ControlLink("http://127.0.0.1:1", "j", "t", http=None)  # type: ignore[arg-type]
        driver = RolloutDriver(JOB, link=link, token="t")
        link.driver, link.ws = driver, Socket()
        link._receive(_welcome())  # the first welcome: nothing to resend
        driver.emit_signal(lp.EmitSignal(Signal.TRAINING_BEGIN, 0))
        driver.train(lp.Train(step=1, weight_version=1, groups=(("s1-t0", "s1-t1"),)))
        await _settle()
        first = _sent(link.ws)
        assert first == [("signal", "training_begin"), ("update", 1)]

        link.ws = sock = Socket()  # the socket died unnoticed; a new one is welcomed
        link._receive(_welcome())
        await _settle()
        assert _sent(sock) == first  # both again, in that order

        driver.on_update_granted(1)  # granted: the update request is acknowledged
        link.ws = sock = Socket()
        link._receive(_welcome())
        await _settle()
        assert _sent(sock) == [("signal", "training_begin")]

    asyncio.run(body())


def test_an_update_refused_for_want_of_training_begin_sends_both_again() -> None:
    async def body() -> None:
        link = ControlLink("http://127.0.0.1:1", "j", "t", http=None)  # type: ignore[arg-type]
        driver = RolloutDriver(JOB, link=link, token="t")
        link.driver, link.ws = driver, Socket()
        link._receive(_welcome())
        driver.emit_signal(lp.EmitSignal(Signal.TRAINING_BEGIN, 0))
        driver.train(lp.Train(step=2, weight_version=2, groups=(("s2-t0", "s2-t1"),)))
        await _settle()
        link.ws = sock = Socket()
        link._receive(
            dl.DRIVER_LINK.dump(ErrorReply(error="conflict", detail="Training Begin first", field="training_active"))
        )
        await asyncio.sleep(0.7)
        assert _sent(sock) == [("signal", "training_begin"), ("update", 2)]

    asyncio.run(body())
