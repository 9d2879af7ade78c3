"""JSON only, bounded in size and nesting depth (oversized or deeply nested bodies get a 4xx)."""
from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

MAX_BODY_BYTES = 64 * 1024


def json_depth(value: Any, limit: int) -> int:
    """Depth of a parsed JSON value, iteratively (a hostile body cannot blow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((c, d + 1) for c in (v.values() if isinstance(v, dict) else v))
    return deepest


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):  # type: ignore[override]
        raw = stream.read(MAX_BODY_BYTES + 1) if stream is not None else b""
        if len(raw) > MAX_BODY_BYTES:
            raise ParseError(f"request body is larger than {MAX_BODY_BYTES} bytes")
        if not raw:
            return {}
        try:
            data = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ParseError(f"malformed JSON: {exc}") from None
        limit = settings.PEARL["MAX_JSON_DEPTH"]
        if json_depth(data, limit) > limit:
            raise ParseError(f"JSON nested deeper than {limit} levels")
        return data
