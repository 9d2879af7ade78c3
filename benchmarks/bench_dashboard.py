"""Dashboard figures (issue "Dashboard with interactive control and a `pearl` CLI"), in headless Chromium:

1. state change (a service write: drain / return a node) -> the browser's DOM shows it: p50/p95 (target p95 < 250 ms);
2. first render of the cluster page (navigation start -> map drawn from the socket's snapshot) at 1,024 GPUs
   (target < 1 s) and at 8,192 GPUs (target < 2 s), in the page's default (auto) view, plus the detail view at 8,192;
3. websocket bytes per second for a busy 1,024-GPU cluster: every node heartbeating each 3 s, one node's
   workers changing every second (cluster view, and a job page's filtered view of the same traffic).

Usage: .venv/bin/python benchmarks/bench_dashboard.py [--changes 60] [--busy-s 20] [--json]
Own temporary SQLite database, own Redis on a private port, a real Daphne, Debian's /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_controlplane import PY, ROOT, free_port, pct, setup_django, wait_port

if TYPE_CHECKING:
    from playwright.sync_api import Page  # imported lazily at run time: an optional dependency

T = TypeVar("T")

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # reads from the Playwright thread; writes go off_loop
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
    "--disable-dev-shm-usage",
]


def seed(n_nodes: int, gpus_per_node: int = 8, first: int = 0) -> int:
    """A busy cluster written in bulk (this measures the page, not the services): 1/4 reserved, 1/2 elastic,
    1/4 training nodes; TP2 workers on every rollout GPU (prefill/decode), a training worker plus an overlap
    rollout worker on every training GPU pair, half of them lent (borrowed, active). Returns the job id."""
    from django.utils import timezone

    from controlplane.models import GPU, Job, Node, Override, Worker, WorkerGPU

    now = timezone.now()
    pools = ["reserved"] * (n_nodes // 4) + ["elastic"] * (n_nodes // 2)
    pools += ["training"] * (n_nodes - len(pools))
    Node.objects.bulk_create(
        [
            Node(
                name=f"node-{first + i:05d}",
                pool=p,
                status="ready",
                hardware="H800",
                last_heartbeat=now,
                lease_expires=now + timedelta(hours=2),
            )
            for i, p in enumerate(pools)
        ]
    )
    nodes = list(Node.objects.filter(name__gte=f"node-{first:05d}").order_by("name"))
    GPU.objects.bulk_create(
        [
            GPU(
                node=n, index=g, hardware="H800", memory_mb=81920, zone="overlap" if n.pool == "training" else "rollout"
            )
            for n in nodes
            for g in range(gpus_per_node)
        ]
    )
    gpu = {(g.node_id, g.index): g.pk for g in GPU.objects.filter(node__in=nodes)}
    job = Job.objects.create(name=f"bench-{first}", status="running", mode="disaggregated", tp=2)
    Override.objects.create(job=job)
    workers, bindings, slot = [], [], 0
    for k, n in enumerate(nodes):
        for g in range(0, gpus_per_node, 2):
            if n.pool == "training":
                lent = (k + g) % 4 == 0
                pair = [
                    ("training", "inactive", "training"),
                    ("decode", "active" if lent else "inactive", "rollout"),
                ]
            else:
                pair = [(("prefill", "decode")[(k + g // 2) % 2], "active", "rollout")]
            for role, activity, kind in pair:
                workers.append(
                    Worker(job=job, slot=slot, node=n, zone=n.zone, role=role, activity=activity, engine="emulated")
                )
                bindings.append((slot, [(n.pk, g), (n.pk, g + 1)], kind, activity == "active"))
                slot += 1
    Worker.objects.bulk_create(workers, batch_size=2000)
    wid = dict(Worker.objects.filter(job=job).values_list("slot", "id"))
    WorkerGPU.objects.bulk_create(
        [
            WorkerGPU(worker_id=wid[s], gpu_id=gpu[key], kind=kind, alive=True, active=active)
            for s, keys, kind, active in bindings
            for key in keys
        ],
        batch_size=4000,
    )
    return job.pk


def off_loop(fn: Callable[..., T], *a: Any, **kw: Any) -> T:
    """Service calls from a plain thread (Playwright's sync API keeps an event loop in this one)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn, *a, **kw).result()


def first_render(page: Page, base: str, mode: str = "auto") -> tuple[float, int]:
    page.goto(base + "/accounts/login/")  # same origin, to set the view preference before the map loads
    page.evaluate(f"localStorage.setItem('pearl.map', JSON.stringify({{mode: '{mode}'}}))")
    page.goto(base + "/")
    page.wait_for_function("document.body.dataset.renderedAt !== undefined", timeout=60000)
    took = float(page.evaluate("document.body.dataset.renderedAt"))
    cells = page.evaluate("document.querySelectorAll('.gpu[data-gpu]').length")
    return took, cells


def change_latency(page: Page, base: str, node_id: int, n: int) -> list[float]:
    from controlplane.services.draining import drain_node, undrain_node

    page.goto(base + "/")
    page.wait_for_selector(f".node[data-id='{node_id}']", timeout=60000)
    page.evaluate(
        """(id) => { window.__seen = [];
      new MutationObserver(() => { const s = document.querySelector(`.node[data-id='${id}'] [data-status]`);
        if (s) window.__seen.push([s.dataset.status, Date.now()]); }).observe(document.getElementById('nodes'), {childList: true, subtree: true}); }""",  # noqa: E501
        node_id,
    )
    lat = []
    for i in range(n + 5):
        want = "draining" if i % 2 == 0 else "ready"
        page.evaluate("window.__seen = []")
        t0 = time.time() * 1000
        off_loop(drain_node if want == "draining" else undrain_node, node_id=node_id, actor="bench")
        page.wait_for_function(f"window.__seen.some(s => s[0] === '{want}')", timeout=10000)
        seen = page.evaluate(f"window.__seen.find(s => s[0] === '{want}')[1]")
        if i >= 5:
            lat.append(seen - t0)
    return lat


def busy_traffic(ws_base: str, cookie: str, job_id: int, seconds: float) -> dict[str, float]:
    """Bytes the dashboard socket carries while every node heartbeats every 3 s and one node's workers
    change every second (the cluster view, and a job page's view of the same traffic)."""
    import websockets
    from django.db import close_old_connections

    from controlplane.core.agent_link import Heartbeat
    from controlplane.models import Node, Worker
    from controlplane.services.heartbeat import record_heartbeat
    from controlplane.services.nodes import push_node

    nodes = list(Node.objects.values_list("id", "epoch", "generation"))
    counts = {"cluster": [0, 0], "job": [0, 0]}
    stop = threading.Event()

    def churn() -> None:
        from django.db import transaction

        t_start, i, k = time.monotonic(), 0, 0
        per_tick = max(1, len(nodes) // 30)  # all nodes every 3 s, in 0.1 s ticks
        while not stop.is_set():
            for nid, epoch, gen in nodes[i : i + per_tick]:
                record_heartbeat(node_id=nid, message=Heartbeat(epoch=epoch, generation=gen))
            i = (i + per_tick) % len(nodes)
            if time.monotonic() - t_start > k:  # one node's workers change every second
                k += 1
                with transaction.atomic():
                    w = Worker.objects.filter(alive=True, role__in=["prefill", "decode"]).order_by("?").first()
                    if w is not None:
                        Worker.objects.filter(pk=w.pk).update(role="decode" if w.role == "prefill" else "prefill")
                        push_node(w.node_id)
            time.sleep(0.1)
        close_old_connections()

    async def listen(view: str, query: str) -> None:
        async with websockets.connect(
            f"{ws_base}/ws/dashboard/{query}",
            max_size=None,
            additional_headers={"Cookie": f"sessionid={cookie}", "Origin": "http://127.0.0.1"},
        ) as ws:
            await ws.recv()  # the snapshot is not the steady state
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                try:
                    msg = await asyncio.wait_for(ws.recv(), timeout=max(0.01, end - time.monotonic()))
                except TimeoutError:
                    break
                counts[view][0] += len(msg.encode() if isinstance(msg, str) else msg)
                counts[view][1] += 1

    async def both() -> None:
        await asyncio.gather(listen("cluster", ""), listen("job", f"?view=job&job={job_id}"))

    t = threading.Thread(target=churn, daemon=True)
    t.start()
    try:
        asyncio.run(both())
    finally:
        stop.set()
        t.join(timeout=10)
    return {f"{v}_bytes_per_s": round(b / seconds) for v, (b, _) in counts.items()} | {
        f"{v}_messages_per_s": round(m / seconds, 1) for v, (_, m) in counts.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--changes", type=int, default=60)
    ap.add_argument("--renders", type=int, default=3)
    ap.add_argument("--busy-s", type=float, default=20.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    out: dict = {"machine": f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}"}
    tmp = Path(tempfile.mkdtemp(prefix="pearl-bench-dash-"))
    rport = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    web = None
    try:
        wait_port(rport)
        setup_django(tmp / "bench.sqlite3", f"redis://127.0.0.1:{rport}")
        from django.contrib.auth.models import Group, User
        from django.test import Client

        from controlplane.models import GPU, Node

        user = User.objects.create_user(username="bench", password="bench-pass-123", is_staff=True)
        user.groups.add(Group.objects.get_or_create(name="operators")[0])
        c = Client()
        c.force_login(user)
        cookie = c.cookies["sessionid"].value
        job_small = seed(128)
        port = free_port()
        web = subprocess.Popen(
            [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "pearl_site.asgi:application"],
            cwd=ROOT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(port)
        base = f"http://127.0.0.1:{port}"
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
            ctx = browser.new_context(viewport={"width": 1400, "height": 900})
            ctx.add_cookies([{"name": "sessionid", "value": cookie, "url": base}])
            page = ctx.new_page()
            first_render(page, base)  # warm-up: Daphne, the browser cache
            runs = [first_render(page, base) for _ in range(args.renders)]
            out["first_render_1024"] = {
                "gpus": GPU.objects.count(),
                "cells": runs[0][1],
                "runs_ms": [round(r[0]) for r in runs],
                "median_ms": round(statistics.median(r[0] for r in runs)),
            }
            page.evaluate("localStorage.removeItem('pearl.map')")
            node_id = Node.objects.filter(pool="reserved").order_by("name").values_list("id", flat=True).first()
            if node_id is None:
                raise SystemExit("the seeded cluster has no reserved node to drain")
            lat = change_latency(page, base, node_id, args.changes)
            out["change_to_dom"] = {
                "n": len(lat),
                "p50_ms": round(pct(lat, 0.5), 1),
                "p95_ms": round(pct(lat, 0.95), 1),
                "max_ms": round(max(lat), 1),
            }
            page.goto(base + "/accounts/login/")
            out["busy_1024"] = off_loop(busy_traffic, f"ws://127.0.0.1:{port}", cookie, job_small, args.busy_s)
            off_loop(seed, 896, 8, 128)  # 128 + 896 = 1,024 nodes x 8 = 8,192 GPUs
            runs = [first_render(page, base) for _ in range(args.renders)]
            out["first_render_8192"] = {
                "gpus": GPU.objects.count(),
                "view": "auto (heatmap)",
                "runs_ms": [round(r[0]) for r in runs],
                "median_ms": round(statistics.median(r[0] for r in runs)),
            }
            runs = [first_render(page, base, "detail") for _ in range(args.renders)]
            out["first_render_8192_detail"] = {
                "cells": runs[0][1],
                "runs_ms": [round(r[0]) for r in runs],
                "median_ms": round(statistics.median(r[0] for r in runs)),
            }
            browser.close()
    finally:
        if web is not None:
            web.terminate()
            web.wait(timeout=10)
        redis.terminate()
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
