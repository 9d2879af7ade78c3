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

`--storm` measures a restart of the control plane at full size instead (issue 34): all N agents connect within
one second to fresh Daphne processes, then again within one second of a Daphne restart (`--phases`); the
agents keep their links as the product's node agents do (re-register after a close, reconnect with jittered
exponential backoff, adopt a new epoch after a lost lease: load_agents.py). Each phase is watched from the
storm on (nodes ready, leases lost, every 5 s), and measured over `--duration` seconds from `--settle` seconds
after the storm: every node ready or not, leases lost (node.lease_expired events), links dropped, lease-lost
notices (a desired state with a newer epoch on a registered socket), heartbeats refused, database row writes
per heartbeat (every heartbeat of the storm reports no change; telemetry is not sent), server CPU; with
`--py-spy`, where the Daphne processes spend the first `--spy-s` seconds of each phase.

`--code DIR` runs the servers from another checkout (e.g. `git worktree add /tmp/base <commit>`) with the
same database schema: the same command measures the code before and after a change; `--report A.json
B.json` prints two saved runs side by side.

Usage: DATABASE_URL=postgres://.../pearl_load .venv/bin/python benchmarks/bench_load.py
       [--agents 128,256,512,1024,2048] [--periods 3,1] [--daphnes 2] [--generators 2] [--duration 30]
       [--code DIR] [--out FILE.json] [--py-spy PATH]
       [--storm [--phases storm,restart] [--settle 60] [--spy-s 30]]
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
from datetime import UTC, datetime
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


def run_storm(
    args: argparse.Namespace,
    env: dict[str, str],
    tmp: Path,
    db: str,
    agents: list[list[Any]],
    job: str,
    period: float,
    procs: dict[str, subprocess.Popen[bytes]],
) -> dict[str, Any]:
    """The storm (`--storm`): every agent connects within one second of fresh Daphnes, then (phase
    "restart") again within one second of their restart; each phase watched and measured (`storm_phase`)."""
    code = Path(args.code).resolve()
    denv = dict(env, PEARL_HEARTBEAT_S=str(period))
    ports, web = harness.start_daphnes(args.daphnes, cwd=code, env=denv, tmp=tmp)
    names = [a[0] for a in agents]
    gens: list[subprocess.Popen[str]] = []
    phases: list[dict[str, Any]] = []
    try:
        time.sleep(1.0)
        spec = {"period": period, "job": job, "storm": True, "probe_every": 0, "change_every": 0}
        for label in args.phases.split(","):
            if label == "storm":
                t0 = since = time.time()
                gens = harness.start_generators(agents, generators=args.generators, ports=ports, tmp=tmp, **spec)
            elif label == "restart":
                since = time.time()  # registrations from the restart on count (an agent may beat t0 by a hair)
                harness.stop(web)
                ports, web = harness.start_daphnes(args.daphnes, cwd=code, env=denv, tmp=tmp, ports=ports)
                t0 = time.time()
                harness.send(gens, {"storm": t0})
            else:
                raise SystemExit(f"unknown phase {label!r}: storm or restart")
            phases.append(storm_phase(args, label, t0, db, names, web, procs, tmp) | {"_since": since})
        harness.send(gens, {"stop": True}, last=True)
        outs = harness.results(gens)
    finally:
        harness.stop(gens, kill=True)
        harness.stop(web)
    for ph in phases:
        ph |= storm_counts(ph, outs, names)
        for key in ("_t0", "_window", "_since"):
            ph.pop(key)
    return {"period_s": period, "agents": len(agents), "daphnes": args.daphnes, "phases": phases}


