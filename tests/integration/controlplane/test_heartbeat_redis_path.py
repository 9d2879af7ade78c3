"""The heartbeat that repeats its socket's last accepted report (issue 22, 1,024 nodes): renewed in Redis on
the server's event loop, no database query; everything that fences or changes takes the database path as
before (another socket, another epoch, a new report, an expired Redis lease, a row lease due for refresh, a
revoked token, an empty or unreachable Redis), and a generation bump still reaches an agent that missed its
push. Real PostgreSQL (or SQLite), real Redis, the real ASGI app over WebsocketCommunicator."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.db.backends import utils as db_utils
from django.utils import timezone

from controlplane.core.agent_link import Heartbeat, ObservedWorker, Register, SlotSpec
from controlplane.core.state import Activity, Pool, Role
from controlplane.models import AgentCredential, Node
from controlplane.services import credentials, expiry, leases, nodes, registration
from controlplane.services.events import agent_group
from controlplane.services.heartbeat import record_heartbeat
from tests.integration.controlplane.test_sockets import registered_agent
from tests.support.cluster import make_node
from tests.support.environment import fresh_leases

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _redis() -> None:
    fresh_leases()


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every SQL statement any thread runs while the test holds it (the consumer's database thread too)."""
    seen: list[str] = []
    execute, executemany = db_utils.CursorWrapper.execute, db_utils.CursorWrapper.executemany

    def counted(self: Any, sql: str, params: Any = None) -> Any:
        seen.append(sql)
        return execute(self, sql, params)

    def counted_many(self: Any, sql: str, param_list: Any) -> Any:
        seen.append(sql)
        return executemany(self, sql, param_list)

    monkeypatch.setattr(db_utils.CursorWrapper, "execute", counted)
    monkeypatch.setattr(db_utils.CursorWrapper, "executemany", counted_many)
    yield seen


def beat(node: Node, *, inflight: int = 0, generation: int | None = None, epoch: int | None = None) -> Heartbeat:
    worker = ObservedWorker(
        worker_id=999_999, role=Role.DECODE, activity=Activity.ACTIVE, state="running", inflight=inflight
    )
    return Heartbeat(
        epoch=node.epoch if epoch is None else epoch,
        generation=node.generation if generation is None else generation,
        workers=[worker],
    )


def fast(node: Node, message: Heartbeat, channel: str = "c1") -> int | None:
    return asyncio.run(
        leases.renew_in_redis(node_id=node.pk, message=message, channel=channel, digest=leases.report_digest(message))
    )


def score(node: Node) -> float:
    value = leases.client().zscore(leases.LEASES, str(node.pk))
    assert value is not None
    return float(value)


def accepted(name: str = "n1") -> Node:
    """A node whose agent socket "c1" had one report taken in full by the database path."""
    node = make_node(name)
    Node.objects.filter(pk=node.pk).update(agent_channel="c1")
    node.refresh_from_db()
    assert record_heartbeat(node_id=node.pk, message=beat(node), channel="c1").refused == []
    return node


def test_the_repeated_report_renews_in_redis_with_no_query(statements: list[str]) -> None:
    node = accepted()
    before = score(node)
    time.sleep(0.01)
    statements.clear()
    assert fast(node, beat(node)) == node.generation
    assert statements == []
    assert score(node) > before


def test_whatever_differs_goes_to_the_database_path() -> None:
    node = accepted()
    assert fast(node, beat(node), channel="c2") is None  # another socket
    assert fast(node, beat(node, epoch=node.epoch + 1)) is None  # another epoch
    assert fast(node, beat(node, inflight=2)) is None  # a report the database has not taken
    assert fast(node, beat(node, generation=node.generation - 1)) is None  # another applied generation
    leases.client().zadd(leases.LEASES, {str(node.pk): time.time() - 1})  # the Redis lease ran out
    assert fast(node, beat(node)) is None
    assert score(node) < time.time()  # and was not renewed
    # the database path takes the report, and the next repeat is fast again
    assert record_heartbeat(node_id=node.pk, message=beat(node), channel="c1").refused == []
    assert fast(node, beat(node)) == node.generation


def test_a_row_lease_due_for_refresh_goes_to_the_database(settings) -> None:
    settings.PEARL = {**settings.PEARL, "LEASE_DB_REFRESH_S": 0.0}  # the coarse row lease is one lease ahead
    node = accepted()
    assert fast(node, beat(node)) is None
    before = Node.objects.get(pk=node.pk).last_heartbeat
    record_heartbeat(node_id=node.pk, message=beat(node), channel="c1")  # the fenced UPDATE of the row
    after = Node.objects.get(pk=node.pk).last_heartbeat
    assert before is not None and after is not None and after > before


def test_a_new_registration_or_a_lost_lease_fences_the_redis_path() -> None:
    node = accepted()
    register = Register(node="n1", pool=Pool.RESERVED, hardware="cpu", incarnation="i2", slots=SLOTS)
    registration.register_node(credential_id=AgentCredential.objects.get(node_name="n1").pk, message=register)
    assert fast(node, beat(node)) is None  # the new epoch's record names no report yet
    other = accepted("n2")
    assert "n2" in expiry.expire_leases(now=timezone.now() + timedelta(seconds=leases.lease_s() + 1))
    assert fast(other, beat(other)) is None


SLOTS = [SlotSpec(index=i, hardware="cpu", memory_mb=1024) for i in range(4)]


