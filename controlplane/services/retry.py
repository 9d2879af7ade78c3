"""Transient database failures: a deadlock victim or a serialization failure is run again, whole, at an
entry point (a socket message, a task); an API call answers 409 instead (`api.errors`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import DatabaseError, connection

R = TypeVar("R")

log = logging.getLogger(__name__)

# PostgreSQL's deadlock_detected and serialization_failure: the transaction was rolled back as a whole
# and may simply run again (PostgreSQL manual, 13.2 and 13.3.4).
TRANSIENT_SQLSTATES = frozenset({"40P01", "40001"})


def is_transient(exc: BaseException) -> bool:
    """A database error that rolled its transaction back and that a retry of the whole use case may pass."""
    cause = exc.__cause__ or exc.__context__
    return isinstance(exc, DatabaseError) and getattr(cause, "sqlstate", None) in TRANSIENT_SQLSTATES


def retry_transient(fn: Callable[..., R], *args: Any, attempts: int = 4, **kwargs: Any) -> R:
    """Run a use case, running it again when the database aborted it as a deadlock victim or for a
    serialization failure. Only at an entry point (a socket message, a task): inside a caller's
    transaction nothing can be retried, and the error goes up to where it can."""
    for attempt in range(1, attempts + 1):
        try:
            return fn(*args, **kwargs)
        except DatabaseError as exc:
            if attempt == attempts or connection.in_atomic_block or not is_transient(exc):
                raise
            log.warning(
                "%s: %s; retrying (%d of %d)",
                getattr(fn, "__name__", fn),
                str(exc).splitlines()[0],
                attempt,
                attempts - 1,
            )
            time.sleep(0.01 * 2**attempt)
    raise AssertionError("unreachable")
