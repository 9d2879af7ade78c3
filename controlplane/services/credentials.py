"""Per-node agent tokens: random, shown once, stored as SHA-256, revocable, bound to one node name.
Per-job driver tokens checked: derived (nothing stored, `selectors.job_tokens`), valid while the job lives."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
import weakref

import redis
from channels.db import database_sync_to_async
from django.db import transaction
from django.utils import timezone

from controlplane.models import NAME_VALIDATOR, AgentCredential, Job, Node
from controlplane.selectors.job_tokens import DRIVER_TOKEN_PREFIX, job_driver_token
from controlplane.services import leases
from controlplane.services.errors import InvalidInput, NotFound
from controlplane.services.events import emit

TOKEN_PREFIX = "pna_"  # "PEARL node agent": never accepted where a user token is expected, and vice versa

log = logging.getLogger(__name__)

# The agent socket's handshake reads its token here, on the event loop, not on Daphne's one database thread:
# after a restart a thousand agents connect at once, and a handshake that queues there past Daphne's connect
# timeout is dropped and retried, which only lengthens the queue. Redis holds no only copy: `TOKENS` (hash)
# maps a valid token's SHA-256 to "credential id:node name", `TOKENS_LOADED` says the hash holds every valid
# token (an emptied Redis lacks it: the next miss loads them all, in one query). Every revocation drops its
# tokens' entries after the commit; an entry that outlives one (a check that raced the revocation, a path
# that revokes behind this module) only lets a socket be accepted: its Register checks the token in the
# database and closes it as revoked (`registration.register_agent_socket`).
TOKENS = "pearl:agent:tokens"
TOKENS_LOADED = "pearl:agent:tokens:loaded"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_agent_token(*, node_name: str, actor: str = "system") -> str:
    """Create a token for the agent of `node_name`; returns the plaintext (the only time it exists)."""
    try:
        NAME_VALIDATOR(node_name)
    except Exception as exc:
        raise InvalidInput(f"node name {node_name!r}: {exc}", field="node") from exc
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        cred = AgentCredential.objects.create(node_name=node_name, key_hash=_hash(token), prefix=token[4:12])
        # the node's revoked tokens leave the cache too: a caller may revoke them behind this module first
        # (the Ray bridge does, in this transaction)
        earlier = AgentCredential.objects.filter(node_name=node_name, revoked__isnull=False)
        revoked = list(earlier.values_list("key_hash", flat=True))

        def refresh_cache() -> None:
            _forget(revoked)
            _cache({cred.key_hash: (cred.pk, node_name)})

        transaction.on_commit(refresh_cache)
        emit(
            kind="agent.token_issued",
            message=f"agent token issued for node {node_name}",
            actor=actor,
            data={"node": node_name},
        )
    return token


def _plausible(token: str) -> bool:
    return bool(token) and token.startswith(TOKEN_PREFIX) and len(token) <= 200


def authenticate_agent(token: str) -> AgentCredential | None:
    """The credential for a valid, unrevoked token, else None (constant work for unknown tokens). One read, no
    database write: a socket's handshake must not wait for a commit (a thousand agents reconnecting at once
    after a restart each did one); its registration records `last_used` in its own transaction. A token found
    is cached for the next handshake (`authenticate_agent_async`)."""
    if not _plausible(token):
        return None
    cred = AgentCredential.objects.filter(key_hash=_hash(token), revoked__isnull=True).first()
    if cred is not None:
        _cache({cred.key_hash: (cred.pk, cred.node_name)})
    return cred


def load_agent_tokens() -> dict[str, tuple[int, str]]:
    """Every valid token's hash -> (credential id, node name), read in one query and written to the cache
    with its "loaded" mark (an emptied Redis is refilled by the first handshake that misses)."""
    table = {
        h: (pk, name)
        for h, pk, name in AgentCredential.objects.filter(revoked__isnull=True).values_list(
            "key_hash", "pk", "node_name"
        )
    }
    _cache(table, loaded=True)
    return table


def _cache(entries: dict[str, tuple[int, str]], *, loaded: bool = False) -> None:
    try:
        pipe = leases.client().pipeline(transaction=False)
        if entries:
            pipe.hset(TOKENS, mapping={h: f"{pk}:{name}" for h, (pk, name) in entries.items()})
        if loaded:
            pipe.set(TOKENS_LOADED, "1")
        pipe.execute()
    except redis.RedisError as exc:  # the next handshake reads the database again
        log.info("agent token cache not written (handshakes read the database): %s", exc)


def _forget(hashes: list[str]) -> None:
    if not hashes:
        return
    try:
        leases.client().hdel(TOKENS, *hashes)
    except redis.RedisError as exc:  # the Register's database check still refuses these tokens
        log.warning("could not drop %s revoked agent token(s) from the cache: %s", len(hashes), exc)


_loading: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[dict[str, tuple[int, str]]]] = (
    weakref.WeakKeyDictionary()
)


async def authenticate_agent_async(token: str) -> tuple[int, str] | None:
    """A handshake's token check on the socket's event loop: (credential id, node name) or None. One Redis
    round trip when the cache is filled; when it is not (Redis emptied), one load of every valid token per
    process, however many handshakes wait for it; a token the filled cache does not know, or Redis down,
    goes to the database thread (`authenticate_agent`)."""
    if not _plausible(token):
        return None
    key = _hash(token)
    try:
        pipe = leases.async_client().pipeline(transaction=False)
        pipe.hget(TOKENS, key)  # a pipeline queues: nothing to await here
        pipe.exists(TOKENS_LOADED)
        hit, loaded = await pipe.execute()
    except redis.RedisError:
        hit, loaded = None, True
    if hit is not None:
        pk, _, name = hit.decode().partition(":")
        return int(pk), name
    if not loaded:  # one load per process at a time: the others wait for it instead of each querying
        loop = asyncio.get_running_loop()
        task = _loading.get(loop)
        if task is None or task.done():
            task = _loading[loop] = loop.create_task(database_sync_to_async(load_agent_tokens)())
        return (await asyncio.shield(task)).get(key)
    cred = await database_sync_to_async(authenticate_agent)(token)
    return None if cred is None else (cred.pk, cred.node_name)


def revoke_agent_tokens(*, node_name: str, actor: str = "system") -> int:
    with transaction.atomic():
        active = AgentCredential.objects.filter(node_name=node_name, revoked__isnull=True)
        hashes = list(active.values_list("key_hash", flat=True))
        n = active.filter(key_hash__in=hashes).update(revoked=timezone.now())
        if n == 0:
            raise NotFound(f"no active agent token for node {node_name!r}", field="node")
        transaction.on_commit(lambda: _forget(hashes))  # the handshake's cache: before the records, below
        # a heartbeat renewed in Redis checks no token: the node's record goes, its next one checks it
        dropped = list(Node.objects.filter(name=node_name).values_list("pk", flat=True))
        transaction.on_commit(lambda: leases.drop_records(dropped))
        emit(
            kind="agent.token_revoked",
            message=f"{n} agent token(s) revoked for node {node_name}",
            actor=actor,
            data={"node": node_name},
        )
    return n


def credential_is_valid(credential_id: int) -> bool:
    """Re-checked on every agent message so a revoked token stops working within one message."""
    return AgentCredential.objects.filter(pk=credential_id, revoked__isnull=True).exists()


# ---------------------------------------------------------------- per-job driver tokens
def authenticate_driver(token: str) -> Job | None:
    """The live job a driver token belongs to, else None (ended jobs take no driver)."""
    if not token or not token.startswith(DRIVER_TOKEN_PREFIX) or len(token) > 200:
        return None
    job_id, _, _ = token[len(DRIVER_TOKEN_PREFIX) :].partition(".")
    if not job_id.isascii() or not job_id.isdigit() or len(job_id) > 18:
        return None
    job = Job.objects.filter(pk=int(job_id)).exclude(status__in=[Job.Status.STOPPED, Job.Status.FAILED]).first()
    if job is None or not hmac.compare_digest(job_driver_token(job).encode(), token.encode()):
        return None
    return job