def test_a_generation_bump_is_mirrored_and_never_goes_back() -> None:
    node = accepted()
    with transaction.atomic():
        nodes.bump_generation(Node.objects.get(pk=node.pk))
    bumped = Node.objects.get(pk=node.pk).generation
    assert bumped == node.generation + 1
    assert fast(node, beat(node)) == bumped  # the agent still reports the old one: it hears it is behind
    # a record written from an older read of the row (a heartbeat committed before the bump) keeps the mirror
    stale = leases.holder(node.pk)
    assert stale is not None
    leases.renew(node.pk, expires=time.time() + 10, record=leases.Holder(**{**stale.__dict__, "generation": 1}))
    assert fast(node, beat(node)) == bumped


def test_a_revoked_token_drops_the_record() -> None:
    node = accepted()
    assert fast(node, beat(node)) == node.generation
    credentials.revoke_agent_tokens(node_name="n1")
    assert leases.holder(node.pk) is None
    assert fast(node, beat(node)) is None


def test_an_empty_or_unreachable_redis_goes_to_the_database(settings) -> None:
    node = accepted()
    leases.client().delete(leases.HOLDERS)  # what a Redis restart leaves
    assert fast(node, beat(node)) is None
    assert record_heartbeat(node_id=node.pk, message=beat(node), channel="c1").refused == []
    assert fast(node, beat(node)) == node.generation
    settings.REDIS_URL = "redis://127.0.0.1:1"  # nothing listens there
    assert fast(node, beat(node)) is None


# ---------------------------------------------------------------- over the agent socket
async def registered() -> tuple[WebsocketCommunicator, dict[str, Any], dict[str, Any]]:
    """Node gpu-a with two slots, registered over the real agent socket (test_sockets' helper)."""
    return await registered_agent(slots=[{"index": i, "hardware": "cpu", "memory_mb": 1024} for i in range(2)])


async def heartbeat(ws: WebsocketCommunicator, reg: dict[str, Any], generation: int) -> list[dict[str, Any]]:
    """One heartbeat, then a malformed frame (answered at once, in order): everything the socket sent back."""
    await ws.send_json_to({"type": "heartbeat", "epoch": reg["epoch"], "generation": generation, "workers": []})
    await ws.send_to(text_data=json.dumps({"type": "probe"}))
    out: list[dict[str, Any]] = []
    while True:
        msg = await ws.receive_json_from(timeout=10)
        if msg.get("type") == "error" and msg.get("code") == "bad_message":
            return out
        out.append(msg)


async def test_over_the_socket_a_repeated_heartbeat_runs_no_query(statements: list[str]) -> None:
    ws, reg, desired = await registered()
    assert await heartbeat(ws, reg, desired["generation"]) == []  # the database path takes the report
    statements.clear()
    before = await database_sync_to_async(lambda: leases.client().zscore(leases.LEASES, str(reg["node_id"])))()
    for _ in range(3):
        assert await heartbeat(ws, reg, desired["generation"]) == []
    assert statements == []
    after = await database_sync_to_async(lambda: leases.client().zscore(leases.LEASES, str(reg["node_id"])))()
    assert before is not None and after is not None and after > before
    await ws.disconnect()


async def test_over_the_socket_a_missed_push_is_repaired_by_the_next_repeated_heartbeat(
    statements: list[str],
) -> None:
    ws, reg, desired = await registered()
    await heartbeat(ws, reg, desired["generation"])
    # the socket leaves its group (as if a push were lost on the way), then the node's desired state changes
    channel = await database_sync_to_async(lambda: Node.objects.get(pk=reg["node_id"]).agent_channel)()
    await get_channel_layer().group_discard(agent_group(reg["node_id"]), channel)

    def bump() -> int:
        with transaction.atomic():
            node = Node.objects.get(pk=reg["node_id"])
            nodes.bump_generation(node)
        return Node.objects.get(pk=reg["node_id"]).generation

    generation = await database_sync_to_async(bump)()
    statements.clear()
    replies = await heartbeat(ws, reg, desired["generation"])  # still the old report: renewed in Redis
    assert [r["type"] for r in replies] == ["desired_state"] and replies[0]["generation"] == generation
    assert not [s for s in statements if s.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]
    await ws.disconnect()


async def test_over_the_socket_a_revoked_token_stops_a_repeated_heartbeat() -> None:
    ws, reg, desired = await registered()
    for _ in range(2):
        await heartbeat(ws, reg, desired["generation"])
    await database_sync_to_async(credentials.revoke_agent_tokens)(node_name="gpu-a")
    await ws.send_json_to(
        {"type": "heartbeat", "epoch": reg["epoch"], "generation": desired["generation"], "workers": []}
    )
    err = await ws.receive_json_from(timeout=5)
    assert err["code"] == "revoked"


async def test_over_the_socket_telemetry_and_faults_check_the_token_in_their_own_hop() -> None:
    ws, reg, _ = await registered()
    await ws.send_json_to({"type": "fault", "epoch": reg["epoch"], "worker_id": 0, "kind": "timeout"})
    await ws.send_to(text_data=json.dumps({"type": "probe"}))
    assert (await ws.receive_json_from(timeout=10))["code"] == "bad_message"  # the fault was taken: no reply
    await database_sync_to_async(credentials.revoke_agent_tokens)(node_name="gpu-a")
    await ws.send_json_to({"type": "telemetry", "epoch": reg["epoch"], "records": []})
    assert (await ws.receive_json_from(timeout=10))["code"] == "revoked"
