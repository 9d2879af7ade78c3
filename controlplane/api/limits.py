"""ASGI guard in front of Django: request bodies are bounded before anything reads them.

Django answers an oversized body with plain text (or an HTML 400 when the size is only found while
parsing), and a lying or missing Content-Length is only caught while reading (GHSA-933h-hp56-hf7m).
This counts the bytes actually received, so every oversized body gets a JSON 413 in the API's error
shape, whatever the headers say, and nothing downstream ever sees it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def _answer(send: Send, status: int, code: str, detail: str) -> None:
    body = json.dumps({"error": code, "field": None, "detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """Buffer an HTTP request body up to `limit` bytes, then replay it to `app`; beyond: 413."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None:
            if not declared.isdigit() or len(declared) > 18:
                return await _answer(send, 400, "bad_request", "Content-Length must be a non-negative integer")
            if int(declared) > self.limit:
                return await _answer(send, 413, "too_large", f"request body is larger than {self.limit} bytes")
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            body = message.get("body", b"")
            total += len(body)
            if total > self.limit:
                return await _answer(send, 413, "too_large", f"request body is larger than {self.limit} bytes")
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # later reads wait for the disconnect, as Django expects

        return await self.app(scope, replay, send)
