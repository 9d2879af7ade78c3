"""Node leases renewed in Redis, so that a heartbeat that changes nothing costs no database transaction.

The lease of record stays in the database (`Node.lease_expires`, `Node.last_heartbeat`, the epoch); Redis
only holds the fine-grained renewals between two database writes, and nothing there is the only copy of
durable state:

- `pearl:leases` (sorted set): node id -> expiry (Unix seconds) of its latest renewal. The sweep reads the
  expired members only (ZRANGEBYSCORE), so it costs in proportion to the nodes that expired.
- `pearl:lease:holders` (hash): node id -> JSON {epoch, base, digest}: the Redis renewals extend the
  database lease `base` (the row's `lease_expires` as written) of that `epoch`, and `digest` is the last
  report the database accepted in full. A record whose epoch or base is not the row's is ignored: the
  row was written behind Redis' back (a new registration, a fenced node, an operator), so the row wins.
- `pearl:lease:boot` (string): Redis' generation, written by the sweeper. When it is missing, Redis was
  emptied (restart, flush): logged; no repair is needed (below).

While Redis renews, the row's lease is coarse: each database write sets it LEASE_S + DB_REFRESH_S ahead, and
a heartbeat rewrites it (last-seen included) when less than one LEASE_S of it is left, i.e. at most once per
DB_REFRESH_S per node. So the row's lease always reaches at least as far as the Redis renewal (the grace is
built in): a Redis restart, an empty Redis or Redis down makes no node look lost, the row's coarse lease holds
until the agent's next heartbeat writes Redis again (or, with Redis down, the database as before, with the
exact lease). What an empty Redis costs is slower detection of nodes that died meanwhile (up to
LEASE_S + DB_REFRESH_S after their last row write) and one database heartbeat per node to rebuild its record.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import cast

import redis
from django.conf import settings

from controlplane.selectors.leases import LEASES, all_last_seen, client, last_seen, lease_s

__all__ = ["LEASES", "all_last_seen", "client", "last_seen", "lease_s"]

log = logging.getLogger(__name__)

HOLDERS = "pearl:lease:holders"
BOOT = "pearl:lease:boot"


def db_refresh_s() -> float:
    """How far beyond one lease the row's coarse lease reaches: the longest a node goes without a row write."""
    return float(settings.PEARL.get("LEASE_DB_REFRESH_S", 4 * lease_s()))


@dataclass(frozen=True)
class Holder:
    """What Redis knows of a node's lease: the epoch and row lease it extends, the last clean report."""

    epoch: int
    base: str  # the row's lease_expires, ISO, as last written
    digest: str  # of the last report the database took in full ("" if none yet at this epoch)


def iso(value: datetime | None) -> str:
    return value.isoformat() if value else ""


def holder(node_id: int) -> Holder | None:
    """The node's record, or None (none, unreadable). Raises redis.RedisError when Redis is unreachable."""
    raw = client().hget(HOLDERS, str(node_id))
    if not raw:
        return None
    try:
        d = json.loads(raw)
        return Holder(epoch=int(d["epoch"]), base=str(d["base"]), digest=str(d["digest"]))
    except (ValueError, KeyError, TypeError):
        return None


def renew(node_id: int, *, expires: float, record: Holder | None = None) -> None:
    """Renew the node's lease in Redis until `expires` (and replace its record). Raises redis.RedisError."""
    pipe = client().pipeline(transaction=False)
    pipe.zadd(LEASES, {str(node_id): expires})
    if record is not None:
        body = {"epoch": record.epoch, "base": record.base, "digest": record.digest}
        pipe.hset(HOLDERS, str(node_id), json.dumps(body))
    pipe.execute()


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
    """The row lease written while Redis renews: one lease plus the refresh span ahead."""
    return now + timedelta(seconds=lease_s() + db_refresh_s())
