"""The node lease, whole: epoch fencing (`fence`), the lease of record in the database, and its renewals in
Redis, so that a heartbeat that changes nothing costs no database transaction (`renew_in_redis` on the
socket's event loop, `renew_unchanged_report` on the database thread).

The lease of record stays in the database (`Node.lease_expires`, `Node.last_heartbeat`, the epoch); Redis
only holds the fine-grained renewals between two database writes, and nothing there is the only copy of
durable state:

- `pearl:leases` (sorted set): node id -> expiry (Unix seconds) of its latest renewal. The sweep reads the
  expired members only (ZRANGEBYSCORE), so it costs in proportion to the nodes that expired.
- `pearl:lease:holders` (hash): node id -> JSON {epoch, base, base_ts, digest, channel, generation}: the
  Redis renewals extend the database lease `base` (the row's `lease_expires` as written; `base_ts` the same
  in Unix seconds) of that `epoch`, held by the agent socket `channel`; `digest` is the last report the
  database accepted in full, `generation` the node's desired-state generation as last written or bumped
  (a mirror, only ever raised within an epoch). A record whose epoch or base is not the row's is ignored:
  the row was written behind Redis' back (a new registration, a fenced node, an operator), so the row wins.
- `pearl:lease:boot` (string): Redis' generation, written by the sweeper. When it is missing, Redis was
  emptied (restart, flush): logged; no repair is needed (below).
- `pearl:link:backlog` (hash): agent-link server process -> "wait,at": the longest a message of its agent
  sockets waited for the database thread in the second before `at` (`note_link_wait`). The sweeper defers
  an expiry by the longest fresh wait (`link_backlog`): a lease that ran out while its node's registration or
  heartbeat queued behind a storm of others (a thousand agents reconnecting after a restart) is the control
  plane's silence, not the node's; expiring it would start a new epoch, a full-path heartbeat and more queue.

While Redis renews, the row's lease is coarse: each database write sets it LEASE_S + DB_REFRESH_S ahead (the
refresh span stretched by a random factor in [1, 1.25) per write, so that nodes that registered together, as
after a restart, do not refresh their rows together ever after), and a heartbeat rewrites it (last-seen
included) when less than one LEASE_S of it is left, i.e. at most once per DB_REFRESH_S per node. So the row's
lease always reaches at least as far as the Redis renewal (the grace is built in): a Redis restart, an empty
Redis or Redis down makes no node look lost, the row's coarse lease holds until the agent's next heartbeat
writes Redis again (or, with Redis down, the database as before, with the exact lease). What an empty Redis
costs is slower detection of nodes that died meanwhile (up to LEASE_S + 1.25 DB_REFRESH_S after their last row
write: `longest_row_lease`) and one database heartbeat per node to rebuild its record.

The agent socket's heartbeat that reports what its last accepted report said renews on the server's event
loop in one Redis round trip and no database query (`renew_unchanged`, a Lua script): only when the record
names this socket, this epoch and this digest, the Redis lease has not run out, and the row's coarse lease
needs no refresh yet. Anything else goes to the database path. Whatever the database path does not see then
(a generation bump, a revocation) reaches the record by a write after its commit (`mirror_generations`,
`drop_records`); should that write fail while Redis keeps its data, the row decides again at the node's next
row-lease refresh, at most DB_REFRESH_S later.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import os
import random
import secrets
import socket
import time
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import redis
import redis.asyncio as aioredis
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.core.agent_link import Heartbeat
from controlplane.core.state import NodeStatus
from controlplane.models import Node
from controlplane.selectors.leases import LEASES, all_last_seen, client, last_seen, lease_s
from controlplane.services.errors import NotFound, StaleEpoch, Superseded
from controlplane.services.locks import locked

__all__ = ["LEASES", "all_last_seen", "client", "last_seen", "lease_s"]

log = logging.getLogger(__name__)

HOLDERS = "pearl:lease:holders"
BOOT = "pearl:lease:boot"
BACKLOG = "pearl:link:backlog"
BACKLOG_FRESH_S = 10.0  # a link server's wait older than this is not the backlog any more (it went quiet or down)
BACKLOG_MIN_S = 1.0  # a shorter wait defers nothing (a lease is many seconds; a sweep runs every few)
REFRESH_JITTER = 0.25  # the coarse row lease's refresh span is stretched by up to this share, at random


def db_refresh_s() -> float:
    """How far beyond one lease the row's coarse lease reaches: the longest a node goes without a row write."""
    return float(settings.PEARL.get("LEASE_DB_REFRESH_S", 4 * lease_s()))