def storm_phase(
    args: argparse.Namespace,
    label: str,
    t0: float,
    db: str,
    names: list[str],
    web: list[subprocess.Popen[bytes]],
    procs: dict[str, subprocess.Popen[bytes]],
    tmp: Path,
) -> dict[str, Any]:
    """One storm from t0: nodes ready and leases lost every 5 s until the settle, Daphne profiled over the
    first --spy-s seconds (--py-spy), then the window's database writes and server CPU."""
    from controlplane.models import Event, Node, TelemetrySample

    def ready() -> int:
        return Node.objects.filter(name__in=names, status="ready").count()

    def lost(since: float, until: float) -> int:
        return Event.objects.filter(
            kind="node.lease_expired", created__gte=utc(since), created__lt=utc(until), node__name__in=names
        ).count()

    spies = []
    if args.py_spy:
        spies = [spy(args, w.pid, tmp / f"storm-{label}-{len(names)}-{i}.txt", args.spy_s) for i, w in enumerate(web)]
    timeline: list[list[float]] = []
    w0 = t0 + args.settle
    while time.time() < w0:
        time.sleep(min(5.0, max(0.0, w0 - time.time())))
        timeline.append([round(time.time() - t0, 1), ready(), lost(t0, time.time())])
    groups = {"daphne": [w.pid for w in web], "celery": [procs["celery"].pid], "redis": [procs["redis"].pid]}
    cpu0 = sum(harness.cpu_s(pid) for pids in groups.values() for pid in pids)
    before = (pg_counters(db), TelemetrySample.objects.count())
    ready0 = ready()
    time.sleep(args.duration)
    w1 = time.time()
    cpu1 = sum(harness.cpu_s(pid) for pids in groups.values() for pid in pids)
    ready1 = ready()
    time.sleep(2.0)  # backends flush their statistics
    after = (pg_counters(db), TelemetrySample.objects.count())
    for sp in spies:
        sp.wait(timeout=120)
    return {
        "phase": label,
        "timeline_s_ready_lost": timeline,
        "ready_at_window_start": ready0,
        "ready_at_window_end": ready1,
        "leases_lost_before_window": lost(t0, w0),
        "leases_lost": lost(w0, w1),
        "window_s": [round(w0 - t0, 1), round(w1 - t0, 1)],
        "_t0": t0,
        "_window": (w0, w1),
        "_rows": after[0][0] - before[0][0] - (after[1] - before[1]),
        "_commits": after[0][1] - before[0][1],
        "_cpu_s": cpu1 - cpu0,
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "profile": profile_summary(sorted(tmp.glob(f"storm-{label}-{len(names)}-*.txt"))) if args.py_spy else {},
    }


def utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=UTC)


def storm_counts(ph: dict[str, Any], outs: list[dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """A phase's figures from the load generators' timestamps: how long until every agent registered after
    the storm, and in the window the links dropped, lease-lost notices and refusals, and per heartbeat the
    row writes, commits and server CPU."""
    t0, since, (w0, w1) = ph["_t0"], ph["_since"], ph["_window"]
    first: dict[str, float] = {}
    for o in outs:
        for t, name in o["registered_at"]:
            if t >= since and (name not in first or t < first[name]):
                first[name] = t
    sent = sum(n for o in outs for sec, n in o["sent_per_s"].items() if w0 <= int(sec) < w1)

    def within(key: str) -> int:
        return sum(1 for o in outs for t in o[key] if w0 <= (t[0] if isinstance(t, list) else t) < w1)

    refused: dict[str, int] = {}
    for o in outs:
        for t, code in o["refused"]:
            if w0 <= t < w1:
                refused[code] = refused.get(code, 0) + 1
    return {
        "registered": len(first),
        "all_registered_s": round(max(first.values()) - t0, 1) if len(first) == len(names) else None,
        "restart_s": round(t0 - since, 1),
        "registrations_in_window": within("registered_at"),
        "links_dropped": within("dropped"),
        "connects_failed": within("failed"),
        "lease_lost_notices": within("lease_lost"),
        "refused": refused,
        "heartbeats": sent,
        "row_writes_per_heartbeat": round(ph.pop("_rows") / max(sent, 1), 4),
        "commits_per_heartbeat": round(ph.pop("_commits") / max(sent, 1), 4),
        "cpu_ms_per_heartbeat": round(1000 * ph.pop("_cpu_s") / max(sent, 1), 2),
        "errors": [e for o in outs for e in o["errors"]][:5],
    }


def spy(args: argparse.Namespace, pid: int, out: Path, duration: float = 0.0) -> subprocess.Popen[bytes]:
    """py-spy over one process for the window: raw (collapsed) stacks, 50 samples/s, the process not paused."""
    cmd = [args.py_spy, "record", "--duration", str(int(duration or args.duration)), "--rate", "50", "--nonblocking"]
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
    p.add_argument("--storm", action="store_true", help="a restart at full size: every agent connects at once")
    p.add_argument("--phases", default="storm,restart", help="--storm: storms to run in order (storm, restart)")
    p.add_argument("--settle", type=float, default=60.0, help="--storm: seconds from the storm to the window")
    p.add_argument("--spy-s", type=float, default=30.0, help="--storm --py-spy: seconds profiled from each storm")
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
                if args.storm:
                    r = run_storm(args, env, tmp, db, agents[:n], job, period, procs)
                    results.append(r)
                    print(json.dumps(r), file=sys.stderr, flush=True)
                    time.sleep(22.0)  # the step's agents' leases lapse before the next step
                    continue
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
