"""The node leases as Redis holds them between database writes (written by `services.leases`): read here
for the heartbeat ages the dashboard and the API show."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from functools import lru_cache
from typing import cast

import redis
from django.conf import settings

LEASES = "pearl:leases"  # sorted set: node id -> expiry (Unix seconds) of its latest renewal


def lease_s() -> float:
    return float(settings.PEARL["LEASE_S"])


@lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1, health_check_interval=30)


def client() -> redis.Redis:
    """The Redis of this process' settings (db 2: the channel layer uses 1, Celery 0)."""
    return _client(f"{settings.REDIS_URL.rstrip('/')}/2")


def last_seen(node_ids: Iterable[int]) -> dict[int, datetime]:
    """Node id -> last renewal seen in Redis (expiry − LEASE_S), for the nodes that have one; {} if Redis is
    unreachable (the rows' coarse last-seen then stands)."""
    ids = [str(i) for i in node_ids]
    if not ids:
        return {}
    try:
        scores = client().zmscore(LEASES, ids)
    except redis.RedisError:
        return {}
    span = lease_s()
    return {int(i): datetime.fromtimestamp(s - span, tz=UTC) for i, s in zip(ids, scores) if s is not None}


def all_last_seen() -> dict[int, float]:
    """Every node's last renewal in Redis (Unix seconds); {} if Redis is unreachable."""
    try:
        # redis-py types every member as any reply; with scores each is (member bytes, score)
        pairs = cast("list[tuple[bytes, float]]", client().zrange(LEASES, 0, -1, withscores=True))
    except redis.RedisError:
        return {}
    span = lease_s()
    return {int(m): float(s) - span for m, s in pairs}


def effective_last_seen(rows: Mapping[int, datetime | None]) -> dict[int, datetime | None]:
    """Node id -> its effective last-seen: the later of the row's coarse `last_heartbeat` and its Redis
    renewal, read for all the nodes in one round trip; the row's alone when Redis is unreachable."""
    renewed = last_seen(rows)
    return {i: max(filter(None, (hb, renewed.get(i))), default=None) for i, hb in rows.items()}
