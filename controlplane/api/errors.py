"""One error shape for the whole API: {"error": code, "field": name|null, "detail": sentence}."""
from __future__ import annotations

from typing import Any

from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_handler

from controlplane.services.errors import ServiceError


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
        return Response({"error": exc.code, "field": exc.field, "detail": exc.message}, status=exc.status)
    if isinstance(exc, exceptions.ValidationError):
        field, msg = _first_field(exc.detail)
        detail = f"{field}: {msg}" if field else msg
        return Response({"error": "invalid", "field": field, "detail": detail, "errors": exc.detail}, status=400)
    if isinstance(exc, Http404):
        return Response({"error": "not_found", "field": None, "detail": str(exc) or "not found"}, status=404)
    response = drf_handler(exc, context)
    if response is not None and isinstance(exc, exceptions.APIException):
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else "error"
        response.data = {"error": code, "field": None, "detail": str(exc.detail)}
    elif response is None:
        return None
    if response.status_code == status.HTTP_401_UNAUTHORIZED:
        response.data["detail"] = response.data.get("detail") or "authentication required"
    return response
