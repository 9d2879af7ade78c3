"""Hardening figures, load: N emulated agents heartbeating over real websockets and M dashboard clients
against the control plane (Daphne processes, a Celery worker + beat running the lease sweeper).

Heartbeat handling latency = agent sends a heartbeat -> the dashboard client receives that node's
`heartbeat` delta, which the control plane pushes after the heartbeat's transaction commits (so it
includes parsing, fencing, the lease write, the commit and the channel-layer fan-out). For each
(Daphne processes, N, M) step: p50/p95/max latency, heartbeats handled per second, and leases lost
(node.lease_expired events during the step; target 0). The largest N (and M) with p95 < 100 ms and no
lease lost is reported. The emulated agents run in this process: on a small machine they compete with
the server for the CPUs, which the figures include.

Usage: .venv/bin/python benchmarks/bench_load.py [--agents 50,100,200] [--dashboards 1,10] [--daphnes 1,2]
       [--period 1.0] [--duration 20] [--json]
DATABASE_URL selects the database (PostgreSQL recommended: every heartbeat is a row-locked write); by
default a temporary SQLite. Its own Redis (private port).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_controlplane import PY, ROOT, free_port, pct, wait_port


def setup(db_url: str, redis_url: str, tmp: Path) -> None:
    os.environ.update(DATABASE_URL=db_url, REDIS_URL=redis_url, PEARL_TESTING="1", DEBUG="0", PEARL_VAR_DIR=str(tmp))
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pearl_site.settings")
    if db_url.startswith("postgres"):
        import psycopg

        base, name = db_url.rsplit("/", 1)
        with psycopg.connect(base + "/postgres", autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            c.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def make_nodes(n: int, offset: int) -> list[tuple[str, str, list[int]]]:
    """n nodes with agent tokens and two workers each: (name, token, worker ids)."""
    from controlplane.core.agent_link import Register, SlotSpec
    from controlplane.models import AgentCredential
    from controlplane.services.credentials import issue_agent_token
    from controlplane.services.jobs import create_job
    from controlplane.services.nodes import register_node
    from controlplane.services.workers import start_worker

    out = []
    nodes = []
    for i in range(offset, offset + n):
        name = f"load-{i:05d}"
        token = issue_agent_token(node_name=name)
        cred = AgentCredential.objects.filter(node_name=name).latest("created")
        node = register_node(credential_id=cred.pk, message=Register(
            node=name, pool="reserved", hardware="H800", incarnation="seed",
            slots=[SlotSpec(index=s, hardware="H800", memory_mb=81920) for s in range(2)]))
        nodes.append((name, token, node))
    job = create_job(spec={"name": f"load-job-{offset}", "rollout_gpus": 2 * n, "training_gpus": 0}, actor="bench")
    for name, token, node in nodes:
        ws = [start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[s], role="colocated", activity="active").pk for s in range(2)]
        out.append((name, token, ws))
    return out


def dashboard_cookie() -> str:
    from django.contrib.auth.models import User
    from django.test import Client

    user, _ = User.objects.get_or_create(username="load-viewer")
    c = Client()
    c.force_login(user)
    return c.cookies["sessionid"].value


async def agent(session, url: str, name: str, token: str, workers: list[int], period: float, sent: dict, stop: asyncio.Event,
                errors: list[str]) -> None:
    async with session.ws_connect(url, headers={"Authorization": f"Bearer {token}"}, max_msg_size=0) as ws:
        await ws.send_json({"type": "register", "node": name, "pool": "reserved", "hardware": "H800", "incarnation": f"bench-{os.getpid()}",
                            "slots": [{"index": s, "hardware": "H800", "memory_mb": 81920} for s in range(2)]})
        epoch = generation = 0
        while True:
            msg = await ws.receive_json(timeout=60)
            if msg["type"] == "registered":
                epoch = msg["epoch"]
            if msg["type"] == "desired_state":
                generation = msg["generation"]
                break
        node_id = None

        async def reader() -> None:
            async for m in ws:
                data = json.loads(m.data)
                if data.get("type") == "error":
                    errors.append(f"{name}: {data['code']}: {data['message'][:100]}")

        rd = asyncio.create_task(reader())
        await asyncio.sleep(random.random() * period)
        observed = [{"worker_id": w, "role": "colocated", "activity": "active", "state": "running", "weight_version": 0,
                     "endpoint": f"http://127.0.0.1:{20000 + w % 40000}", "inflight": 3, "generation": generation, "devices": [i]}
                    for i, w in enumerate(workers)]
        try:
            while not stop.is_set():
                sent[name] = time.perf_counter()
                await ws.send_json({"type": "heartbeat", "epoch": epoch, "generation": generation, "workers": observed})
                await asyncio.sleep(period)
        finally:
            rd.cancel()
        del node_id


async def dashboard(session, url: str, origin: str, cookie: str, names: dict[int, str], sent: dict, lat: list[float] | None,
                    stop: asyncio.Event, ready: asyncio.Event) -> None:
    async with session.ws_connect(url, headers={"Origin": origin, "Cookie": f"sessionid={cookie}"}, max_msg_size=0) as ws:
        snap = await ws.receive_json(timeout=120)
        for n in snap["cluster"]["nodes"]:
            names[n["id"]] = n["name"]
        ready.set()
        while not stop.is_set():
            try:
                m = await ws.receive(timeout=1.0)
            except asyncio.TimeoutError:
                continue
            if m.type.name != "TEXT":
                break
            if lat is None:
                continue
            d = json.loads(m.data)
            if d.get("kind") == "heartbeat":
                name = d["data"]["name"]
                t = sent.get(name)
                if t is not None:
                    lat.append(time.perf_counter() - t)


async def run_step(ports: list[int], nodes: list[tuple[str, str, list[int]]], m: int, period: float, duration: float, cookie: str) -> dict:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector
    from asgiref.sync import sync_to_async

    from controlplane.models import Event

    stop, sent, lat, errors, names = asyncio.Event(), {}, [], [], {}
    started_at = time.time()
    async with ClientSession(timeout=ClientTimeout(total=None), connector=TCPConnector(limit=0)) as s:
        readies = [asyncio.Event() for _ in range(m)]
        dash = [asyncio.create_task(dashboard(s, f"ws://127.0.0.1:{ports[i % len(ports)]}/ws/dashboard/", f"http://127.0.0.1:{ports[i % len(ports)]}",
                                              cookie, names, sent, lat if i == 0 else None, stop, readies[i])) for i in range(m)]
        await asyncio.wait_for(asyncio.gather(*[r.wait() for r in readies]), 300)
        agents = [asyncio.create_task(agent(s, f"ws://127.0.0.1:{ports[i % len(ports)]}/ws/agent/", name, token, ws, period, sent, stop, errors))
                  for i, (name, token, ws) in enumerate(nodes)]
        await asyncio.sleep(period * 3)  # everyone registered and beating
        lat.clear()
        t0 = time.perf_counter()
        await asyncio.sleep(duration)
        measured = list(lat)
        elapsed = time.perf_counter() - t0
        stop.set()
        await asyncio.gather(*agents, *dash, return_exceptions=True)
    names = [name for name, _, _ in nodes]  # only this step's nodes (a previous, larger step's agents have stopped)
    lost = await sync_to_async(lambda: Event.objects.filter(kind="node.lease_expired", node__name__in=names,
                                                             created__gte=_dt(started_at)).count())()
    return {"agents": len(nodes), "dashboards": m, "samples": len(measured),
            "p50_ms": round(1000 * statistics.median(measured), 1) if measured else None,
            "p95_ms": round(1000 * pct(measured, 0.95), 1) if measured else None,
            "max_ms": round(1000 * max(measured), 1) if measured else None,
            "heartbeats_per_s": round(len(measured) / elapsed, 1), "leases_lost": lost, "errors": errors[:5]}


def _dt(ts: float):  # type: ignore[no-untyped-def]
    from datetime import datetime, timezone

    return datetime.fromtimestamp(ts, tz=timezone.utc)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", default="50,100,200,400")
    p.add_argument("--dashboards", default="1,10,50")
    p.add_argument("--daphnes", default="1,2")
    p.add_argument("--period", type=float, default=1.0, help="heartbeat period (s); the default deployment uses 3")
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pearl-load-"))
    rport = free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(rport)
    redis_url = f"redis://127.0.0.1:{rport}"
    db_url = os.environ.get("DATABASE_URL") or f"sqlite:///{tmp / 'load.sqlite3'}"
    try:
        setup(db_url, redis_url, tmp)
    except BaseException:
        redis.terminate()
        raise
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every, _ = IntervalSchedule.objects.get_or_create(every=5, period=IntervalSchedule.SECONDS)
    # the sweeper on its own queue: the planner's tasks (queued by job creation) stay out of this benchmark
    PeriodicTask.objects.create(name="sweeper", task="controlplane.sweep", interval=every, queue="sweep")
    cookie = dashboard_cookie()
    env = dict(os.environ, DATABASE_URL=db_url, REDIS_URL=redis_url, DEBUG="0", PYTHONPATH=str(ROOT), PEARL_HEARTBEAT_S=str(args.period))
    env.pop("PEARL_TESTING", None)
    procs = [subprocess.Popen([PY, "-m", "celery", "-A", "pearl_site", "worker", "-B", "--pool=solo", "-Q", "sweep", "-l", "warning", "-s", str(tmp / "beat")],
                              cwd=ROOT, env=env, stdout=open(tmp / "celery.log", "wb"), stderr=subprocess.STDOUT)]
    results = []
    nodes: list[tuple[str, str, list[int]]] = []
    try:
        for k in [int(x) for x in args.daphnes.split(",")]:
            ports = [free_port() for _ in range(k)]
            web = [subprocess.Popen([PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(pt), "pearl_site.asgi:application"],
                                    cwd=ROOT, env=env, stdout=open(tmp / f"daphne-{pt}.log", "wb"), stderr=subprocess.STDOUT) for pt in ports]
            for pt in ports:
                wait_port(pt)
            try:
                for m in [int(x) for x in args.dashboards.split(",")]:
                    for n in [int(x) for x in args.agents.split(",")]:
                        if len(nodes) < n:
                            nodes += make_nodes(n - len(nodes), len(nodes))
                        r = asyncio.run(run_step(ports, nodes[:n], m, args.period, args.duration, cookie)) | {"daphnes": k}
                        results.append(r)
                        print(json.dumps(r), file=sys.stderr, flush=True)
                        if r["p95_ms"] is None or r["p95_ms"] >= 100 or r["leases_lost"]:
                            break  # larger N only gets worse at this M
            finally:
                for w in web:
                    w.terminate()
                    try:
                        w.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        w.kill()
                        w.wait()
    finally:
        for pr in procs:
            pr.terminate()
            pr.wait(timeout=30)
        redis.terminate()
    ok = [r for r in results if r["p95_ms"] is not None and r["p95_ms"] < 100 and not r["leases_lost"]]
    best = {}
    for r in ok:
        key = f"daphnes={r['daphnes']},dashboards={r['dashboards']}"
        best[key] = max(best.get(key, 0), r["agents"])
    out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
           "database": db_url.split(":")[0], "period_s": args.period, "duration_s": args.duration,
           "largest_agents_with_p95_below_100ms_and_no_lease_lost": best, "steps": results}
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
