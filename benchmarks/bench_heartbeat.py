"""CPU per heartbeat that changes nothing (issue 22, item 1), in one process: K agent sockets on the real ASGI
app (WebsocketCommunicator: the real consumer, the real Redis channel layer and leases, PostgreSQL), each
registered and its report taken once by the database, then N identical heartbeats each. Per heartbeat: CPU of
this process (every thread: the event loop and the database thread) and of Redis (INFO cpu), SQL statements
any thread ran, Redis commands (INFO commandstats). No network, no Daphne: what the heartbeat's handling
itself costs, side by side for two checkouts (`--code DIR`: the control plane imported from there).

Usage: DATABASE_URL=postgres://.../db .venv/bin/python benchmarks/bench_heartbeat.py [--agents 16]
       [--beats 200] [--code DIR] [--label NAME]
The database is dropped and created. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from load_agents import fixed_report  # this script's directory is on sys.path

HERE = Path(__file__).resolve().parent


def redis_info(port: int) -> tuple[dict[str, int], float]:
    """(commands run so far, by command; Redis' CPU seconds so far)."""
    import redis

    r = redis.Redis(port=port)
    calls = {k: int(v["calls"]) for k, v in r.info("commandstats").items()}
    cpu = r.info("cpu")
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


async def run(agents: list[list[Any]], beats: int, redis_port: int) -> dict[str, Any]:
    from channels.testing import WebsocketCommunicator
    from django.db.backends import utils as db_utils

    from pearl_site.asgi import application

    statements = [0]
    execute = db_utils.CursorWrapper.execute

    def counted(self: Any, sql: str, params: Any = None) -> Any:
        statements[0] += 1
        return execute(self, sql, params)

    db_utils.CursorWrapper.execute = counted  # type: ignore[method-assign,assignment]

    async def settle(ws: WebsocketCommunicator) -> None:
        """A malformed frame: its answer comes once everything sent before it was handled."""
        await ws.send_to(text_data='{"type": "probe"}')
        while True:
            msg = await ws.receive_json_from(timeout=120)
            if msg.get("type") == "error" and msg.get("code") == "bad_message":
                return

    socks: list[tuple[WebsocketCommunicator, dict[str, Any]]] = []
    for name, token, workers in agents:
        ws = WebsocketCommunicator(
            application, "/ws/agent/", headers=[(b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())]
        )
        assert (await ws.connect())[0]
        slots = [{"index": s, "hardware": "H800", "memory_mb": 81920} for s in range(2)]
        register = {"type": "register", "node": name, "pool": "reserved", "hardware": "H800", "incarnation": "b"}
        await ws.send_json_to({**register, "slots": slots})
        reg = await ws.receive_json_from(timeout=60)
        desired = await ws.receive_json_from(timeout=60)
        beat = {
            "type": "heartbeat",
            "epoch": reg["epoch"],
            "generation": desired["generation"],
            "workers": fixed_report(workers, desired["generation"]),
        }
        await ws.send_json_to(beat)  # the database takes the report once
        await settle(ws)
        socks.append((ws, beat))
    calls0, rcpu0 = redis_info(redis_port)
    sql0, cpu0, t0 = statements[0], time.process_time(), time.perf_counter()
    for _ in range(beats):
        for ws, beat in socks:
            await ws.send_json_to(beat)
        await asyncio.gather(*(settle(ws) for ws, _ in socks[:1]))  # keep the queues short
    for ws, _ in socks:
        await settle(ws)
    cpu, wall, sql = time.process_time() - cpu0, time.perf_counter() - t0, statements[0] - sql0
    calls1, rcpu1 = redis_info(redis_port)
    for ws, _ in socks:
        await ws.disconnect()
    n = beats * len(socks)
    probes = beats + len(socks)  # each malformed frame: one answer, no query, no Redis command
    return {
        "heartbeats": n,
        "probes": probes,
        "cpu_ms_per_heartbeat": round(1000 * cpu / n, 3),
        "redis_cpu_ms_per_heartbeat": round(1000 * (rcpu1 - rcpu0) / n, 3),
        "wall_ms_per_heartbeat": round(1000 * wall / n, 3),
        "sql_per_heartbeat": round(sql / n, 3),
        "redis_commands_per_heartbeat": round((sum(calls1.values()) - sum(calls0.values())) / n, 2),
        "redis_commands_by": {
            k.removeprefix("cmdstat_"): round((v - calls0.get(k, 0)) / n, 2)
            for k, v in calls1.items()
            if v - calls0.get(k, 0) >= n / 100
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--beats", type=int, default=200)
    p.add_argument("--code", default=str(HERE.parent))
    p.add_argument("--label", default="")
    args = p.parse_args()
    db_url = os.environ.get("DATABASE_URL", "")
    if not db_url.startswith("postgres"):
        raise SystemExit("set DATABASE_URL to a PostgreSQL database this benchmark may drop and create")
    from bench_load import seed
    from harness import setup, start_redis, stop

    redis, port = start_redis()
    try:
        code = Path(args.code).resolve()

        setup(db_url, f"redis://127.0.0.1:{port}", root=code)

        agents, _job = seed(args.agents)
        out = asyncio.run(run(agents, args.beats, port))
    finally:
        stop([redis])
    out.update(label=args.label or str(code), agents=args.agents, load_average=[round(x, 1) for x in os.getloadavg()])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
