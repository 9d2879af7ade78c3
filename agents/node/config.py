"""The node agent's configuration (what `python -m agents.node` parses, or a caller builds)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

WILDCARDS = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """True for a loopback literal (any of 127/8, ::1) or `localhost`: only this host can reach it."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    """`host` as it goes in a URL (IPv6 literals in brackets)."""
    return f"[{host}]" if ":" in host else host


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
    # where the agent's data plane, its workers and its trainers listen, and the address they are reached at
    # from other hosts (the rollout driver, a decode worker pulling KV, the control plane): the node's own
    # address when agents run on separate hosts (the Ray adapter passes the node's Ray IP)
    bind_address: str = "127.0.0.1"
    advertise_address: str = ""  # default: bind_address (required when that is a wildcard)

    def __post_init__(self) -> None:
        self.bind_address = self.bind_address.strip()
        self.advertise_address = self.advertise_address.strip()
        if not self.advertise_address:
            if self.bind_address in WILDCARDS:
                raise ValueError(f"bind address {self.bind_address!r} is a wildcard: give an advertise address")
            self.advertise_address = self.bind_address
        if not is_loopback(self.bind_address) and not self.dataplane_secret:
            # other hosts can reach what is bound there: the agent's data plane must require a secret
            raise ValueError(
                f"refusing to bind {self.bind_address}: off loopback the data plane needs a secret "
                "(set PEARL_DATAPLANE_SECRET)"
            )

    @property
    def advertised_host(self) -> str:
        """The advertise address as it goes in a URL."""
        return url_host(self.advertise_address)
