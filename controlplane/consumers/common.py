"""What the three sockets share: the close codes, the bearer token of a socket's scope, and how a socket calls a
write use case (on the database thread, a deadlock victim run again)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

from channels.db import database_sync_to_async

from controlplane.services.retry import retry_transient

R = TypeVar("R")

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_PROTOCOL = 4400


def service(fn: Callable[..., R], *, waited: Callable[[float], None] | None = None) -> Callable[..., Awaitable[R]]:
    """A write use case called from a socket, in a worker thread; a deadlock victim runs again. `waited`, if
    given, is told how long the call queued for the database thread (the agent link publishes it: the
    sweeper defers expiries by it)."""
    if waited is None:
        return database_sync_to_async(partial(retry_transient, fn))
    report = waited

    async def call(*args: Any, **kwargs: Any) -> R:
        queued = time.monotonic()

        def run() -> R:
            report(time.monotonic() - queued)
            return retry_transient(fn, *args, **kwargs)

        return await database_sync_to_async(run)()

    return call


def bearer_token(scope: dict[str, Any]) -> str:
    for name, value in scope.get("headers", []):
        if name == b"authorization":
            text = value.decode("latin-1")
            if text.lower().startswith("bearer "):
                return text[7:].strip()
    return ""
