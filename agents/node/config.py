"""The node agent's configuration (what `python -m agents.node` parses, or a caller builds)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class AgentConfig:
    control_plane: str
    token: str
    node: str
    pool: str = "reserved"
    hardware: str = "H800"
    slots: int = 1
    engine: str = "emulated"
    time_factor: float = 1.0
    interference: float = 1.0  # emulated engines: prefill next to running decodes costs this × its roofline time
    state_dir: Path = field(default_factory=lambda: Path("./.pearl-agent"))
    dataplane_secret: str = ""
    dataplane_port: int = 0
    drain_timeout_s: float = 10.0
    memory_mb: int = 0
