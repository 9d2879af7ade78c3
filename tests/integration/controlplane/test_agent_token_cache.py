"""The agent socket's handshake reads its token from Redis, not the database thread (a restart's storm of
handshakes must not queue there): the cache is filled in one query when Redis was emptied, every revocation
drops its tokens, and an entry that outlives a revocation only gets a socket accepted, which its Register
closes as revoked."""

from __future__ import annotations

from typing import Any

import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.consumers.common import CLOSE_UNAUTHENTICATED
from controlplane.core.agent_link import AGENT_LINK, Register, SlotSpec
from controlplane.core.state import Pool
from controlplane.models import AgentCredential, Node
from controlplane.services import credentials, leases
from pearl_site.asgi import application
from tests.support.environment import fresh_leases
from tests.support.sockets import WebsocketCommunicator

pytestmark = pytest.mark.django_db(transaction=True)

REGISTER = Register(
    node="n1", pool=Pool.RESERVED, hardware="cpu", incarnation="i1", slots=[SlotSpec(0, hardware="cpu", memory_mb=4096)]
)


@pytest.fixture(autouse=True)
def _redis() -> None:
    fresh_leases()
    leases.client().delete(credentials.TOKENS, credentials.TOKENS_LOADED)


def socket(token: str) -> WebsocketCommunicator:
    headers = [(b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())]
    return WebsocketCommunicator(application, "/ws/agent/", headers=headers)


def cached() -> dict[bytes, bytes]:
    return leases.client().hgetall(credentials.TOKENS)  # type: ignore[return-value]


def test_an_emptied_cache_is_filled_in_one_query_and_then_answers_without_the_database() -> None:
    tokens = {name: credentials.issue_agent_token(node_name=name) for name in ("n1", "n2", "n3")}
    leases.client().delete(credentials.TOKENS, credentials.TOKENS_LOADED)  # Redis emptied
    credentials.revoke_agent_tokens(node_name="n3")
    from asgiref.sync import async_to_sync

    with CaptureQueriesContext(connection) as ctx:
        first = async_to_sync(credentials.authenticate_agent_async)(tokens["n1"])
    assert len(ctx.captured_queries) == 1  # every valid token, in one query
    cred = AgentCredential.objects.get(node_name="n1")
    assert first == (cred.pk, "n1")
    assert leases.client().exists(credentials.TOKENS_LOADED)
    assert len(cached()) == 2  # n1 and n2; n3's token was revoked
    with CaptureQueriesContext(connection) as ctx:
        assert async_to_sync(credentials.authenticate_agent_async)(tokens["n2"])[1] == "n2"  # type: ignore[index]
        assert async_to_sync(credentials.authenticate_agent_async)(tokens["n3"]) is None  # a revoked one
        assert async_to_sync(credentials.authenticate_agent_async)("pna_not-a-token") is None  # an unknown one
    # a hit and the revoked token read nothing; a token the filled cache does not know is looked up once
    assert len(ctx.captured_queries) == 2


def test_every_revocation_drops_the_tokens_from_the_cache() -> None:
    token = credentials.issue_agent_token(node_name="n1")
    key = credentials._hash(token).encode()
    assert key in cached()  # issued: cached at the commit
    credentials.revoke_agent_tokens(node_name="n1")
    assert key not in cached()
    # revoked behind this module (the Ray bridge revokes a node's tokens, then issues the next one)
    token = credentials.issue_agent_token(node_name="n1")
    key = credentials._hash(token).encode()
    AgentCredential.objects.filter(node_name="n1").update(revoked=timezone.now())
    credentials.issue_agent_token(node_name="n1")
    assert key not in cached()


async def test_a_revoked_tokens_handshake_is_refused() -> None:
    token = await database_sync_to_async(credentials.issue_agent_token)(node_name="n1")
    ws = socket(token)
    assert (await ws.connect())[0]
    await ws.disconnect()
    await database_sync_to_async(credentials.revoke_agent_tokens)(node_name="n1")
    assert not (await socket(token).connect())[0]


async def test_a_stale_entry_only_gets_a_socket_that_its_register_closes_as_revoked() -> None:
    token = await database_sync_to_async(credentials.issue_agent_token)(node_name="n1")
    # revoked in the database while the cache kept the entry (a check that raced the revocation)
    await database_sync_to_async(lambda: AgentCredential.objects.update(revoked=timezone.now()))()
    assert credentials._hash(token).encode() in await database_sync_to_async(cached)()
    ws = socket(token)
    assert (await ws.connect())[0]
    await ws.send_json_to(AGENT_LINK.dump(REGISTER))
    err: dict[str, Any] = await ws.receive_json_from(timeout=10)
    assert err["type"] == "error" and err["code"] == "revoked"
    out = await ws.receive_output(timeout=10)
    assert out["type"] == "websocket.close" and out["code"] == CLOSE_UNAUTHENTICATED
    assert not await database_sync_to_async(Node.objects.filter(name="n1").exists)()