@dataclass(frozen=True)
class Holder:
    """What Redis knows of a node's lease: the epoch and row lease it extends, the last clean report."""

    epoch: int
    base: str  # the row's lease_expires, ISO, as last written
    digest: str  # of the last report the database took in full ("" if none yet at this epoch)
    channel: str = ""  # the agent socket that holds the lease
    generation: int = 0  # the node's desired-state generation (mirrored; the row's is the one of record)

    def extends(self, other: Holder) -> bool:
        """The same lease and the same clean report (the generation mirror aside)."""
        return (self.epoch, self.base, self.digest, self.channel) == (
            other.epoch,
            other.base,
            other.digest,
            other.channel,
        )


def iso(value: datetime | None) -> str:
    return value.isoformat() if value else ""


def holder(node_id: int) -> Holder | None:
    """The node's record, or None (none, unreadable). Raises redis.RedisError when Redis is unreachable."""
    raw = client().hget(HOLDERS, str(node_id))
    if not raw:
        return None
    try:
        d = json.loads(raw)
        return Holder(
            epoch=int(d["epoch"]),
            base=str(d["base"]),
            digest=str(d["digest"]),
            channel=str(d.get("channel", "")),
            generation=int(d.get("generation", 0)),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _body(record: Holder) -> str:
    base_ts = datetime.fromisoformat(record.base).timestamp() if record.base else 0.0
    return json.dumps(
        {
            "epoch": record.epoch,
            "base": record.base,
            "base_ts": base_ts,
            "digest": record.digest,
            "channel": record.channel,
            "generation": record.generation,
        }
    )


# KEYS: LEASES, HOLDERS. ARGV: node id, expiry, the record's JSON. The record replaces the old one, but the
# generation mirror never goes down within an epoch: a heartbeat's record written after commit may land
# after a later bump's mirror.
_WRITE = """
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
local body = ARGV[3]
local old = redis.call('HGET', KEYS[2], ARGV[1])
if old then
  local ok, o = pcall(cjson.decode, old)
  if ok and type(o) == 'table' and type(o.generation) == 'number' then
    local rec = cjson.decode(body)
    if o.epoch == rec.epoch and o.generation > rec.generation then
      rec.generation = o.generation
      body = cjson.encode(rec)
    end
  end
end
redis.call('HSET', KEYS[2], ARGV[1], body)
return 1
"""

# KEYS: HOLDERS. ARGV: node id, generation, node id, generation, ... Raise the mirror of records that exist.
_MIRROR = """
for i = 1, #ARGV, 2 do
  local raw = redis.call('HGET', KEYS[1], ARGV[i])
  if raw then
    local ok, rec = pcall(cjson.decode, raw)
    local g = tonumber(ARGV[i + 1])
    if ok and type(rec) == 'table' and type(rec.generation) == 'number' and rec.generation < g then
      rec.generation = g
      redis.call('HSET', KEYS[1], ARGV[i], cjson.encode(rec))
    end
  end
end
return 1
"""

# KEYS: LEASES, HOLDERS. ARGV: node id, epoch, channel, digest, now, new expiry, refresh-before. The
# generation mirror if the record names this socket, epoch and (clean) report, its row lease needs no
# refresh yet and the Redis lease has not run out (the sweeper may be fencing it): then the lease is renewed.
_RENEW_UNCHANGED = """
local raw = redis.call('HGET', KEYS[2], ARGV[1])
if not raw then return false end
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' then return false end
if rec.epoch ~= tonumber(ARGV[2]) or rec.channel ~= ARGV[3] or rec.digest == '' or rec.digest ~= ARGV[4] then
  return false
end
if type(rec.base_ts) ~= 'number' or rec.base_ts < tonumber(ARGV[7]) or type(rec.generation) ~= 'number' then
  return false
end
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) < tonumber(ARGV[5]) then return false end
redis.call('ZADD', KEYS[1], ARGV[6], ARGV[1])
return rec.generation
"""


_scripts: dict[str, Any] = {}


def _run(source: str, keys: list[str], args: list[Any]) -> Any:
    """Run a script on this process' client by its SHA (EVALSHA; redis-py loads it again after a restart)."""
    c = client()
    if source not in _scripts:
        _scripts[source] = c.register_script(source)
    return _scripts[source](keys=keys, args=args, client=c)


def renew(node_id: int, *, expires: float, record: Holder | None = None) -> None:
    """Renew the node's lease in Redis until `expires` (and replace its record). Raises redis.RedisError."""
    if record is None:
        client().zadd(LEASES, {str(node_id): expires})
        return
    _run(_WRITE, [LEASES, HOLDERS], [str(node_id), expires, _body(record)])


def mirror_generations(generations: Mapping[int, int]) -> None:
    """After a commit that bumped these nodes' generations: raise the records' mirror (one round trip), so
    that a heartbeat renewed in Redis still tells an agent that missed the push that it is behind."""
    if not generations:
        return
    args: list[Any] = []
    for node_id, generation in sorted(generations.items()):
        args += [str(node_id), int(generation)]
    try:
        _run(_MIRROR, [HOLDERS], args)
    except redis.RedisError as exc:  # the row's generation reaches the agent at its next database heartbeat
        log.warning("generation mirror of %s nodes not written: %s", len(generations), exc)


def drop_records(node_ids: Iterable[int]) -> None:
    """Drop the nodes' records (not their Redis leases): their next heartbeat takes the database path
    (e.g. a revoked token: the database check answers it)."""
    ids = [str(i) for i in node_ids]
    if not ids:
        return
    try:
        client().hdel(HOLDERS, *ids)
    except redis.RedisError as exc:
        log.warning("could not drop the Redis lease records of %s: %s", ids, exc)


_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, tuple[aioredis.Redis, Any]]] = (
    weakref.WeakKeyDictionary()
)


