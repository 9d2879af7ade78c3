"""One error shape for the whole API: {"error": code, "field": name|null, "detail": sentence}.

DRF exceptions and service errors go through `exception_handler`; errors Django raises before a view
runs (an oversized or malformed request, an unknown URL) go through `json_error_view`, wired as the
URLconf's handler400/403/404 so they get the same shape instead of an HTML page.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.db import DataError
from django.http import Http404, HttpRequest, JsonResponse
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from controlplane.services.errors import ServiceError
from controlplane.services.retry import is_transient

log = logging.getLogger(__name__)


class ErrorSerializer(serializers.Serializer):
    """The body of every 4xx answer (documented on every operation of the schema)."""

    error = serializers.CharField(help_text="machine-readable code, e.g. invalid, not_found, conflict, too_large")
    field = serializers.CharField(allow_null=True, help_text="the offending field or parameter, if one")
    detail = serializers.CharField(help_text="what was wrong, in one sentence")
    # DRF's metaclass moves declared fields off the class, so this does not shadow Serializer.errors at run time
    errors = serializers.JSONField(  # type: ignore[assignment]
        required=False, help_text="every field error (validation failures only)"
    )


def error_body(code: str, detail: str, field: str | None = None) -> dict[str, Any]:
    return {"error": code, "field": field, "detail": detail}


def _first_field(detail: Any) -> tuple[str | None, str]:
    if isinstance(detail, dict):
        for key, value in detail.items():
            _, msg = _first_field(value)
            return (None if key == "non_field_errors" else str(key)), msg
    if isinstance(detail, list) and detail:
        return _first_field(detail[0])
    return None, str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ServiceError):
        return Response(error_body(exc.code, exc.message, exc.field), status=exc.status)
    if isinstance(exc, exceptions.ValidationError):
        field, msg = _first_field(exc.detail)
        detail = f"{field}: {msg}" if field else msg
        return Response(error_body("invalid", detail, field) | {"errors": exc.detail}, status=400)
    if isinstance(exc, Http404):
        return Response(error_body("not_found", str(exc) or "not found"), status=404)
    if is_transient(exc):  # a deadlock victim (rare: see the lock order in services/locks.py); rolled back
        log.warning("a request lost a database deadlock: %s", str(exc).splitlines()[0])
        return Response(
            error_body("conflict", "a concurrent change aborted this one; nothing was changed; send it again"),
            status=409,
        )
    if isinstance(exc, DataError):  # a value the database cannot hold: bad input that slipped past parsing
        log.warning("database refused a value: %s", exc)
        return Response(error_body("invalid", "a value is out of range for the database"), status=400)
    response = drf_handler(exc, context)
    if response is None:
        return None
    codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
    shown = exc.detail if isinstance(exc, exceptions.APIException) else "error"
    response.data = error_body(codes if isinstance(codes, str) else "error", str(shown) or "error")
    if response.status_code == status.HTTP_401_UNAUTHORIZED:
        response.data["detail"] = response.data["detail"] or "authentication required"
    return response


def json_error_view(status_code: int, code: str, default: str) -> Callable[..., JsonResponse]:
    """A URLconf error handler (handler400/403/404) that answers JSON in the API's shape."""

    def view(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
        if isinstance(exception, RequestDataTooBig):
            return JsonResponse(error_body("too_large", "request body is too large"), status=413)
        detail = default if status_code != 404 else f"no such URL: {request.path[:200]}"
        return JsonResponse(error_body(code, detail), status=status_code)

    return view


bad_request = json_error_view(400, "bad_request", "malformed request")
permission_denied = json_error_view(403, "forbidden", "permission denied")
page_not_found = json_error_view(404, "not_found", "not found")
