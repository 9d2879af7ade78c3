"""Strict parsing of everything a URL carries: path ids, query filters, times, limit/offset.

A URL is attacker-controlled input that reaches SQL, so every value is checked here before a query
is built: ids are ASCII digits within a 63-bit range (`str.isdigit` also accepts '²'), text filters
carry no control or surrogate characters (PostgreSQL refuses NUL), times are real ISO 8601 instants
that convert to UTC, and pages have maxima. Anything else is a 400 that names the parameter.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

from controlplane.models import NAME_RE
from controlplane.services.errors import InvalidInput

MAX_ID = 2**63 - 1
MAX_TEXT = 200
MAX_LIMIT = 1000
MAX_OFFSET = 2**31 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")  # ASCII only: re's \d would accept other scripts' digits
_NAME = re.compile(NAME_RE)
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def parse_id(value: Any, field: str = "id") -> int:
    """A positive integer id; anything else is a 400 that names the field."""
    text = str(value)
    if not _DIGITS.fullmatch(text) or not 1 <= int(text) <= MAX_ID:
        raise InvalidInput(f"{field} must be a positive integer, got {text[:40]!r}", field=field)
    return int(text)


def parse_count(value: Any, field: str, *, lo: int, hi: int) -> int:
    """A non-negative integer within [lo, hi] (limits, offsets)."""
    text = str(value)
    if not _DIGITS.fullmatch(text) or not lo <= int(text) <= hi:
        raise InvalidInput(f"{field} must be an integer from {lo} to {hi}, got {text[:40]!r}", field=field)
    return int(text)


def text_param(request: Request, name: str, *, max_len: int = MAX_TEXT) -> str | None:
    """A free-text filter: at most `max_len` characters, no control or surrogate characters."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    if len(raw) > max_len:
        raise InvalidInput(f"{name} is longer than {max_len} characters", field=name)
    if _BAD_CHARS.search(raw):
        raise InvalidInput(f"{name} contains a control character", field=name)
    return raw


def time_param(request: Request, name: str) -> datetime | None:
    """An ISO 8601 / RFC 3339 instant, as UTC (no offset = UTC). Impossible dates and offsets are
    refused; a real instant whose UTC form falls outside years 1..9999 (0001-01-01T00:00+05:00) is
    clamped to that range, which compares the same against every stored time."""
    if request.query_params.get(name) == "":
        raise InvalidInput(
            f"{name} must be a time such as 2025-01-31T12:00:00Z (leave it out for no bound)", field=name
        )
    raw = text_param(request, name, max_len=64)
    if raw is None:
        return None
    try:
        value = parse_datetime(raw.upper())  # RFC 3339 allows a lower-case t and z
    except ValueError as exc:
        raise InvalidInput(f"{name} is not a valid time ({exc}), got {raw!r}", field=name) from None
    if value is None:
        raise InvalidInput(f"{name} must be an ISO 8601 time such as 2025-01-31T12:00:00Z, got {raw!r}", field=name)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        edge = datetime.min if value.year < 5000 else datetime.max
        return edge.replace(tzinfo=UTC)


# Filters the schema documents with these same patterns; an empty value means no filter.
JOB_PATTERN = r"^(|[0-9]{1,19}|[a-z0-9][a-z0-9._-]{0,62})$"  # a job id or a job name
NAME_PATTERN = r"^(|[a-z0-9][a-z0-9._-]{0,62})$"
KIND_PATTERN = r"^[a-z0-9._-]{0,48}$"


def pattern_param(request: Request, name: str, pattern: str) -> str | None:
    """A filter that must match `pattern` (the same one the schema documents), else 400."""
    value = text_param(request, name)
    if value is not None and not re.fullmatch(pattern.strip("^$"), value):
        raise InvalidInput(f"{name} must match {pattern}, got {value[:40]!r}", field=name)
    return value


def name_param(request: Request, name: str) -> str | None:
    """A node (or other object) name filter."""
    return pattern_param(request, name, NAME_PATTERN)


def job_param(request: Request) -> int | str | None:
    """`?job=`: a job id (ASCII digits), a job name (what a job name may be), or None (no filter)."""
    job = text_param(request, "job", max_len=63)
    if job is None:
        return None
    if _DIGITS.fullmatch(job):
        return parse_id(job, "job")
    if not _NAME.fullmatch(job):
        raise InvalidInput(f"job must be a job id or a job name, got {job[:40]!r}", field="job")
    return job


class StrictLimitOffsetPagination(LimitOffsetPagination):
    """LimitOffset with maxima, and a 400 for a bad value instead of a silent default."""

    default_limit = 100
    max_limit = MAX_LIMIT

    def get_limit(self, request: Request) -> int:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        return parse_count(raw, self.limit_query_param, lo=1, hi=self.max_limit)

    def get_offset(self, request: Request) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is None:
            return 0
        return parse_count(raw, self.offset_query_param, lo=0, hi=MAX_OFFSET)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        params = super().get_schema_operation_parameters(view)
        for p in params:
            if p["name"] == self.limit_query_param:
                p["schema"].update(minimum=1, maximum=self.max_limit)
            elif p["name"] == self.offset_query_param:
                p["schema"].update(minimum=0, maximum=MAX_OFFSET)
        return params
