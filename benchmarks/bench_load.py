"""Hardening figures, load (issue 22): N emulated node agents in separate load-generator processes
(`load_agents.py`, real websockets, real register / heartbeat / telemetry messages) against the control
plane: D Daphne processes, a Celery worker + beat running the lease sweeper every 5 s, Redis, PostgreSQL.

For each (heartbeat period, N) step, on fresh Daphne processes, over a window of `--duration` seconds after
every agent registered:
- heartbeat sent -> lease renewed: p50 / p95 / max (a probe frame right after the heartbeat on the same
  socket; see load_agents.py);
- heartbeat sent -> the node's dashboard delta (heartbeat or node kind), for the agents that report a
  change in every heartbeat (idle, then busy: every `--change-every`-th agent; the others report no change),
  received by one dashboard client (cluster view) here;
- leases lost (node.lease_expired events from the first registration until the agents stop: they heartbeat
  on through a tail after the window, so a lease that lapses when they stop is not counted);
- database row writes per heartbeat (pg_stat_database inserted + updated + deleted tuples over the window,
  less the telemetry samples stored) and commits per heartbeat (every transaction, read-only ones included);
- server CPU per heartbeat (Daphne + Celery + Redis processes, /proc; also per process kind, and the load
  generators' own), Redis commands per heartbeat (INFO commandstats, every client) and Daphne memory per
  node (RSS after the window less RSS before the agents connected, over N).

`--code DIR` runs the servers from another checkout (e.g. `git worktree add /tmp/base <commit>`) with the
same database schema: the same command measures the code before and after a change; `--report A.json
B.json` prints two saved runs side by side.

Usage: DATABASE_URL=postgres://.../pearl_load .venv/bin/python benchmarks/bench_load.py
       [--agents 128,256,512,1024,2048] [--periods 3,1] [--daphnes 2] [--generators 2] [--duration 30]
       [--code DIR] [--out FILE.json] [--py-spy PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from bench_controlplane import ROOT, pct


def seed(n: int) -> tuple[list[list[Any]], str]:
    """n nodes of 2 GPU slots, each with two active colocated workers of one job, and their agent tokens:
    ([name, token, worker ids], job)."""
    from controlplane.services.jobs import create_job

    nodes, tokens = harness.seed_nodes("load", n, gpus=2, pool="reserved")
    job = create_job(spec={"name": "load-job", "rollout_gpus": 2, "training_gpus": 0}, actor="bench")
    workers = harness.seed_workers(job, nodes, 2)
    return [[nd.name, tokens[nd.name], [workers[(nd.pk, s)].pk for s in range(2)]] for nd in nodes], job.name


def dashboard_cookie() -> str:
    from django.contrib.auth.models import User
    from django.test import Client

    user, _ = User.objects.get_or_create(username="load-viewer")
    c = Client()
    c.force_login(user)
    return c.cookies["sessionid"].value


def redis_calls(port: int) -> int:
    """Every command Redis ran so far (INFO commandstats, all clients: channel layer, Celery, leases)."""
    import redis

    stats = redis.Redis(port=port).info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


def pg_counters(db: str) -> tuple[int, int]:
    from django.db import connection

    with connection.cursor() as c:
        c.execute("SELECT pg_stat_clear_snapshot()")
        c.execute(
            "SELECT tup_inserted + tup_updated + tup_deleted, xact_commit FROM pg_stat_database WHERE datname = %s",
            [db],
        )
        row = c.fetchone()
    return int(row[0]), int(row[1])


async def watch_dashboard(
    url: str, origin: str, cookie: str, recv: dict[str, list[float]], stop: asyncio.Event, ready: asyncio.Event
) -> None:
    from aiohttp import ClientSession, ClientTimeout

    headers = {"Origin": origin, "Cookie": f"sessionid={cookie}"}
    async with (
        ClientSession(timeout=ClientTimeout(total=None)) as s,
        s.ws_connect(url, headers=headers, max_msg_size=0) as ws,
    ):
        ready.set()
        while not stop.is_set():
            try:
                m = await ws.receive(timeout=0.5)
            except TimeoutError:
                continue
            if m.type.name != "TEXT":
                break
            d = json.loads(m.data)
            if d.get("type") == "delta" and d.get("kind") in ("heartbeat", "node"):
                recv.setdefault(d["data"].get("name", ""), []).append(time.time())


def delta_latencies(changed: list[list[Any]], recv: dict[str, list[float]], period: float) -> tuple[list[float], int]:
    """Each changed heartbeat -> the first delta of its node after it (within one period); and how many had none."""
    out, missing = [], 0
    for name, t in changed:
        after = [r for r in recv.get(name, []) if t <= r < t + period]
        if after:
            out.append(min(after) - t)
        else:
            missing += 1
    return out, missing


def ms(xs: list[float], q: float | None) -> float | None:
    if not xs:
        return None
    v = max(xs) if q is None else (statistics.median(xs) if q == 0.5 else pct(xs, q))
    return round(1000 * v, 1)


def run_step(
    args: argparse.Namespace,
    env: dict[str, str],
    tmp: Path,
    db: str,
    agents: list[list[Any]],
    job: str,
    period: float,
    cookie: str,
    procs: dict[str, subprocess.Popen[bytes]],
    redis_port: int,
) -> dict[str, Any]:
    from controlplane.models import Event, TelemetrySample

    code = Path(args.code).resolve()
    ports, web = harness.start_daphnes(args.daphnes, cwd=code, env=dict(env, PEARL_HEARTBEAT_S=str(period)), tmp=tmp)
    gens: list[subprocess.Popen[str]] = []
    stop_dashboard = asyncio.Event()
    try:
        time.sleep(1.0)
        rss0 = sum(harness.rss_mb(w.pid) for w in web)
        started = time.time()
        from django.utils import timezone

        t0 = timezone.now()
        spec = {"period": period, "job": job, "probe_every": args.probe_every, "change_every": args.change_every}
        spec |= {"busy": args.busy, "duration": args.duration}
        gens = harness.start_generators(agents, generators=args.generators, ports=ports, tmp=tmp, **spec)
        harness.wait_ready(gens, tmp)
        registered_s = time.time() - started
        window_start = time.time() + 2 * period
        harness.send(gens, {"t_start": window_start}, last=True)
        recv: dict[str, list[float]] = {}
        stats: dict[str, Any] = {}

        async def dashboards() -> None:
            from asgiref.sync import sync_to_async

            ready = asyncio.Event()
            task = asyncio.create_task(
                watch_dashboard(
                    f"ws://127.0.0.1:{ports[0]}/ws/dashboard/",
                    f"http://127.0.0.1:{ports[0]}",
                    cookie,
                    recv,
                    stop_dashboard,
                    ready,
                )
            )
            waiting = asyncio.ensure_future(ready.wait())
            await asyncio.wait([waiting, task], timeout=600, return_when=asyncio.FIRST_COMPLETED)
            if task.done():  # the dashboard client failed (e.g. its handshake timed out): say so, do not wait
                waiting.cancel()
                task.result()
                raise RuntimeError("the dashboard client ended before the window")
            await asyncio.sleep(max(0.0, window_start - time.time()))
            counters = sync_to_async(lambda: (pg_counters(db), TelemetrySample.objects.count()))
            before = await counters()
            groups: dict[str, list[int]] = {
                "daphne": [w.pid for w in web],
                "celery": [procs["celery"].pid],
                "redis": [procs["redis"].pid],
                "load": [g.pid for g in gens],
            }
            cpu0 = {k: sum(harness.cpu_s(pid) for pid in pids) for k, pids in groups.items()}
            redis0 = redis_calls(redis_port)
            spies = (
                []
                if not args.py_spy
                else [spy(args, w.pid, tmp / f"spy-{period:g}-{len(agents)}-{i}.txt") for i, w in enumerate(web)]
            )
            await asyncio.sleep(args.duration)
            cpu1 = {k: sum(harness.cpu_s(pid) for pid in pids) for k, pids in groups.items()}
            stats["redis_calls"] = redis_calls(redis_port) - redis0
            stats["rss_mb"] = sum(harness.rss_mb(w.pid) for w in web) - rss0
            await asyncio.sleep(2.0)  # backends flush their statistics
            after = await counters()
            stats["pg"] = (after[0][0] - before[0][0], after[0][1] - before[0][1], after[1] - before[1])
            stats["cpu_by"] = {k: cpu1[k] - cpu0[k] for k in groups}
            stats["cpu_s"] = sum(v for k, v in stats["cpu_by"].items() if k != "load")
            for sp in spies:
                sp.wait(timeout=120)
            await asyncio.sleep(max(0.0, window_start + args.duration + 3 - time.time()))
            stop_dashboard.set()
            await task

        asyncio.run(dashboards())
        outs = harness.results(gens)
        stopped = timezone.now()  # the agents heartbeated until now: a lease that lapsed before was lost
    finally:
        harness.stop(gens, kill=True)
        harness.stop(web)
    renew = [x for o in outs for x in o["renew_s"]]
    changed = [c for o in outs for c in o["changed"]]
    sent = sum(o["sent"] for o in outs)
    dl, missing = delta_latencies(changed, recv, period)
    names = [a[0] for a in agents]
    lost = Event.objects.filter(
        kind="node.lease_expired", created__gte=t0, created__lt=stopped, node__name__in=names
    ).count()
    rows, commits, telemetry_rows = stats["pg"]
    return {
        "period_s": period,
        "agents": len(agents),
        "daphnes": args.daphnes,
        "generators": args.generators,
        "registered_s": round(registered_s, 1),
        "heartbeats": sent,
        "heartbeats_per_s": round(sent / args.duration, 1),
        "renew_p50_ms": ms(renew, 0.5),
        "renew_p95_ms": ms(renew, 0.95),
        "renew_max_ms": ms(renew, None),
        "renew_samples": len(renew),
        "delta_p50_ms": ms(dl, 0.5),
        "delta_p95_ms": ms(dl, 0.95),
        "delta_max_ms": ms(dl, None),
        "delta_samples": len(dl),
        "delta_missing": missing,
        "leases_lost": lost,
        "row_writes_per_heartbeat": round((rows - telemetry_rows) / max(sent, 1), 3),
        "commits_per_heartbeat": round(commits / max(sent, 1), 3),
        "cpu_ms_per_heartbeat": round(1000 * stats["cpu_s"] / max(sent, 1), 2),
        "cpu_ms_per_heartbeat_by": {k: round(1000 * v / max(sent, 1), 2) for k, v in stats["cpu_by"].items()},
        "redis_calls_per_heartbeat": round(stats["redis_calls"] / max(sent, 1), 2),
        "desired_states_per_heartbeat": round(
            sum(sum(o.get("desired_counts", {}).values()) for o in outs) / max(sent, 1), 3
        ),
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "daphne_mb_per_node": round(stats["rss_mb"] / len(agents), 3),
        "profile": profile_summary(sorted(tmp.glob(f"spy-{period:g}-{len(agents)}-*.txt"))) if args.py_spy else {},
        "failed_agents": sum(o["failed_agents"] for o in outs),
        "errors": [e for o in outs for e in o["errors"]][:5],
    }


def spy(args: argparse.Namespace, pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy over one process for the window: raw (collapsed) stacks, 50 samples/s, the process not paused."""
    cmd = [args.py_spy, "record", "--duration", str(int(args.duration)), "--rate", "50", "--nonblocking"]
    return subprocess.Popen(
        [*cmd, "--format", "raw", "--pid", str(pid), "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def profile_summary(paths: list[Path], top: int = 12) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks of the Daphne processes -> the share of samples per function: where the
    time is spent (self: the innermost frame) and what it is spent under (inclusive: anywhere on the stack)."""
    own: dict[str, int] = {}
    under: dict[str, int] = {}
    total = 0
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            total += n
            frames = [
                f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
                for f in stack.split(";")[1:]
            ]  # the first frame is the process / thread
            if frames:
                own[frames[-1]] = own.get(frames[-1], 0) + n
            for f in set(frames):
                under[f] = under.get(f, 0) + n

    def share(d: dict[str, int]) -> dict[str, float]:
        return {k: round(100 * v / max(total, 1), 1) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]}

    return {"samples": total, "self_pct": share(own), "inclusive_pct": share(under)}


def report(paths: list[str]) -> None:
    runs = [json.loads(Path(p).read_text()) for p in paths]
    cols = [
        "renew_p50_ms",
        "renew_p95_ms",
        "renew_max_ms",
        "delta_p95_ms",
        "leases_lost",
        "row_writes_per_heartbeat",
        "commits_per_heartbeat",
        "cpu_ms_per_heartbeat",
        "daphne_mb_per_node",
    ]
    print("| period s | agents | " + " | ".join(f"{c} ({r['label']})" for c in cols for r in runs) + " |")
    print("|" + " --- |" * (2 + len(cols) * len(runs)))
    keys = sorted({(s["period_s"], s["agents"]) for r in runs for s in r["steps"]}, key=lambda k: (-k[0], k[1]))
    for period, n in keys:
        cells = []
        for c in cols:
            for r in runs:
                s = next((s for s in r["steps"] if (s["period_s"], s["agents"]) == (period, n)), None)
                cells.append("–" if s is None or s.get(c) is None else str(s[c]))
        print(f"| {period:g} | {n} | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", default="128,256,512,1024,2048")
    p.add_argument("--periods", default="3,1", help="heartbeat periods (s); the default deployment uses 3")
    p.add_argument("--daphnes", type=int, default=2)
    p.add_argument("--generators", type=int, default=2, help="load-generator processes (>= 2: the load is outside)")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--probe-every", type=int, default=4, help="every k-th agent times its lease renewals")
    p.add_argument("--change-every", type=int, default=16, help="every k-th agent reports a change in every beat")
    p.add_argument(
        "--busy",
        action="store_true",
        help="the other agents' workers serve: their in-flight counts move every beat (1-3), as on a loaded cluster",
    )
    p.add_argument("--code", default=str(ROOT), help="the checkout the servers run from")
    p.add_argument("--label", default="")
    p.add_argument("--out", default="")
    p.add_argument("--report", nargs="+", help="print saved runs side by side")
    p.add_argument("--stop-p95-ms", type=float, default=1000.0, help="skip larger N at a period once p95 passes this")
    p.add_argument("--py-spy", default="", help="a py-spy binary: profile every Daphne process over each window")
    args = p.parse_args()
    if args.report:
        report(args.report)
        return
    db_url = harness.postgres_url()
    db = db_url.rsplit("/", 1)[1]
    tmp = Path(tempfile.mkdtemp(prefix="pearl-load-"))
    redis, rport = harness.start_redis()
    redis_url = f"redis://127.0.0.1:{rport}"
    sizes = [int(x) for x in args.agents.split(",")]
    results: list[dict[str, Any]] = []
    procs: dict[str, subprocess.Popen[bytes]] = {"redis": redis}
    try:
        harness.setup(db_url, redis_url, tmp)
        from django_celery_beat.models import IntervalSchedule, PeriodicTask

        every, _ = IntervalSchedule.objects.get_or_create(every=5, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.create(name="sweeper", task="controlplane.sweep", interval=every, queue="sweep")
        agents, job = seed(max(sizes))
        cookie = dashboard_cookie()
        code = Path(args.code).resolve()
        env = dict(
            os.environ,
            DATABASE_URL=db_url,
            REDIS_URL=redis_url,
            DEBUG="0",
            PYTHONPATH=str(code),
            PEARL_VAR_DIR=str(tmp),
        )
        env.pop("PEARL_TESTING", None)
        procs["celery"] = harness.start_celery(
            ["-B", "--pool=solo", "-Q", "sweep", "-l", "warning", "-s", str(tmp / "beat")],
            cwd=code,
            env=env,
            log=tmp / "celery.log",
        )
        for period in [float(x) for x in args.periods.split(",")]:
            for n in sizes:
                r = run_step(args, env, tmp, db, agents[:n], job, period, cookie, procs, rport)
                results.append(r)
                print(json.dumps(r), file=sys.stderr, flush=True)
                if r["renew_p95_ms"] is not None and r["renew_p95_ms"] > args.stop_p95_ms:
                    break
                time.sleep(22.0)  # the step's agents' leases lapse (LEASE_S + a sweep) before the next step counts
    finally:
        harness.stop(procs.values())
    load = os.getloadavg()
    out = {
        "label": args.label or str(code),
        "code": str(code),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": [round(x, 1) for x in load],
        "duration_s": args.duration,
        "steps": results,
    }
    harness.write_report(out, args.out)


if __name__ == "__main__":
    main()
