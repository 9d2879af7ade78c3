"""Multi-host tests on one machine: every host in its own network namespace with its own address.

    switch ns   a Linux bridge; one veth pair per host (its link can be cut: a partition)
    control ns  10.77.0.1   Redis, Daphne, a Celery worker with beat, the Ray bridge
    head ns     10.77.0.2   the Ray head (GCS)
    node ns K   10.77.0.1K  a Ray raylet (`ray start --address 10.77.0.2:6380`, logical GPUs), on which the
                            bridge places the node's PEARL agent as a detached actor

The database is a PostgreSQL server of the harness's own (initdb in /tmp, started on the control
host, reached over its Unix socket: a file, so no TCP leaves the namespaces), which a scenario may
crash and restart; without PostgreSQL's binaries, the system's server over its socket if one answers,
else SQLite. Only the namespaces made here are
touched; every process is started here in its own process group and killed by that group; `ray stop`
is never run (it would end every Ray process on the host). Root only: skipped with a reason otherwise.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.environment import ROOT

SUBNET = "10.77.0"
CONTROL_IP = f"{SUBNET}.1"
HEAD_IP = f"{SUBNET}.2"  # the Ray head: its own host, so cutting the control plane off is not a Ray partition
WEB_PORT, REDIS_PORT, RAY_PORT = 8000, 6379, 6380
LEASE_S, HEARTBEAT_S, SWEEP_S = 5.0, 0.5, 1.0  # 3 s flapped on two cores at load ~25 (every node, no fault)
PG_SOCKET = "/var/run/postgresql"  # the system's server (the fallback without PostgreSQL's binaries)
PG_BIN = Path("/usr/lib/postgresql")
RAY_HEALTH = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "15",
}
# Ray declares a silent node dead after ~15 s: longer than a partition of twice the lease (10 s), which PEARL
# fences on its own; a killed node is not_ready after one lease and gone when Ray says so


def ray_tmp(prefix: str) -> Path:
    """Ray's temp dirs: short paths, since its Unix sockets there must fit in 107 bytes (a pytest tmp path may not)."""
    return Path("/tmp") / f"{prefix}-ray"


def _why_not() -> str:
    if sys.platform != "linux":
        return "multi-host tests need Linux network namespaces"
    if os.geteuid() != 0:
        return "multi-host tests need root (ip netns); CI runs them as root"
    if not shutil.which("ip") or subprocess.run(["ip", "netns", "list"], capture_output=True).returncode != 0:
        return "`ip netns` is not available here"
    if not shutil.which("redis-server"):
        return "redis-server is not installed"
    try:
        import ray  # noqa: F401
    except ImportError:
        return "Ray is not installed (pip install -c constraints.txt '.[ray]')"
    return ""


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def sh(*argv: str) -> None:
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")


