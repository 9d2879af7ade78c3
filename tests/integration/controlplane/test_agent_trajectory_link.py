"""The driver link carries agent trajectories (issue 19): a `trajectories` report from a job's rollout
driver is kept for the job page; a malformed one is answered with an error naming the field and keeps
nothing. Over the real ASGI app and Redis channel layer."""

from __future__ import annotations

import asyncio

import pytest
from channels.db import database_sync_to_async

from agents.driver.trajectories import summarize
from controlplane.core import driver_link as dl
from controlplane.models import Trajectory
from controlplane.selectors.job_tokens import job_driver_token
from pearl_site.asgi import application
from tests.support.cluster import make_job, make_node
from tests.support.environment import redis_available
from tests.support.sockets import WebsocketCommunicator

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not redis_available(), reason="Redis is not reachable"),
]


def _job():
    make_node("n1", slots=2)
    job = make_job("calc-agent", environment="agent", agent={"agent_command": ["python", "a.py"], "tasks": [{}]})
    return job, job_driver_token(job)


async def _driver(token: str, name: str) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(
        application, "/ws/driver/", headers=[(b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())]
    )
    connected, _ = await ws.connect()
    assert connected
    await ws.send_json_to(dl.DRIVER_LINK.dump(dl.Hello(name, "inc-1")))
    welcome = dl.DRIVER_LINK.parse(await ws.receive_json_from(timeout=5), dl.CONTROL_MESSAGES)
    assert isinstance(welcome, dl.Welcome) and welcome.job.agent["agent_command"] == ["python", "a.py"]
    return ws


async def test_a_trajectory_report_is_kept():
    job, token = await database_sync_to_async(_job)()
    ws = await _driver(token, job.name)
    rec = {
        "samples": [
            {
                "tokens": [5, 6, 7],
                "mask": [0, 1, 1],
                "logprobs": [0.0, -0.5, -0.25],
                "weight_versions": [0],
                "workers": [1],
                "latency_s": [0.01],
            }
        ],
        "reward": 1.0,
        "turns": 1,
        "status": "done",
        "messages": [{"role": "user", "content": "hi"}],
    }
    await ws.send_json_to(dl.DRIVER_LINK.dump(dl.TrajectoryReport(0, [summarize("s0-t0", rec)])))
    await ws.send_json_to(
        {"type": "trajectories", "step": 0, "trajectories": [{"name": "s0-t1", "status": "done", "mask": [7]}]}
    )
    err = await ws.receive_json_from(timeout=5)
    assert err["type"] == "error" and err["error"] == "bad_message" and "mask" in err["detail"]
    await ws.send_json_to(dl.DRIVER_LINK.dump(dl.TrajectoryReport(0, [dl.TrajectorySummary("s0-t2", "weird")])))
    err = await ws.receive_json_from(timeout=5)
    assert err["type"] == "error" and err["field"] == "trajectories.status"
    rows = await database_sync_to_async(lambda: list(Trajectory.objects.filter(job=job).values("name", "mask")))()
    assert rows == [{"name": "s0-t0", "mask": [0, 1, 1]}]
    # issue 34: listed as it ended (trained null); the step's update committed: the driver's TrainedReport
    trained = lambda: list(Trajectory.objects.filter(job=job).values_list("trained", flat=True))
    assert await database_sync_to_async(trained)() == [None]
    await ws.send_json_to(dl.DRIVER_LINK.dump(dl.TrainedReport(0, 1, ["s0-t0"])))
    await ws.send_json_to(dl.DRIVER_LINK.dump(dl.ProgressReport(0, 0)))  # answered in order: the report was taken
    for _ in range(50):
        if await database_sync_to_async(trained)() == [True]:
            break
        await asyncio.sleep(0.1)
    assert await database_sync_to_async(trained)() == [True]
    await ws.disconnect()
