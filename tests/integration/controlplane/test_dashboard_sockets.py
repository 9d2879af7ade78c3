"""The dashboard socket's views: a large cluster's snapshot in chunks under Daphne's 1 MiB frame limit,
a job page that gets its job's snapshot and deltas only, unknown views and jobs refused."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async

from controlplane.consumers import dashboard
from controlplane.core.agent_link import TelemetryBatch
from controlplane.core.telemetry import step
from controlplane.services import draining, jobs, telemetry
from controlplane.services.principals import job_principal
from pearl_site.asgi import application
from tests.integration.controlplane.test_sockets import _session_cookie
from tests.support.cluster import make_job, make_node
from tests.support.environment import redis_available
from tests.support.sockets import WebsocketCommunicator

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not redis_available(), reason="Redis is not reachable"),
]


def socket(cookie: str, query: str = "") -> WebsocketCommunicator:
    headers = [(b"host", b"localhost"), (b"origin", b"http://localhost"), (b"cookie", f"sessionid={cookie}".encode())]
    return WebsocketCommunicator(application, f"/ws/dashboard/{query}", headers=headers)


async def test_large_snapshot_arrives_in_chunks(monkeypatch):
    monkeypatch.setattr(dashboard, "SNAPSHOT_CHUNK_GPUS", 5)
    for i in range(4):
        await database_sync_to_async(make_node)(f"n{i}", slots=3)
    ws = socket(await database_sync_to_async(_session_cookie)())
    assert (await ws.connect())[0]
    first = await ws.receive_json_from(timeout=5)
    assert (
        first["type"] == "snapshot" and first["more"] == 3 and [n["name"] for n in first["cluster"]["nodes"]] == ["n0"]
    )
    rest = [await ws.receive_json_from(timeout=5) for _ in range(3)]
    assert [m["type"] for m in rest] == ["snapshot_more"] * 3 and [m["last"] for m in rest] == [False, False, True]
    assert [n["name"] for m in rest for n in m["nodes"]] == ["n1", "n2", "n3"]
    await ws.disconnect()


async def test_job_view_gets_its_job_only():
    await database_sync_to_async(make_node)("n1", slots=2)
    await database_sync_to_async(make_node)("t1", pool="training", slots=1)
    mine = await database_sync_to_async(make_job)("mine", rollout_gpus=1, training_gpus=1)
    other = await database_sync_to_async(make_job)("other", rollout_gpus=1, training_gpus=1)
    ws = socket(await database_sync_to_async(_session_cookie)(), f"?view=job&job={mine.pk}")
    assert (await ws.connect())[0]
    snap = await ws.receive_json_from(timeout=5)
    assert (
        snap["view"] == "job"
        and snap["status"]["job"]["name"] == "mine"
        and snap["series"] == {"steps": [], "train": []}
    )
    await database_sync_to_async(jobs.set_overrides)(job_id=other.pk, changes={"freeze": True}, actor="t")
    node = await database_sync_to_async(make_node)("n2", slots=1)
    await database_sync_to_async(draining.drain_node)(node_id=node.pk, actor="t")
    await database_sync_to_async(jobs.set_overrides)(job_id=mine.pk, changes={"borrowing": False}, actor="t")
    for job, makespan in ((mine, 5.0), (other, 6.0)):  # each job's driver reports its own steps
        await database_sync_to_async(
            lambda j=job, m=makespan: telemetry.ingest(
                principal=job_principal(j),
                message=TelemetryBatch(epoch=1, records=[step(job=j.name, step=1, makespan_s=m).to_json()]),
            )
        )()
    got: list[dict[str, Any]] = []
    while len(got) < 3:
        got.append(await ws.receive_json_from(timeout=5))
    assert {(m["kind"], m["key"]) for m in got} == {
        ("event", got[0]["key"]),
        ("override", str(mine.pk)),
        ("series", str(mine.pk)),
    }
    assert got[0]["data"]["job"] == "mine" and got[1]["data"]["summary"] == "borrowing off"
    assert got[2]["data"]["record"]["makespan_s"] == 5.0
    assert await ws.receive_nothing(timeout=0.3)  # nothing of the other job, no node traffic
    await ws.disconnect()


async def test_unknown_view_or_job_refused():
    cookie = await database_sync_to_async(_session_cookie)()
    for query in ("?view=nope", "?view=job&job=999", "?view=job&job=abc"):
        ws = socket(cookie, query)
        connected, _ = await ws.connect()
        if connected:  # accepted then closed is not enough: it must not be accepted at all
            pytest.fail(query)
        await ws.wait()
