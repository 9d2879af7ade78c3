"""The control-plane benchmarks' process harness, in one place: a fresh PostgreSQL database migrated by a
checkout, the cluster's rows seeded in bulk, the servers (Redis, Daphne, a Celery worker) and the load
generators (`load_agents.py`: emulated node agents over real websockets) as child processes, and the /proc
readings (CPU seconds, RSS) the figures are taken from. bench_load.py, bench_plan_scale.py, bench_heartbeat.py
and bench_fuzz.py run their clusters through it, so a fix to how a child starts or stops reaches them all.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench_controlplane import PY, ROOT, free_port, wait_port

HERE = Path(__file__).resolve().parent
TICK = os.sysconf("SC_CLK_TCK")


def setup(db_url: str, redis_url: str, tmp: Path | None = None, root: Path = ROOT) -> None:
    """A fresh database (dropped and created) migrated by the control plane of `root` (another checkout's for
    a side-by-side run), in this process."""
    os.environ.update(DATABASE_URL=db_url, REDIS_URL=redis_url, PEARL_TESTING="1", DEBUG="0")
    if tmp is not None:
        os.environ["PEARL_VAR_DIR"] = str(tmp)
    sys.path.insert(0, str(root))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pearl_site.settings")
    import psycopg

    base, name = db_url.rsplit("/", 1)
    with psycopg.connect(base + "/postgres", autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        c.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def postgres_url() -> str:
    """DATABASE_URL, which must name a PostgreSQL database the benchmark may drop and create."""
    db_url = os.environ.get("DATABASE_URL", "")
    if not db_url.startswith("postgres"):
        raise SystemExit("set DATABASE_URL to a PostgreSQL database this benchmark may drop and create")
    return db_url


def write_report(out: dict[str, Any], path: str = "") -> None:
    """The run's figures as JSON on stdout, and in `path` when given (--out)."""
    text = json.dumps(out, indent=2)
    if path:
        Path(path).write_text(text)
    print(text)


def seed_nodes(prefix: str, n: int, *, gpus: int, pool: str, address: str = "") -> tuple[list[Any], dict[str, str]]:
    """n nodes named <prefix>-00000.. (not ready until their agent registers) of `gpus` H800 slots each, and
    their agent tokens, written in bulk (the agents then register over their sockets, or the benchmark in
    process): (the Node rows in name order, name -> token)."""
    from django.utils import timezone

    from controlplane.models import GPU, AgentCredential, Node
    from controlplane.services.credentials import TOKEN_PREFIX

    now = timezone.now()
    names = [f"{prefix}-{i:05d}" for i in range(n)]
    tokens = {name: TOKEN_PREFIX + secrets.token_urlsafe(32) for name in names}
    AgentCredential.objects.bulk_create(
        [
            AgentCredential(node_name=name, key_hash=hashlib.sha256(t.encode()).hexdigest(), prefix=t[4:12])
            for name, t in tokens.items()
        ]
    )
    Node.objects.bulk_create(
        [
            Node(
                name=name,
                pool=pool,
                status="not_ready",
                hardware="H800",
                epoch=1,
                generation=1,
                last_heartbeat=now,
                lease_expires=now,
                address=address,
            )
            for name in names
        ]
    )
    nodes = list(Node.objects.filter(name__in=names).order_by("name"))
    GPU.objects.bulk_create(
        [
            GPU(node=node, index=s, hardware="H800", memory_mb=81920, zone="rollout")
            for node in nodes
            for s in range(gpus)
        ]
    )
    return nodes, tokens


def seed_workers(job: Any, nodes: list[Any], gpus: int, *, endpoints: bool = False) -> dict[tuple[int, int], Any]:
    """One active colocated worker of `job` on each GPU slot of these nodes (job slot gpus * i + index),
    bound to it, in bulk; with `endpoints`, each serving on its own loopback port. (node id, index) -> Worker."""
    from controlplane.models import GPU, Worker, WorkerGPU

    Worker.objects.bulk_create(
        [
            Worker(
                job=job,
                slot=gpus * i + s,
                node=node,
                zone="rollout",
                role="colocated",
                activity="active",
                engine="emulated",
                endpoint=f"http://127.0.0.1:{20000 + gpus * i + s}" if endpoints else "",
            )
            for i, node in enumerate(nodes)
            for s in range(gpus)
        ]
    )
    slots = {(g.node_id, g.index): g for g in GPU.objects.filter(node__in=nodes)}
    workers = {(w.node_id, w.slot % gpus): w for w in Worker.objects.filter(job=job, node__in=nodes)}
    WorkerGPU.objects.bulk_create(
        [WorkerGPU(worker=w, gpu=slots[key], kind="rollout", alive=True, active=True) for key, w in workers.items()]
    )
    return workers