@dataclass
class Hosts:
    """The namespaces, their links and the processes started in them (by process group)."""

    prefix: str
    tmp: Path
    namespaces: list[str] = field(default_factory=list)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    pg_argv: list[str] = field(default_factory=list)  # the harness's PostgreSQL, if it runs one

    @property
    def switch(self) -> str:
        return f"{self.prefix}-sw"

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def add_switch(self) -> None:
        sh("ip", "netns", "add", self.switch)
        self.namespaces.append(self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")

    def add_host(self, host: str, ip: str) -> None:
        """A namespace with loopback and one veth (eth0, `ip`/24) plugged into the switch as v-<host>."""
        ns = self.ns(host)
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", self.switch, "link", "add", f"v-{host}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "-n", self.switch, "link", "set", f"v-{host}", "master", "br0")
        sh("ip", "-n", self.switch, "link", "set", f"v-{host}", "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")

    def link(self, host: str, up: bool) -> None:
        """Cut (or restore) a host's only link: a partition both Ray and PEARL's lease see."""
        sh("ip", "-n", self.switch, "link", "set", f"v-{host}", "up" if up else "down")

    def start(self, name: str, host: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        with open(self.tmp / f"{name}.log", "ab") as log:  # the child keeps its own copy of the descriptor
            proc = subprocess.Popen(
                ["ip", "netns", "exec", self.ns(host), *argv],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        return proc

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Signal a process group this harness started (never anything found by name)."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(timeout=30)

    def log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def teardown(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        for proc in self.procs.values():  # whatever is left of every group, children included
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for ns in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True)


class Database:
    """Read-only looks at the control plane's database from the test (PostgreSQL or SQLite)."""

    def __init__(self, url: str, socket_dir: str = PG_SOCKET) -> None:
        self.url = url
        self.socket_dir = socket_dir

    def rows(self, sql: str, *params: Any) -> list[tuple]:
        if self.url.startswith("sqlite:///"):
            with sqlite3.connect(self.url[len("sqlite:///") :], timeout=10) as c:
                return c.execute(sql.replace("%s", "?"), params).fetchall()
        import psycopg

        with psycopg.connect(host=self.socket_dir, user="postgres", dbname=self.url.rsplit("/", 1)[1]) as c:
            return c.execute(sql, params).fetchall()

    def answers(self) -> bool:
        try:
            return bool(self.rows("SELECT 1"))
        except Exception:  # down, or still replaying its WAL
            return False

    def nodes(self) -> dict[str, dict[str, Any]]:
        cols = ("name", "status", "epoch", "pool", "ray_node_id", "ray_address", "address", "preemption_deadline")
        return {r[0]: dict(zip(cols, r)) for r in self.rows(f"SELECT {', '.join(cols)} FROM controlplane_node")}

    def events(self, kind: str) -> list[dict[str, Any]]:
        out = []
        for k, message, data, created, node in self.rows(
            "SELECT e.kind, e.message, e.data, e.created, n.name FROM controlplane_event e "
            "LEFT JOIN controlplane_node n ON n.id = e.node_id WHERE e.kind = %s ORDER BY e.id",
            kind,
        ):
            out.append(
                {
                    "kind": k,
                    "message": message,
                    "data": json.loads(data) if isinstance(data, str) else data,
                    "created": created,
                    "node": node,
                }
            )
        return out


def _pg_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory (Debian's layout), if any."""
    found = sorted(
        PG_BIN.glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0
    )
    return found[-1].parent if found else None


def pg_dir(prefix: str) -> Path:
    """The harness's own PostgreSQL: its data and its socket (a short path: the socket's must fit in 107 bytes)."""
    return Path("/tmp") / f"{prefix}-pg"


def _private_database(prefix: str, hosts: Hosts) -> tuple[str, Callable[[], None], str] | None:
    """initdb a PostgreSQL of the harness's own and start it on the control host (as the postgres user:
    PostgreSQL refuses root); None without its binaries or that user."""
    bin_dir = _pg_bin()
    if bin_dir is None or subprocess.run(["id", "postgres"], capture_output=True).returncode != 0:
        return None
    root = pg_dir(prefix)
    root.mkdir()
    shutil.chown(root, "postgres")
    r = subprocess.run(
        [
            "runuser",
            "-u",
            "postgres",
            "--",
            str(bin_dir / "initdb"),
            "-D",
            str(root / "data"),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        ],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        shutil.rmtree(root, ignore_errors=True)
        return None
    hosts.pg_argv = [
        "runuser", "-u", "postgres", "--", str(bin_dir / "postgres"), "-D", str(root / "data"), "-k", str(root),
        "-c", "listen_addresses=", "-c", "fsync=off", "-c", "max_connections=200",
    ]  # fmt: skip
    start_database(hosts)
    name = "pearl"
    wait_for(lambda: (root / ".s.PGSQL.5432").exists(), 60, "the harness's PostgreSQL")
    import psycopg

    def create() -> bool:
        try:
            with psycopg.connect(host=str(root), user="postgres", dbname="postgres", autocommit=True) as c:
                c.execute(f"CREATE DATABASE {name}")
            return True
        except psycopg.OperationalError:  # still starting
            return False

    wait_for(create, 60, "the harness's PostgreSQL to accept a connection")
    return f"postgres://postgres@{str(root).replace('/', '%2F')}/{name}", lambda: None, str(root)


def start_database(hosts: Hosts) -> None:
    """(Re)start the harness's PostgreSQL on the control host, in its own process group."""
    hosts.start("postgres", "cp", hosts.pg_argv, {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C"})


def _database(prefix: str, hosts: Hosts) -> tuple[str, Callable[[], None], str]:
    """A fresh database for the control plane: (url, drop, socket dir). The harness's own PostgreSQL;
    else the system's over its socket if it answers; else SQLite."""
    own = _private_database(prefix, hosts)
    if own is not None:
        return own
    try:
        import psycopg

        name = f"multihost_{prefix}".replace("-", "_")
        with psycopg.connect(
            host=PG_SOCKET, user="postgres", dbname="postgres", autocommit=True, connect_timeout=3
        ) as c:
            c.execute(f"CREATE DATABASE {name}")

        def drop() -> None:
            with psycopg.connect(host=PG_SOCKET, user="postgres", dbname="postgres", autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

        return f"postgres://postgres@%2Fvar%2Frun%2Fpostgresql/{name}", drop, PG_SOCKET
    except Exception:
        return f"sqlite:///{hosts.tmp / 'pearl.sqlite3'}", lambda: None, ""


@dataclass
class Cluster:
    hosts: Hosts
    db: Database
    env: dict[str, str]
    nodes: dict[str, str] = field(default_factory=dict)  # host -> ip

    @property
    def control_plane(self) -> str:
        return f"http://{CONTROL_IP}:{WEB_PORT}"

    def manage(self, *args: str) -> str:
        r = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300
        )
        if r.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)}: {r.stdout[-2000:]}{r.stderr[-2000:]}")
        return r.stdout

    def start_daphne(self) -> None:
        argv = [sys.executable, "-m", "daphne", "-b", CONTROL_IP, "-p", str(WEB_PORT), "pearl_site.asgi:application"]
        self.hosts.start("daphne", "cp", argv, self.env)

    def restart_database_and_daphne(self, down_s: float) -> tuple[float, float]:
        """Crash the database and Daphne (SIGKILL of their process groups: PostgreSQL recovers from its
        WAL), keep them down `down_s`, start both again. Returns (down at, up at), Unix seconds."""
        if not self.hosts.pg_argv:
            pytest.skip("the harness runs no PostgreSQL of its own here (no initdb): nothing to restart")
        t_down = time.time()
        self.hosts.kill("daphne")
        self.hosts.kill("postgres")
        time.sleep(down_s)
        start_database(self.hosts)
        wait_for(self.db.answers, 60, "PostgreSQL to recover and accept connections")
        self.start_daphne()
        return t_down, time.time()

    def start_ray_node(
        self, host: str, *, gpus: int = 2, pool: str = "elastic", name: str = "", ports: tuple[str, ...] = ()
    ) -> None:
        """A Ray worker node on `host` (its namespace, its address), `gpus` logical GPUs; `name` (default: the
        host) names its process and temp dir, `ports` are extra `ray start` flags (a second raylet on a host)."""
        ip, name = self.nodes[host], name or host
        self.hosts.start(
            f"ray-{name}",
            host,
            [
                str(Path(sys.executable).parent / "ray"),
                "start",
                "--block",
                "--address",
                f"{HEAD_IP}:{RAY_PORT}",
                "--node-ip-address",
                ip,
                "--num-cpus",
                "1",
                "--num-gpus",
                str(gpus),
                "--object-store-memory",
                "80000000",
                "--labels",
                f"pearl.io/pool={pool},pearl.io/hardware=H800",
                "--disable-usage-stats",
                "--temp-dir",
                str(ray_tmp(self.hosts.prefix) / name),
                *ports,
            ],
            self.env | RAY_HEALTH,
        )

    def add_node(self, host: str, **kw: Any) -> str:
        """A new host with a Ray node on it."""
        ip = f"{SUBNET}.{10 + len(self.nodes) + 1}"
        self.hosts.add_host(host, ip)
        self.nodes[host] = ip
        self._start_node(host, **kw)
        return ip

    def add_logical_node(self, name: str, host: str, index: int, **kw: Any) -> str:
        """One more Ray node on a shared host (several raylets on one namespace and address, as Ray's own
        cluster_utils runs them): each its own fixed ports (`index` picks them), since two raylets on one
        address cannot both take Ray's defaults (the dashboard agent's 52365)."""
        if host not in self.nodes:
            self.nodes[host] = f"{SUBNET}.{10 + len(self.nodes) + 1}"
            self.hosts.add_host(host, self.nodes[host])
        base = 20000 + 100 * index
        flags = ("node-manager", "object-manager", "dashboard-agent-listen", "dashboard-agent-grpc")
        ports = [f"--{f}-port={base + i}" for i, f in enumerate(flags)]
        ports += [f"--runtime-env-agent-port={base + 4}", f"--metrics-export-port={base + 5}"]
        ports += [f"--min-worker-port={base + 10}", f"--max-worker-port={base + 99}"]
        self._start_node(host, name=name, ports=tuple(ports), **kw)
        return self.nodes[host]

    def _start_node(self, host: str, **kw: Any) -> None:
        """Start a Ray node and wait for it, one at a time: `ray start` gives its raylet a fixed 30 s to
        register with the GCS (hard-coded in ray/_private/node.py, no setting), which several starting at
        once on two loaded cores overrun; one that gives up so is started again (twice at most)."""
        name = f"ray-{kw.get('name') or host}"
        for _ in range(3):
            seen = len(self.hosts.log(name))
            self.start_ray_node(host, **kw)
            proc = self.hosts.procs[name]
            wait_for(functools.partial(self._started_or_dead, name, proc, seen), 180, f"the Ray node {name}")
            if proc.poll() is None:
                return
            self.hosts.kill(name)  # what is left of its process group
        raise AssertionError(f"the Ray node {name} did not start: {self.hosts.log(name)[-2000:]}")

    def _started_or_dead(self, name: str, proc: subprocess.Popen, seen: int) -> bool:
        return "Ray runtime started" in self.hosts.log(name)[seen:] or proc.poll() is not None

    def start_bridge(self) -> None:
        self.hosts.start(
            "bridge",
            "cp",
            [
                sys.executable,
                "manage.py",
                "ray_bridge",
                "--address",
                f"{HEAD_IP}:{RAY_PORT}",
                "--control-plane",
                self.control_plane,
                "--time-factor",
                "0.05",
                "--state-root",
                str(self.hosts.tmp / "agents"),
                "--interval",
                "0.5",
                "--release-drained",
            ],
            self.env,
        )

    def bridge_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.hosts.log("bridge").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def ray_node_of(self, host: str) -> str:
        """The Ray node id of the node at host's address, from PEARL's database (bound by the bridge)."""
        ip = self.nodes[host]
        return wait_for(
            lambda: next((n for n in self.db.nodes().values() if n["ray_address"] == ip and n["ray_node_id"]), None),
            120,
            f"the node at {ip} to be bound",
        )

    def ray_drain(self, ray_node_id: str, deadline_s: int) -> float:
        """What KubeRay or a cloud watcher does: `ray drain-node` with reason PREEMPTION. Returns when."""
        t = time.time()
        r = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.hosts.ns("cp"),
                str(Path(sys.executable).parent / "ray"),
                "drain-node",
                "--address",
                f"{HEAD_IP}:{RAY_PORT}",
                "--node-id",
                ray_node_id,
                "--reason",
                "DRAIN_NODE_REASON_PREEMPTION",
                "--reason-message",
                "spot notice (test)",
                "--deadline-remaining-seconds",
                str(deadline_s),
            ],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        return t


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    why = _why_not()
    if why:
        pytest.skip(why)
    prefix = "pl" + secrets.token_hex(2)
    tmp = tmp_path_factory.mktemp("multihost")
    hosts = Hosts(prefix=prefix, tmp=tmp)
    try:
        hosts.add_switch()
        hosts.add_host("cp", CONTROL_IP)
        url, drop, socket_dir = _database(prefix, hosts)
    except BaseException:
        hosts.teardown()
        shutil.rmtree(pg_dir(prefix), ignore_errors=True)
        raise
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PEARL_", "RAY_", "DJANGO_ALLOW"))}
    redis_password = secrets.token_urlsafe(12)  # Redis listens on the control host's address: not without a password
    env |= {
        "DATABASE_URL": url,
        "REDIS_URL": f"redis://:{redis_password}@{CONTROL_IP}:{REDIS_PORT}",
        "PEARL_TESTING": "1",
        "DEBUG": "0",
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
        "PEARL_VAR_DIR": str(tmp / "var"),
        "ALLOWED_HOSTS": f"{CONTROL_IP},localhost,127.0.0.1",
        "PEARL_LEASE_S": str(LEASE_S),
        "PEARL_HEARTBEAT_S": str(HEARTBEAT_S),
        "PEARL_SWEEP_S": str(SWEEP_S),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PEARL_DATAPLANE_SECRET": "multihost-dp-secret",
    }
    c = Cluster(hosts=hosts, db=Database(url, socket_dir), env=env)
    try:
        c.manage("migrate", "--verbosity", "0")
        c.manage("setup_periodic_tasks")
        c.env["PEARL_BRIDGE_TOKEN"] = c.manage("ray_bridge", "--issue-token", "ray").strip().splitlines()[-1]
        hosts.start(
            "redis",
            "cp",
            [
                "redis-server",
                "--port",
                str(REDIS_PORT),
                "--bind",
                CONTROL_IP,
                "--save",
                "",
                "--appendonly",
                "no",
                "--requirepass",
                redis_password,
            ],
            env,
        )
        c.start_daphne()
        hosts.start(
            "celery",
            "cp",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "pearl_site",
                "worker",
                "-B",
                "--pool=threads",
                "--concurrency=2",
                "-l",
                "info",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"multihost-{prefix}@%h",
                "-s",
                str(tmp / "beat-schedule"),
            ],
            env,
        )
        hosts.add_host("head", HEAD_IP)
        hosts.start(
            "ray-head",
            "head",
            [
                str(Path(sys.executable).parent / "ray"),
                "start",
                "--head",
                "--block",
                "--node-ip-address",
                HEAD_IP,
                "--port",
                str(RAY_PORT),
                "--num-cpus",
                "1",
                "--num-gpus",
                "0",
                "--object-store-memory",
                "80000000",
                "--disable-usage-stats",
                "--include-dashboard=false",
                "--temp-dir",
                str(ray_tmp(prefix) / "head"),
            ],
            env | RAY_HEALTH,
        )
        wait_for(
            lambda: "Ray runtime started" in hosts.log("ray-head") or hosts.procs["ray-head"].poll() is not None,
            180,
            "the Ray head",
        )
        assert hosts.procs["ray-head"].poll() is None, hosts.log("ray-head")[-3000:]
        wait_for(lambda: "ready." in hosts.log("celery") or hosts.procs["celery"].poll() is not None, 120, "celery")
        assert hosts.procs["celery"].poll() is None, hosts.log("celery")[-3000:]
        yield c
    finally:
        hosts.teardown()
        drop()
        shutil.rmtree(ray_tmp(prefix), ignore_errors=True)
        shutil.rmtree(pg_dir(prefix), ignore_errors=True)
