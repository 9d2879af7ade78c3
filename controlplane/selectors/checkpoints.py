"""A job's exported checkpoints as the API, the CLI and the job page show them, and one checkpoint's files
as the download streams them (only the kinds core.checkpoints allows: JSON, text and safetensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from controlplane.core.checkpoints import servable
from controlplane.models import Checkpoint


def checkpoint_dict(c: Checkpoint) -> dict[str, Any]:
    return {
        "step": c.step,
        "weight_version": c.weight_version,
        "written": c.written.isoformat(),
        "size_bytes": c.size_bytes,
        "path": c.path,
        "files": sorted(c.files),
        "tokenizer": c.tokenizer,
    }


def checkpoint_files(c: Checkpoint) -> list[tuple[str, Path, int]]:
    """(name, path, bytes) of each file of the checkpoint its manifest lists and the download may send, in
    name order; a file the manifest lists that is gone (retention removed it meanwhile) raises OSError."""
    out = []
    for name in sorted(c.files):
        if not servable(name):
            continue
        path = Path(c.path) / name
        out.append((name, path, path.stat().st_size))
    return out