def start_redis() -> tuple[subprocess.Popen[bytes], int]:
    """A Redis of the benchmark's own (no persistence) on a free port, once it accepts connections."""
    port = free_port()
    redis = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_port(port)
    return redis, port


def start_daphnes(
    n: int, *, cwd: Path, env: dict[str, str], tmp: Path, ports: list[int] | None = None
) -> tuple[list[int], list[subprocess.Popen[bytes]]]:
    """n Daphne processes of the checkout at `cwd`, each on a free port (or on `ports`: a restart on the same
    addresses), logging to tmp/daphne-<port>.log, once each accepts connections (up to 600 s: a contended
    machine starts Django slowly): (ports, processes)."""
    ports = list(ports) if ports else [free_port() for _ in range(n)]
    web = [
        subprocess.Popen(
            [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(pt), "pearl_site.asgi:application"],
            cwd=cwd,
            env=env,
            stdout=open(tmp / f"daphne-{pt}.log", "ab"),  # noqa: SIM115 the child keeps writing to it
            stderr=subprocess.STDOUT,
        )
        for pt in ports
    ]
    try:
        for pt in ports:
            wait_port(pt, timeout=600)
    except BaseException:
        stop(web)
        raise
    return ports, web


def start_celery(options: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A Celery worker of the checkout at `cwd` (`celery -A pearl_site worker <options>`), logging to `log`."""
    return subprocess.Popen(
        [PY, "-m", "celery", "-A", "pearl_site", "worker", *options],
        cwd=cwd,
        env=env,
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
    )


def start_generators(
    agents: list[list[Any]], *, generators: int, ports: list[int], tmp: Path, **spec: Any
) -> list[subprocess.Popen[str]]:
    """`generators` load-generator processes (load_agents.py), the agents shared out among them, each given
    its spec line (the agent link of every Daphne port, its agents and their offset, and `spec`). Returns as
    soon as they start, so the caller's `finally` can stop them; `wait_ready` then waits for their
    registrations."""
    urls = [f"ws://127.0.0.1:{pt}/ws/agent/" for pt in ports]
    gens: list[subprocess.Popen[str]] = []
    share = (len(agents) + generators - 1) // generators
    for g in range(generators):
        p = subprocess.Popen(
            [PY, str(HERE / "load_agents.py")],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(tmp / f"gen-{g}.log", "a"),  # noqa: SIM115 the child keeps writing to it
            text=True,
        )
        gens.append(p)
        send([p], {"urls": urls, "agents": agents[g * share : (g + 1) * share], "offset": g * share, **spec})
    return gens


def wait_ready(gens: list[subprocess.Popen[str]], tmp: Path) -> None:
    """Until every generator said READY (every agent of it registered; they heartbeat from then on)."""
    for p in gens:
        assert p.stdout is not None
        if p.stdout.readline().strip() != "READY":
            raise RuntimeError(f"a load generator failed: see {tmp}/gen-*.log")


def send(gens: list[subprocess.Popen[str]], line: dict[str, Any], *, last: bool = False) -> None:
    """One JSON line to every generator's stdin (the window's start, a stop); `last` closes stdin after it."""
    for p in gens:
        assert p.stdin is not None
        p.stdin.write(json.dumps(line) + "\n")
        p.stdin.flush()
        if last:
            p.stdin.close()


def results(gens: list[subprocess.Popen[str]]) -> list[dict[str, Any]]:
    """Each generator's results: the last JSON line it wrote before it ended."""
    outs = []
    for p in gens:
        assert p.stdout is not None
        lines = p.stdout.read().strip().splitlines()
        p.wait(timeout=120)
        outs.append(json.loads(lines[-1]))
    return outs


def stop(procs: Iterable[subprocess.Popen[Any]], *, kill: bool = False) -> None:
    """End these children: killed at once with `kill` (load generators that outlived the run), else asked
    to terminate and killed after 30 s."""
    for p in procs:
        if p.poll() is not None:
            continue
        if kill:
            p.kill()
            continue
        p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (0 once it is gone)."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / TICK
    except OSError:
        return 0.0


def rss_mb(pid: int) -> float:
    """The process's resident memory in MiB (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0