def _async_script() -> tuple[aioredis.Redis, Any]:
    """This event loop's Redis client (a connection pool is bound to the loop it was made on) and its
    registered renewal script (EVALSHA, loaded again by redis-py after a Redis restart)."""
    url = f"{settings.REDIS_URL.rstrip('/')}/2"
    per_loop = _async_clients.setdefault(asyncio.get_running_loop(), {})
    if url not in per_loop:
        c = aioredis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1, health_check_interval=30)
        per_loop[url] = (c, c.register_script(_RENEW_UNCHANGED))
    return per_loop[url]


def async_client() -> aioredis.Redis:
    """This event loop's client of the lease Redis (db 2), for what a socket reads there without the
    database thread (the agent token cache: `credentials.authenticate_agent_async`)."""
    return _async_script()[0]


async def renew_unchanged(node_id: int, *, epoch: int, channel: str, digest: str, now: float) -> int | None:
    """On the caller's event loop, no database: renew the lease until now + LEASE_S if Redis' record says
    this socket holds this epoch's lease and the database took this very report (see the module's
    docstring); returns the mirrored generation, or None (the database path decides). Raises
    redis.RedisError when Redis cannot be reached."""
    c, script = _async_script()
    lease = lease_s()
    out = await script(
        keys=[LEASES, HOLDERS], args=[str(node_id), epoch, channel, digest, now, now + lease, now + lease], client=c
    )
    return None if out is None else int(out)


def renew_quietly(node_id: int, *, expires: float, record: Holder) -> bool:
    """`renew`, after a commit: a Redis that cannot be reached leaves the row's lease in charge."""
    try:
        renew(node_id, expires=expires, record=record)
        return True
    except redis.RedisError as exc:
        log.warning("lease of node %s not renewed in Redis (the database lease holds): %s", node_id, exc)
        return False


def forget(node_ids: Iterable[int]) -> None:
    """Drop the nodes' Redis lease (it was lost or fenced: a new epoch starts in the database)."""
    ids = [str(i) for i in node_ids]
    if not ids:
        return
    try:
        pipe = client().pipeline(transaction=False)
        pipe.zrem(LEASES, *ids)
        pipe.hdel(HOLDERS, *ids)
        pipe.execute()
    except redis.RedisError as exc:  # a stale record is ignored anyway: its epoch is not the row's
        log.warning("could not drop the Redis lease of %s: %s", ids, exc)


def expired_ids(now: float) -> list[int]:
    """The nodes whose Redis lease ran out by `now` (ZRANGEBYSCORE: only those). Raises redis.RedisError."""
    members = cast("list[bytes]", client().zrangebyscore(LEASES, "-inf", now))  # redis-py: any reply
    return [int(m) for m in members]


def notice_empty() -> bool:
    """Whether Redis was emptied (restarted, flushed) since the last sweep: its generation key is missing.
    Nothing needs repair then: every row lease reaches at least as far as the Redis renewals it had (see the
    module's docstring), so the nodes keep their leases on the rows until their next heartbeat."""
    if client().set(BOOT, secrets.token_hex(8), nx=True):
        log.warning(
            "Redis holds no lease generation (new, restarted or emptied): the rows' leases decide "
            "until each agent's next heartbeat"
        )
        return True
    return False


