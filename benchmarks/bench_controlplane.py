"""Control-plane figures (issue "Control-plane foundation"):

1. launch command -> dashboard ready (seconds), from a fresh database;
2. service write -> dashboard websocket delta received: p50/p95 over 200 events (target p95 < 100 ms);
3. GET /api/cluster/ on a 1,024-GPU cluster: p50/p95 (target p95 < 150 ms).

Usage: .venv/bin/python benchmarks/bench_controlplane.py [--skip-launch] [--json]
Runs against its own temporary SQLite database, its own Redis (private port) and a real Daphne.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(port)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def measure_launch(tmp: Path) -> float:
    var = tmp / "launch-var"
    port, rport = free_port(), free_port()
    env = dict(
        os.environ, PEARL_VAR_DIR=str(var), REDIS_URL=f"redis://127.0.0.1:{rport}", DEBUG="1", PYTHONUNBUFFERED="1"
    )
    env.pop("DATABASE_URL", None)
    start = time.monotonic()
    proc = subprocess.Popen(
        [PY, "manage.py", "launch", "--port", str(port), "--no-demo-job"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    # Redis is not running on rport: REDIS_URL is set but does not answer, so the launcher starts its own.
    took = None
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"PEARL is up in ([0-9.]+) s", line)
        if m:
            took = time.monotonic() - start
            break
        if time.monotonic() - start > 180:
            break
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
    if took is None:
        raise RuntimeError("launch did not become ready")
    return took


def setup_django(db: Path, redis_url: str) -> None:
    os.environ.update(DATABASE_URL=f"sqlite:///{db}", REDIS_URL=redis_url, PEARL_TESTING="1", DEBUG="0")
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pearl_site.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def seed_cluster(n_nodes: int, gpus_per_node: int) -> str:
    from django.contrib.auth.models import Group, User
    from rest_framework.authtoken.models import Token

    from controlplane.core.agent_link import Register, SlotSpec
    from controlplane.core.state import Pool
    from controlplane.models import AgentCredential
    from controlplane.services.credentials import issue_agent_token
    from controlplane.services.jobs import create_job
    from controlplane.services.registration import register_node
    from controlplane.services.workers import start_worker

    pools = ["reserved"] * (n_nodes // 4) + ["elastic"] * (n_nodes // 2)
    pools += ["training"] * (n_nodes - len(pools))
    node_ids = []
    for i, pool in enumerate(pools):
        name = f"node-{i:04d}"
        issue_agent_token(node_name=name)
        cred = AgentCredential.objects.get(node_name=name)
        node = register_node(
            credential_id=cred.pk,
            message=Register(
                node=name,
                pool=Pool(pool),
                hardware="H800",
                incarnation="b",
                slots=[SlotSpec(index=g, hardware="H800", memory_mb=81920) for g in range(gpus_per_node)],
            ),
        )
        node_ids.append((node.pk, pool))
    job = create_job(spec={"name": "bench", "rollout_gpus": 2, "training_gpus": 0, "tp": 2}, actor="bench")
    roles = ["prefill", "decode"]
    for k, (nid, pool) in enumerate(node_ids):
        if pool == "training":
            continue
        for g in range(0, gpus_per_node, 2):
            start_worker(
                job_id=job.pk, node_id=nid, gpu_indexes=[g, g + 1], role=roles[(k + g) % 2], activity="transitioning"
            )
    user = User.objects.create_user(username="bench", password="bench-pass-123", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    return Token.objects.create(user=user).key


def session_cookie() -> str:
    from django.contrib.auth.models import User
    from django.test import Client

    c = Client()
    c.force_login(User.objects.get(username="bench"))
    return c.cookies["sessionid"].value


async def measure_deltas(ws_url: str, cookie: str, n: int) -> list[float]:
    import websockets
    from asgiref.sync import sync_to_async

    from controlplane.services.events import emit

    lat: list[float] = []
    async with websockets.connect(
        ws_url, additional_headers={"Cookie": f"sessionid={cookie}", "Origin": "http://127.0.0.1"}, max_size=None
    ) as ws:
        first = json.loads(await ws.recv())
        assert first["type"] == "snapshot"

        def write(i: int) -> None:
            from django.db import transaction

            with transaction.atomic():
                emit(kind="bench.write", message=f"write {i}", data={"i": i})

        for i in range(n + 10):
            t0 = time.perf_counter()
            await sync_to_async(write)(i)
            while True:
                msg = json.loads(await ws.recv())
                if msg.get("kind") == "event" and msg["data"]["data"].get("i") == i:
                    break
            if i >= 10:  # warm-up excluded
                lat.append((time.perf_counter() - t0) * 1000)
    return lat


def measure_cluster_get(base: str, token: str, n: int) -> tuple[list[float], int]:
    import urllib.request

    lat = []
    size = 0
    for i in range(n + 5):
        req = urllib.request.Request(base + "/api/cluster/", headers={"Authorization": f"Token {token}"})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req) as r:
            body = r.read()
        if i >= 5:
            lat.append((time.perf_counter() - t0) * 1000)
        size = len(body)
    return lat, size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-launch", action="store_true")
    ap.add_argument("--events", type=int, default=200)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="pearl-bench-"))
    out: dict = {"machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"}
    try:
        if not args.skip_launch:
            runs = [measure_launch(tmp / f"l{i}") for i in range(3)]
            out["launch_to_ready_s"] = {
                "runs": [round(r, 2) for r in runs],
                "median": round(statistics.median(runs), 2),
            }
        rport = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        wait_port(rport)
        try:
            setup_django(tmp / "bench.sqlite3", f"redis://127.0.0.1:{rport}")
            token = seed_cluster(128, 8)
            from controlplane.models import GPU, WorkerGPU

            gpus = GPU.objects.count()
            port = free_port()
            env = dict(os.environ, PYTHONUNBUFFERED="1")
            web = subprocess.Popen(
                [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "pearl_site.asgi:application"],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                wait_port(port)
                lat, size = measure_cluster_get(f"http://127.0.0.1:{port}", token, args.requests)
                out["cluster_get"] = {
                    "gpus": gpus,
                    "bound_gpus": WorkerGPU.objects.filter(alive=True).count(),
                    "bytes": size,
                    "n": len(lat),
                    "p50_ms": round(pct(lat, 0.5), 1),
                    "p95_ms": round(pct(lat, 0.95), 1),
                }
                deltas = asyncio.run(
                    measure_deltas(f"ws://127.0.0.1:{port}/ws/dashboard/", session_cookie(), args.events)
                )
                out["write_to_ws_delta"] = {
                    "n": len(deltas),
                    "p50_ms": round(pct(deltas, 0.5), 1),
                    "p95_ms": round(pct(deltas, 0.95), 1),
                    "max_ms": round(max(deltas), 1),
                }
            finally:
                web.terminate()
                web.wait(timeout=10)
        finally:
            redis.terminate()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
