"""JSON only, bounded in size and nesting depth: an oversized body is a 413, a deep, malformed or
non-finite one a 400, any other media type a 415 (DRF's default when no parser matches)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser

from controlplane.core.wire import loads

MAX_BODY_BYTES = 64 * 1024


class PayloadTooLarge(APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = f"request body is larger than {MAX_BODY_BYTES} bytes"
    default_code = "too_large"


class BoundedJSONParser(JSONParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        raw = stream.read(MAX_BODY_BYTES + 1) if stream is not None else b""
        if len(raw) > MAX_BODY_BYTES:
            raise PayloadTooLarge()
        if not raw:
            return {}
        return loads(raw, max_depth=settings.PEARL["MAX_JSON_DEPTH"], error=ParseError)
