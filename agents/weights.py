"""Versioned weight snapshots: written by the trainer, served over HTTP, pulled by workers.

Workers pull them with the client family's `agents.worker_client.fetch_weights`. Pull-based and lazy
(RLBoost/PEARL): a worker that starts or returns asks the store for the latest version (or one at least
`min_weight_version`) and installs it; nothing is pushed. Snapshots are safetensors files written
atomically (temp + rename) with the version in their metadata; network bytes are only ever parsed by
safetensors (never pickle, never torch.load).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from aiohttp import web

from agents import dataplane as dp
from agents.engines.base import EngineNotFound
from controlplane.core.wire import ErrorReply

_NAME = re.compile(r"^v(\d{8})\.safetensors$")


def atomic_write(path: Path, data: bytes) -> None:
    """Write to a temp file, fsync, rename: a crash leaves either the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def safetensors_header(data: bytes) -> dict[str, Any]:
    """Parse and bounds-check a safetensors header without materialising tensors."""
    import json

    if len(data) < 8:
        raise ValueError("not safetensors: too short")
    n = int.from_bytes(data[:8], "little")
    if n <= 0 or 8 + n > len(data) or n > 100 << 20:
        raise ValueError("not safetensors: bad header length")
    header = json.loads(data[8 : 8 + n])
    if not isinstance(header, dict):
        raise ValueError("not safetensors: header is not an object")
    body = len(data) - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        if not 0 <= start <= end <= body:
            raise ValueError(f"not safetensors: tensor {name} out of bounds")
    return header


class WeightStore:
    """A directory of `vNNNNNNNN.safetensors`; the highest number is the latest version."""

    def __init__(self, root: Path, keep: int = 4) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.keep = keep

    def versions(self) -> list[int]:
        return sorted(int(m.group(1)) for p in self.root.iterdir() if (m := _NAME.match(p.name)))

    def latest(self) -> int:
        v = self.versions()
        return v[-1] if v else 0

    def path(self, version: int) -> Path:
        return self.root / f"v{version:08d}.safetensors"

    def publish(self, version: int, tensors: dict[str, torch.Tensor]) -> Path:
        from safetensors.torch import save as st_save

        if version <= self.latest() and self.path(version).exists():
            raise ValueError(f"weight version {version} already published")
        path = self.path(version)
        atomic_write(path, st_save(tensors, metadata={"version": str(version)}))
        for old in self.versions()[: -self.keep]:
            self.path(old).unlink(missing_ok=True)
        return path

    def read(self, version: int) -> bytes:
        path = self.path(version)
        if not path.exists():
            raise EngineNotFound(f"unknown weight version {version}")
        return path.read_bytes()


def _error(status: int, why: str) -> web.Response:
    return web.json_response(dp.DATA_PLANE.dump(ErrorReply(detail=why)), status=status)


def weight_routes(store: WeightStore, may_pull: Callable[[str], bool]) -> web.Application:
    """A sub-app: GET /latest -> {"version"}, GET /{version} -> safetensors bytes. Bearer auth:
    `may_pull(token)` decides (the trainer: its own secret, or a scoped token of its job)."""

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        header = request.headers.get(dp.AUTH_HEADER, "")
        if not (header.startswith("Bearer ") and may_pull(header[7:])):
            return _error(401, "missing or bad weights token")
        return await handler(request)

    async def latest(_request: web.Request) -> web.Response:
        versions = store.versions()
        return web.json_response(dp.DATA_PLANE.dump(dp.WeightsIndex(versions[-1] if versions else 0, versions)))

    async def one(request: web.Request) -> web.StreamResponse:
        raw = request.match_info["version"]
        if not raw.isdigit():
            return _error(400, "version must be an integer")
        version = int(raw)
        path = store.path(version)
        if not path.exists():
            return _error(404, f"unknown weight version {version}")
        return web.FileResponse(
            path, headers={dp.WEIGHT_VERSION_HEADER: str(version), "Content-Type": "application/octet-stream"}
        )

    app = web.Application(middlewares=[auth])
    app.router.add_get("/latest", latest)
    app.router.add_get("/{version}", one)
    return app
