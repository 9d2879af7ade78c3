"""vLLM's KV hand-off between PEARL workers: the `NixlConnector` settings and the telemetry it yields.

Why these settings (vLLM's `KVTransferConfig`):
- `kv_role="kv_both"`: PEARL flips a worker's role in place (`set_role`, no restart), so every vLLM
  worker can produce and consume KV; the request's `kv_transfer_params` decide which half it runs.
- `kv_load_failure_policy="fail"`: a decode whose pull fails ends at once with finish reason `error`,
  and the worker answers 502. The rollout driver then runs the turn again where the loop routes it
  (a recompute PEARL sees and accounts), instead of a decode worker prefilling behind its back.
- `kv_lease_duration`: how long the prefill engine pins the blocks for a decode that has not pulled
  yet. It outlives PEARL's own lease on the descriptor (`KVStore.lease_s`) by `LEASE_MARGIN_S`, so a
  descriptor the driver can still obtain always points at blocks that are still there; an expired
  descriptor is a 404, never a read of reused blocks.
- The side channel (ZMQ handshake) host and port are per worker: `PEARL_NIXL_SIDE_CHANNEL=host:port`
  from the agent, else loopback and a free port; the engine passes them on to vLLM's engine core as
  `VLLM_NIXL_SIDE_CHANNEL_HOST/PORT`.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import time
from collections.abc import Callable
from typing import Any

from controlplane.core import telemetry as tm

LEASE_MARGIN_S = 30
FAILURE_POLICY = "fail"


def free_port(host: str = "127.0.0.1", low: int = 20000, high: int = 32000) -> int:
    """A port the handshake listener can bind tens of seconds later, when the engine core is up: drawn
    below the kernel's ephemeral range (32768+), where outgoing connections would take one bound by
    `bind(0)` and closed again."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(low, high)
        with socket.socket() as s, contextlib.suppress(OSError):
            s.bind((host, port))
            return port
    raise OSError(f"no free port in [{low}, {high}) on {host}")


def side_channel(host: str | None = None, port: int | None = None) -> tuple[str, int]:
    """The NIXL handshake address this worker announces in its `kv_transfer_params`: given, else the
    agent's `PEARL_NIXL_SIDE_CHANNEL` (host:port), else loopback and a free port. (Never vLLM's own
    variables: this process sets those for the engine core it spawns.)"""
    given = os.environ.get("PEARL_NIXL_SIDE_CHANNEL", "")
    if given and not (host or port):
        h, _, p = given.rpartition(":")
        host, port = h or None, int(p)
    host = host or "127.0.0.1"
    return host, port or free_port(host)


def kv_transfer_config(connector: str, lease_s: float) -> Any:
    from vllm.config import KVTransferConfig

    extra: dict[str, Any] = {"kv_lease_duration": int(lease_s) + LEASE_MARGIN_S}
    if connector.startswith("Nixl"):
        extra["backends"] = os.environ.get("PEARL_NIXL_BACKENDS", "UCX").split(",")
    return KVTransferConfig(
        kv_connector=connector,
        kv_role="kv_both",
        kv_load_failure_policy=FAILURE_POLICY,
        kv_connector_extra_config=extra,
    )


def kv_bytes_per_token(llm: Any) -> int:
    """Bytes of K and V one token holds across all layers (what a hand-off moves per prompt token)."""
    mc, pc = llm.model_config, llm.vllm_config.parallel_config
    itemsize = int(getattr(mc.dtype, "itemsize", 2))
    return 2 * mc.get_num_layers(pc) * mc.get_num_kv_heads(pc) * mc.get_head_size() * itemsize


def block_count(params: dict[str, Any]) -> int:
    """Blocks a decode pulls: `remote_block_ids` is one list per KV cache group (or a flat list)."""
    ids = params.get("remote_block_ids") or []
    return sum(len(g) for g in ids) if ids and isinstance(ids[0], list) else len(ids)


def transfer_logger(
    sink: Callable[[tm.TelemetryRecord], None], job: Callable[[], str], worker: int, counts: dict[str, int]
) -> Any:
    """A vLLM stat-logger factory that turns each NIXL transfer the engine finished (its bytes and its
    duration, as NIXL's own telemetry measured them) into a PEARL KV_TRANSFER record, and counts the
    failed pulls and the leases that expired into `counts`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class KVTransferLog(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(
            self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0
        ) -> None:
            data = getattr(scheduler_stats, "kv_connector_stats", None) or {}
            for size, seconds in zip(data.get("bytes_transferred", []), data.get("transfer_duration", [])):
                sink(
                    tm.kv_transfer(
                        time_s=time.time(), job=job(), worker=worker, kv_bytes=int(size), duration_s=float(seconds)
                    )
                )
            counts["bytes_transferred"] = counts.get("bytes_transferred", 0) + sum(data.get("bytes_transferred", []))
            for key in ("num_failed_transfers", "num_failed_handshakes", "num_kv_expired_reqs"):
                counts[key] = counts.get(key, 0) + len(data.get(key, []))

        def log_engine_initialized(self) -> None:
            pass

    return KVTransferLog
