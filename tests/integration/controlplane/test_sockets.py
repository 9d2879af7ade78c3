"""Channels tests with WebsocketCommunicator over the real ASGI app and the real Redis channel layer:
agent register / heartbeat / lease expiry / stale epoch / revocation, dashboard snapshot and deltas,
refused origins and bad tokens."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from django.test import Client
from django.utils import timezone

from controlplane.core import agent_link as link
from controlplane.models import Node, TelemetrySample
from controlplane.services import credentials, expiry, workers
from pearl_site.asgi import application
from tests.support.cluster import make_job
from tests.support.environment import redis_available
from tests.support.sockets import WebsocketCommunicator

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not redis_available(), reason="Redis is not reachable"),
]

REGISTER = {
    "type": "register",
    "node": "gpu-a",
    "pool": "reserved",
    "hardware": "cpu",
    "incarnation": "inc-1",
    "slots": [{"index": i, "hardware": "cpu", "memory_mb": 1024} for i in range(4)],
}


def agent_socket(token: str | None) -> WebsocketCommunicator:
    headers = [(b"host", b"localhost")]
    if token is not None:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    return WebsocketCommunicator(application, "/ws/agent/", headers=headers)


async def registered_agent(name: str = "gpu-a", **overrides) -> tuple[WebsocketCommunicator, dict, dict]:
    token = await database_sync_to_async(credentials.issue_agent_token)(node_name=name)
    ws = agent_socket(token)
    connected, _ = await ws.connect()
    assert connected
    await ws.send_json_to(REGISTER | {"node": name} | overrides)
    reg = await ws.receive_json_from(timeout=5)
    desired = await ws.receive_json_from(timeout=5)
    return ws, reg, desired


async def test_agent_registers_and_gets_desired_state():
    ws, reg, desired = await registered_agent()
    assert reg["type"] == "registered" and reg["epoch"] >= 1 and reg["heartbeat_s"] > 0
    state = link.AGENT_LINK.parse(desired, link.CONTROL_MESSAGES)
    assert isinstance(state, link.DesiredState) and state.workers == [] and state.status == "ready"
    node = await database_sync_to_async(Node.objects.get)(name="gpu-a")
    assert node.pk == reg["node_id"]
    await ws.disconnect()


async def test_bad_or_missing_token_refused():
    for token in (None, "", "pna_not-a-real-token", "Token abc"):
        ws = agent_socket(token)
        connected, _code = await ws.connect()
        assert not connected
    assert not await database_sync_to_async(Node.objects.exists)()


async def test_node_a_token_cannot_speak_for_node_b():
    token = await database_sync_to_async(credentials.issue_agent_token)(node_name="node-a")
    ws = agent_socket(token)
    assert (await ws.connect())[0]
    await ws.send_json_to(REGISTER | {"node": "node-b"})
    err = await ws.receive_json_from(timeout=5)
    assert err["type"] == "error" and err["code"] == "forbidden" and "node-b" in err["message"]
    out = await ws.receive_output(timeout=5)
    assert out["type"] == "websocket.close"
    assert not await database_sync_to_async(Node.objects.filter(name="node-b").exists)()


async def test_revoked_token_stops_working():
    ws, _, _ = await registered_agent()
    await database_sync_to_async(credentials.revoke_agent_tokens)(node_name="gpu-a")
    await ws.send_json_to({"type": "heartbeat", "epoch": 1, "generation": 1})
    err = await ws.receive_json_from(timeout=5)
    assert err["code"] == "revoked"


async def test_malformed_messages_get_errors_and_change_nothing():
    ws, _reg, _ = await registered_agent()
    before = await database_sync_to_async(lambda: Node.objects.get(name="gpu-a").last_heartbeat)()
    for bad, fragment in [
        ("{nope", "malformed JSON"),
        (json.dumps({"type": "teleport"}), "unknown message type"),
        (json.dumps({"type": "heartbeat", "epoch": "one", "generation": 0}), "heartbeat.epoch"),
        (json.dumps({"type": "heartbeat", "epoch": 1, "generation": 0, "extra": 1}), "unknown fields"),
        (
            json.dumps(
                {
                    "type": "heartbeat",
                    "epoch": 1,
                    "generation": 0,
                    "workers": [{"worker_id": 1, "role": "boss", "activity": "active", "state": "running"}],
                }
            ),
            "role",
        ),
        ("x" * (link.MAX_MESSAGE_BYTES + 10), "at most"),
    ]:
        await ws.send_to(text_data=bad)
        err = await ws.receive_json_from(timeout=5)
        assert err["type"] == "error" and fragment in err["message"], (fragment, err)
    after = await database_sync_to_async(lambda: Node.objects.get(name="gpu-a").last_heartbeat)()
    assert before == after
    await ws.disconnect()


async def test_heartbeat_renews_lease_and_stale_epoch_resyncs():
    ws, reg, desired = await registered_agent()
    node = await database_sync_to_async(Node.objects.get)(name="gpu-a")
    old_lease = node.lease_expires
    await asyncio.sleep(0.05)
    await ws.send_json_to(
        {"type": "heartbeat", "epoch": reg["epoch"], "generation": desired["generation"], "workers": []}
    )
    await asyncio.sleep(0.3)
    node = await database_sync_to_async(Node.objects.get)(name="gpu-a")
    assert node.lease_expires > old_lease and node.applied_generation == desired["generation"]
    await ws.send_json_to({"type": "heartbeat", "epoch": reg["epoch"] + 7, "generation": 0})
    err = await ws.receive_json_from(timeout=5)
    assert err["code"] == "stale_epoch"
    again = await ws.receive_json_from(timeout=5)
    assert again["type"] == "desired_state" and again["epoch"] == reg["epoch"]
    await ws.disconnect()


async def test_desired_state_pushed_on_change_and_after_lease_expiry_with_new_epoch():
    ws, reg, desired = await registered_agent()
    job = await database_sync_to_async(make_job)()
    await database_sync_to_async(workers.start_worker)(
        job_id=job.pk, node_id=reg["node_id"], gpu_indexes=[0, 1], role="colocated", activity="active"
    )
    pushed = await ws.receive_json_from(timeout=5)
    assert pushed["type"] == "desired_state" and pushed["generation"] > desired["generation"]
    (w,) = pushed["workers"]
    assert w["gpus"] == [0, 1] and w["role"] == "colocated" and w["activity"] == "active"
    expired = await database_sync_to_async(expiry.expire_leases)(now=timezone.now() + timedelta(hours=1))
    assert expired == ["gpu-a"]
    fenced = await ws.receive_json_from(timeout=5)
    assert fenced["epoch"] == reg["epoch"] + 1 and fenced["status"] == "not_ready"
    assert fenced["workers"][0]["activity"] == "inactive"
    # a heartbeat with the new epoch brings the node back
    await ws.send_json_to({"type": "heartbeat", "epoch": fenced["epoch"], "generation": fenced["generation"]})
    await asyncio.sleep(0.3)
    assert (await database_sync_to_async(Node.objects.get)(name="gpu-a")).status == "ready"
    await ws.disconnect()


async def test_reconnect_gets_current_desired_state_again():
    ws, reg, _ = await registered_agent()
    job = await database_sync_to_async(make_job)()
    await database_sync_to_async(workers.start_worker)(
        job_id=job.pk, node_id=reg["node_id"], gpu_indexes=[2], role="decode", activity="inactive"
    )
    await ws.receive_json_from(timeout=5)
    await ws.disconnect()
    token = await database_sync_to_async(credentials.issue_agent_token)(node_name="gpu-a")
    ws2 = agent_socket(token)
    assert (await ws2.connect())[0]
    await ws2.send_json_to(REGISTER)  # same incarnation: a new lease holder all the same (new epoch), full state again
    reg2 = await ws2.receive_json_from(timeout=5)
    state = await ws2.receive_json_from(timeout=5)
    assert reg2["epoch"] == reg["epoch"] + 1 and [w["gpus"] for w in state["workers"]] == [[2]]
    await ws2.disconnect()


async def test_telemetry_validated_and_stored_all_or_nothing():
    ws, reg, _ = await registered_agent()
    job = await database_sync_to_async(make_job)()
    await database_sync_to_async(workers.start_worker)(
        job_id=job.pk, node_id=reg["node_id"], gpu_indexes=[0], role="colocated"
    )
    state = await ws.receive_json_from(timeout=5)
    assert state["type"] == "desired_state"
    good = {"kind": "decode_iteration", "job": job.name, "running_batch": 8, "duration_s": 0.012}
    await ws.send_json_to({"type": "telemetry", "epoch": reg["epoch"], "records": [good, good | {"running_batch": 9}]})
    await ws.send_json_to({"type": "telemetry", "epoch": reg["epoch"], "records": [good, {"kind": "bogus"}]})
    err = await ws.receive_json_from(timeout=5)
    assert err["type"] == "error" and "records[1]" in err["message"]
    count = await database_sync_to_async(TelemetrySample.objects.filter(job=job).count)()
    assert count == 2
    await ws.disconnect()


def _session_cookie(username: str = "dash") -> str:
    from django.contrib.auth.models import User

    user = User.objects.create_user(username=username, password="pw-123456789")
    c = Client()
    c.force_login(user)
    return c.cookies["sessionid"].value


def dashboard_socket(cookie: str | None, origin: bytes | None = b"http://localhost") -> WebsocketCommunicator:
    headers = [(b"host", b"localhost")]
    if origin is not None:
        headers.append((b"origin", origin))
    if cookie:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    return WebsocketCommunicator(application, "/ws/dashboard/", headers=headers)


async def test_dashboard_refuses_anonymous_foreign_origin_and_missing_origin():
    cookie = await database_sync_to_async(_session_cookie)()
    for ws in (
        dashboard_socket(None),
        dashboard_socket(cookie, b"http://evil.example"),
        dashboard_socket(cookie, None),
    ):
        connected, _ = await ws.connect()
        assert not connected
        await ws.wait()  # let the refused application instance finish (else the loop's teardown waits on it)


async def test_dashboard_snapshot_then_deltas_after_commit():
    cookie = await database_sync_to_async(_session_cookie)()
    ws = dashboard_socket(cookie)
    connected, _ = await ws.connect()
    assert connected
    snap = await ws.receive_json_from(timeout=5)
    assert snap["type"] == "snapshot" and snap["cluster"]["nodes"] == [] and snap["events"] == []
    agent, _reg, _ = await registered_agent("gpu-z")
    kinds = {}
    for _ in range(4):
        msg = await ws.receive_json_from(timeout=5)
        kinds[msg["kind"]] = msg
        if {"node", "event"} <= set(kinds):
            break
    assert kinds["node"]["data"]["name"] == "gpu-z" and len(kinds["node"]["data"]["gpus"]) == 4
    assert kinds["event"]["data"]["kind"] == "node.registered"
    await ws.disconnect()
    await agent.disconnect()
