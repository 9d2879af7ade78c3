"""The database's part of the health check."""

from __future__ import annotations

from django.db import connection


def database_answers() -> None:
    """One round trip (`SELECT 1`); raises when the database does not answer."""
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