def effective_expiry(node_id: int, *, epoch: int, row_lease: datetime | None) -> tuple[datetime | None, bool]:
    """The node's lease expiry, and whether Redis decided it: its Redis renewal when Redis' record extends
    this very row lease (same epoch, same base); else the row's own lease."""
    try:
        rec = holder(node_id)
        score = client().zscore(LEASES, str(node_id)) if rec else None
    except redis.RedisError:
        rec, score = None, None
    if rec is not None and score is not None and rec.epoch == epoch and rec.base == iso(row_lease):
        return datetime.fromtimestamp(float(score), tz=UTC), True
    return row_lease, False


def coarse_row_lease(now: datetime) -> datetime:
    """The row lease written while Redis renews: one lease plus the refresh span (stretched at random by up to
    REFRESH_JITTER, see the module's docstring) ahead."""
    return now + timedelta(seconds=lease_s() + db_refresh_s() * (1 + REFRESH_JITTER * random.random()))


def longest_row_lease() -> timedelta:
    """The furthest a coarse row lease reaches past its write: how long a node that died goes undetected at most
    when Redis lost its renewals."""
    return timedelta(seconds=lease_s() + db_refresh_s() * (1 + REFRESH_JITTER))


_PROCESS = f"{socket.gethostname()}:{os.getpid()}"
_wait = {"longest": 0.0, "written": 0.0}


def note_link_wait(wait_s: float) -> None:
    """An agent socket's message waited `wait_s` for this process' database thread (Channels runs all of a
    process' database work on one thread): published in Redis at most once a second, the longest of that
    second, for the sweeper (`link_backlog`). A Redis that cannot be reached publishes nothing (no deferral)."""
    now = time.time()
    _wait["longest"] = max(_wait["longest"], wait_s)
    if now - _wait["written"] < 1.0:
        return
    try:
        client().hset(BACKLOG, _PROCESS, f"{_wait['longest']:.3f},{now:.3f}")
    except redis.RedisError as exc:
        log.debug("link wait not published: %s", exc)
    _wait["longest"], _wait["written"] = 0.0, now


def link_backlog(now: float) -> float:
    """How far behind the agent-link servers are (seconds): the longest wait any of them published within
    BACKLOG_FRESH_S, at most one refresh span (a control plane that far behind is down, not busy). Entries gone
    stale are dropped. Raises redis.RedisError."""
    longest = 0.0
    stale: list[bytes] = []
    raw = cast("dict[bytes, bytes]", client().hgetall(BACKLOG))  # redis-py: any reply
    for process, value in raw.items():
        try:
            wait, at = (float(x) for x in value.decode().split(","))
        except ValueError:
            stale.append(process)
            continue
        if at < now - BACKLOG_FRESH_S:
            stale.append(process)
        else:
            longest = max(longest, wait)
    if stale:
        client().hdel(BACKLOG, *stale)
    return min(longest, db_refresh_s()) if longest >= BACKLOG_MIN_S else 0.0


def lease_span() -> timedelta:
    """One lease (LEASE_S) as a span of time: how long a renewal holds."""
    return timedelta(seconds=settings.PEARL["LEASE_S"])


def fence(node_id: int, channel: str, epoch: int) -> Node:
    """Epoch fencing: the node row, locked, if `channel` holds its lease and `epoch` is current; else refuse
    (a message of a superseded socket or of an earlier epoch changes nothing)."""
    node = locked(Node.objects.filter(pk=node_id)).first()
    if node is None:
        raise NotFound("unknown node")
    if node.agent_channel != channel:
        raise Superseded(f"another agent socket registered for node {node.name}; this one no longer counts")
    if epoch != node.epoch:
        raise StaleEpoch(f"epoch {epoch} is not node {node.name}'s current epoch {node.epoch}; apply the desired state")
    return node


def stored_report(message: Heartbeat) -> list[dict[str, Any]]:
    """The report as the row stores it (`Node.observed`)."""
    return [
        {
            "worker_id": w.worker_id,
            "role": w.role,
            "activity": w.activity,
            "state": w.state,
            "weight_version": w.weight_version,
            "endpoint": w.endpoint,
            "inflight": w.inflight,
            "generation": w.generation,
            "devices": w.devices,
        }
        for w in message.workers
    ]


