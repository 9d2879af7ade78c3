"""A restart of the control plane at full size converges (issue 34, item 4): a lease that runs out while the
agent link's database thread is behind (a thousand agents registering at once) waits for the next sweep, a
socket's handshake writes nothing, a registration is answered with its desired state in the same trip to the
database thread, and nodes that registered together do not refresh their row leases together."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.core.agent_link import AGENT_LINK, Heartbeat, ObservedWorker, Register, SlotSpec
from controlplane.core.state import Activity, Pool, Role
from controlplane.models import AgentCredential, Node
from controlplane.services import credentials, expiry, heartbeat, leases, registration
from tests.support.cluster import make_node
from tests.support.environment import fresh_leases
from tests.support.sockets import WebsocketCommunicator

pytestmark = pytest.mark.django_db(transaction=True)

REGISTER = Register(
    node="n1", pool=Pool.RESERVED, hardware="cpu", incarnation="i1", slots=[SlotSpec(0, hardware="cpu", memory_mb=4096)]
)


@pytest.fixture(autouse=True)
def _redis() -> None:
    fresh_leases()


def beat(node: Node) -> Heartbeat:
    worker = ObservedWorker(worker_id=999_999, role=Role.DECODE, activity=Activity.ACTIVE, state="running")
    return Heartbeat(epoch=node.epoch, generation=node.generation, workers=[worker])


def backlog(wait_s: float, at: float, process: str = "daphne-a:1") -> None:
    leases.client().hset(leases.BACKLOG, process, f"{wait_s:.3f},{at:.3f}")


def test_a_lease_that_ran_out_within_the_links_backlog_waits_for_the_next_sweep() -> None:
    node = make_node("n1")
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))  # renewed in Redis from now
    lease = leases.lease_s()
    five_late = timezone.now() + timedelta(seconds=lease + 5)
    backlog(20.0, five_late.timestamp())  # the link's database thread is 20 s behind
    backlog(0.2, five_late.timestamp(), process="daphne-b:2")
    assert expiry.expire_leases(now=five_late) == []  # its heartbeat may be in that queue
    assert Node.objects.get(pk=node.pk).status == "ready"
    assert leases.client().zscore(leases.LEASES, str(node.pk)) is not None  # decided again at the next sweep
    late = five_late + timedelta(seconds=16)
    backlog(20.0, late.timestamp())
    assert expiry.expire_leases(now=late) == ["n1"]  # ran out longer ago than the backlog: lost
    assert Node.objects.get(pk=node.pk).status == "not_ready"


def test_a_stale_or_short_backlog_defers_nothing() -> None:
    node = make_node("n1")
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    late = timezone.now() + timedelta(seconds=leases.lease_s() + 5)
    backlog(20.0, late.timestamp() - leases.BACKLOG_FRESH_S - 1)  # a server that went quiet (or down)
    backlog(leases.BACKLOG_MIN_S / 2, late.timestamp(), process="daphne-b:2")  # a busy, not a backed-up, one
    assert leases.link_backlog(late.timestamp()) == 0.0
    assert leases.client().hkeys(leases.BACKLOG) == [b"daphne-b:2"]  # the stale entry is dropped
    assert expiry.expire_leases(now=late) == ["n1"]


def test_the_backlog_is_at_most_one_refresh_span() -> None:
    now = time.time()
    backlog(10 * leases.db_refresh_s(), now)
    assert leases.link_backlog(now) == leases.db_refresh_s()


def test_a_link_server_publishes_its_longest_wait_at_most_once_a_second(monkeypatch) -> None:
    monkeypatch.setattr(leases, "_wait", {"longest": 0.0, "written": 0.0})
    leases.note_link_wait(1.5)
    assert leases.link_backlog(time.time()) == 1.5
    leases.note_link_wait(4.0)  # within the second: kept, not written
    assert leases.link_backlog(time.time()) == 1.5
    leases._wait["written"] -= 1.0
    leases.note_link_wait(2.0)
    assert leases.link_backlog(time.time()) == 4.0  # the longest of that second


def test_the_handshake_writes_nothing_and_the_registration_records_the_tokens_use() -> None:
    token = credentials.issue_agent_token(node_name="n1")
    with CaptureQueriesContext(connection) as ctx:
        cred = credentials.authenticate_agent(token)
    assert cred is not None
    assert [q["sql"] for q in ctx.captured_queries if not q["sql"].lstrip().upper().startswith("SELECT")] == []
    assert AgentCredential.objects.get(pk=cred.pk).last_used is None
    before = timezone.now()
    register = REGISTER
    registered = registration.register_agent_socket(
        credential_id=cred.pk, message=register, channel="chan-1", address="127.0.0.1"
    )
    assert registered is not None
    node, superseded, state = registered
    last_used = AgentCredential.objects.get(pk=cred.pk).last_used
    assert last_used is not None and last_used >= before
    assert superseded == "" and state is not None and state.generation == node.generation and state.epoch == node.epoch


def test_nodes_that_registered_together_refresh_their_rows_apart() -> None:
    now = timezone.now()
    leases_ = [leases.coarse_row_lease(now) for _ in range(200)]
    shortest = now + timedelta(seconds=leases.lease_s() + leases.db_refresh_s())
    assert all(shortest <= x <= now + leases.longest_row_lease() for x in leases_)
    spread = (max(leases_) - min(leases_)).total_seconds()
    assert spread > 0.5 * leases.REFRESH_JITTER * leases.db_refresh_s()


async def test_a_registration_is_answered_in_one_trip_to_the_database_thread(monkeypatch) -> None:
    from asgiref.sync import sync_to_async

    from controlplane.consumers import agent as agent_socket
    from pearl_site.asgi import application

    token = await sync_to_async(credentials.issue_agent_token)(node_name="n1")
    trips: list[str] = []
    real = agent_socket.database_sync_to_async

    def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        trips.append(getattr(fn, "__name__", repr(fn)))
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(agent_socket, "database_sync_to_async", counting)
    waits: list[float] = []
    monkeypatch.setattr(leases, "note_link_wait", waits.append)
    headers = [(b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())]
    ws = WebsocketCommunicator(application, "/ws/agent/", headers=headers)
    connected, _ = await ws.connect()
    assert connected
    await ws.send_json_to(AGENT_LINK.dump(REGISTER))
    assert (await ws.receive_json_from(timeout=10))["type"] == "registered"
    assert (await ws.receive_json_from(timeout=10))["type"] == "desired_state"
    # no trip of its own for the handshake's token check (Redis) nor the registration's re-check: the
    # registration's one trip answers the token, the registration and its desired state
    assert trips == []
    assert len(waits) == 1 and waits[0] >= 0.0  # the registration's queueing time is published
    await ws.disconnect()
