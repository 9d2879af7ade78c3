"""What the test process runs against (its database and Redis) and the environment its child servers get."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def redis_url() -> str:
    from django.conf import settings

    return str(settings.REDIS_URL)


def redis_available() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(redis_url(), socket_connect_timeout=0.5).ping())
    except Exception:
        return False


def fresh_leases() -> None:
    """The lease tests' precondition: Redis answers (else the test is skipped) and holds no lease records."""
    import pytest

    from controlplane.services import leases

    if not redis_available():
        pytest.skip("Redis is not reachable")
    leases.client().delete(leases.LEASES, leases.HOLDERS, leases.BOOT, leases.BACKLOG)


def postgres_in_use() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


def database_url_for_children() -> str:
    """The URL of the database the test process is using right now (the test database)."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or ""
    pw = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    auth = f"{user}{pw}@" if user else ""
    return f"postgres://{auth}{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a server the test starts: the test's database and Redis, testing mode on."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url_for_children(),
        REDIS_URL=redis_url(),
        PEARL_TESTING="1",
        DEBUG="0",
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env