def _as_compared(observed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A report as the unchanged check sees it: each worker's in-flight count only as idle or busy. A serving
    worker's count moves on nearly every beat, so with the count in it almost every heartbeat of a loaded
    cluster was a database transaction. What acts on it needs only idleness (the drivers' routing facts,
    the executor's drained checks); the exact count only breaks ties in the planner's choice of survivors,
    which then uses the count of the node's last written report (it is written with any other change)."""
    return [o | {"inflight": min(int(o.get("inflight", 0)), 1)} for o in observed]


def _digest(generation: int, compared: list[dict[str, Any]]) -> str:
    """A report (the generation it applied, its workers `_as_compared`), as one short string."""
    body = json.dumps([generation, compared], sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(body.encode(), digest_size=16).hexdigest()


def redis_up() -> bool:
    try:
        return bool(client().ping())
    except redis.RedisError:
        return False


def renew_on_commit(node: Node, *, digest: str) -> None:
    """After commit, Redis renews the lease the row now holds (same epoch, same base, same socket) until
    LEASE_S after the commit (not after the heartbeat began: a commit that waited must not renew into the
    past)."""
    record = Holder(
        epoch=node.epoch,
        base=iso(node.lease_expires),
        digest=digest,
        channel=node.agent_channel,
        generation=node.generation,
    )
    node_id = node.pk
    transaction.on_commit(lambda: renew_quietly(node_id, expires=time.time() + lease_s(), record=record))


def renew_unchanged_report(*, node_id: int, message: Heartbeat, channel: str) -> int | None:
    """The heartbeat that reports what the database already holds: its lease is renewed in Redis, and no row
    is written (one read, no transaction), except the coarse row lease when less than one LEASE_S of it is
    left (one UPDATE, at most once per DB_REFRESH_S). None: anything differs (another socket, another epoch,
    a recovering node, a new report (beyond its in-flight counts: `_as_compared`), a record Redis lacks or
    that extends another row lease): the full, locked path decides, exactly as before. Returns the node's
    desired-state generation when it renewed."""
    row = (
        Node.objects.filter(pk=node_id)
        .only("id", "epoch", "agent_channel", "generation", "applied_generation", "status", "observed", "lease_expires")
        .first()
    )
    if (
        row is None
        or row.agent_channel != channel
        or row.epoch != message.epoch
        or row.status == NodeStatus.NOT_READY
        or row.lease_expires is None
    ):
        return None
    compared = _as_compared(stored_report(message))
    applied = min(message.generation, row.generation)
    if row.applied_generation != applied or _as_compared(row.observed or []) != compared:
        return None
    digest = _digest(message.generation, compared)
    now = timezone.now()
    expires = now.timestamp() + lease_s()
    current = Holder(
        epoch=row.epoch, base=iso(row.lease_expires), digest=digest, channel=channel, generation=row.generation
    )
    try:
        record = holder(node_id)
        if record is None or not record.extends(current):
            return None
        if (row.lease_expires - now).total_seconds() >= lease_s():
            # a generation mirror behind the row's (its write after a bump failed) is repaired here
            renew(node_id, expires=expires, record=current if record.generation < row.generation else None)
            return row.generation
        new_lease = coarse_row_lease(now)  # the coarse last-seen: one fenced UPDATE, no transaction block
        written = Node.objects.filter(
            pk=node_id, epoch=row.epoch, agent_channel=channel, lease_expires=row.lease_expires
        ).update(last_heartbeat=now, lease_expires=new_lease)
        if not written:
            return None
        renew(node_id, expires=expires, record=dataclasses.replace(current, base=iso(new_lease)))
    except redis.RedisError:
        return None  # the database path renews the row's exact lease, as without Redis
    return row.generation


def report_digest(message: Heartbeat) -> str:
    """What identifies a heartbeat's report (its workers and the generation it applied): an agent socket
    compares it with its last accepted one before trying `renew_in_redis`."""
    return _digest(message.generation, _as_compared(stored_report(message)))


async def renew_in_redis(*, node_id: int, message: Heartbeat, channel: str, digest: str) -> int | None:
    """The agent socket's heartbeat that repeats its last accepted report, on the server's event loop: no
    database query, one Redis round trip (`renew_unchanged`: this socket, this epoch, this report, a
    live Redis lease whose row lease needs no refresh yet). Returns the node's desired-state generation
    (Redis' mirror of the row's), or None: anything differs, or Redis failed, and
    `heartbeat.record_heartbeat` decides.
    Fencing is unchanged: a new registration, a fenced or lost node, a revoked token, a report the database
    has not taken: each has a record that does not match (or none)."""
    try:
        return await renew_unchanged(node_id, epoch=message.epoch, channel=channel, digest=digest, now=time.time())
    except (redis.RedisError, OSError, TimeoutError) as exc:
        log.debug("node %s: Redis renewal failed, the database path renews: %s", node_id, exc)
        return None
