"""A real stack for fault injection: its own Redis (so it can be restarted), Daphne, a Celery worker
with beat running the heartbeat sweeper every second, and node agents as processes, all on the test
database with a short lease. Faults are real: kill -9, SIGSTOP, a Redis restart, a preemption.

Timings are recorded, never asserted: with PEARL_FAULT_TIMINGS=<file>, every scenario appends its
detection and recovery times (benchmarks/bench_faults.py runs the suite and reports them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.fault.private_postgres import PrivatePostgres, default_database, private_postgres, unavailable
from tests.support.environment import ROOT, child_env
from tests.support.processes import free_port, stop_processes, wait_port

LEASE_S, HEARTBEAT_S, SWEEP_S = 3.0, 0.5, 1.0
SECRET = "fault-dp-secret"


def wait_for(predicate: Callable[[], Any], timeout: float = 90.0, what: str = "") -> Any:
    """Poll until truthy (a hang guard, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}{last_events()}")


def last_events(n: int = 12) -> str:
    """The cluster's last events on one line, for a failure message: CI's report shows a failure's one-line
    summary whatever else it cuts."""
    try:
        from controlplane.models import Event

        rows = list(Event.objects.order_by("-id").values_list("kind", "message")[:n])
    except Exception:  # no database in this test: nothing to add
        return ""
    return "; last events: " + " | ".join(f"{kind}: {message[:120]}" for kind, message in reversed(rows))


def preempt_via_api(node_id: int, deadline_s: float, operator: str) -> float:
    """An operator sends the node a preemption notice through the REST API; returns when (time.time())."""
    from django.contrib.auth.models import User
    from rest_framework.test import APIClient

    api = APIClient()
    api.force_authenticate(User.objects.create_user(operator, is_staff=True))
    t_notice = time.time()
    r = api.post(f"/api/nodes/{node_id}/preemption/", {"deadline_s": deadline_s}, format="json")
    assert r.status_code == 200, r.content
    return t_notice


def record_timing(fault: str, **figures: float) -> None:
    path = os.environ.get("PEARL_FAULT_TIMINGS")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"fault": fault, **figures}) + "\n")


def assert_invariants() -> None:
    """docs/design.md §3 over the whole cluster: no GPU bound to two active rollout workers, no GPU in two roles,
    no overlap rollout worker active while its job trains; plus every worker process pinned as bound."""
    from controlplane.core.invariants import check_invariants
    from controlplane.models import WorkerGPU
    from controlplane.selectors.cluster import training_flags, worker_views

    views = worker_views()
    assert check_invariants(views, training_flags({v.job for v in views})) == []
    active = list(WorkerGPU.objects.filter(active=True).values_list("gpu_id", flat=True))
    assert len(active) == len(set(active)), "a GPU has two active workers"


def _cmdline(pid: int) -> str:
    """A process's command line, for a message."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return f"{pid}: (gone)"
    return f"{pid}: {cmd.decode(errors='replace')[:300]}"


def processes_under(path: Path) -> list[int]:
    """Live processes whose command line mentions `path` (this test's agents and their workers)."""
    out = []
    needle = str(path).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in cmd and state not in ("Z", "X"):
            out.append(int(entry.name))
    return out


@dataclass
class Stack:
    base_url: str
    redis_port: int
    tmp: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    tokens: dict[str, str] = field(default_factory=dict)
    postgres: PrivatePostgres | None = None  # the stack's own database server (`private_postgres` marker)
    # every process group the stack started, a restarted process's old one too: a SIGKILLed Celery worker's
    # embedded beat (its child) lives on in the killed worker's group, and `stop` kills what is left there
    groups: list[int] = field(default_factory=list)

    def start_redis(self) -> None:
        argv = ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no"]
        with open(self.tmp / "redis.log", "ab") as log:
            self.procs["redis"] = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.groups.append(self.procs["redis"].pid)
        wait_port(self.redis_port, proc=self.procs["redis"])

    def start(self, name: str, argv: list[str], **env: str) -> subprocess.Popen:
        with open(self.tmp / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self.env | env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs[name] = proc
        self.groups.append(proc.pid)
        return proc

    def agent(
        self,
        name: str,
        pool: str = "reserved",
        slots: int = 2,
        engine: str = "emulated",
        time_factor: float = 0.5,
        **env: str,
    ) -> subprocess.Popen:
        """An agent process; emulated engines take H800 × model timings (qwen3-8b requests run for a while).
        `env`: more of its environment, which its workers and rollout drivers inherit (e.g. PEARL_CRASH_AT)."""
        from controlplane.services.credentials import issue_agent_token

        if name not in self.tokens:
            self.tokens[name] = issue_agent_token(node_name=name)
        return self.start(
            f"agent-{name}",
            [
                sys.executable,
                "-m",
                "agents.node",
                "--control-plane",
                self.base_url,
                "--node",
                name,
                "--slots",
                str(slots),
                "--pool",
                pool,
                "--hardware",
                "cpu" if engine in ("torch", "vllm") else "H800",
                "--engine",
                engine,
                "--time-factor",
                str(time_factor),
                "--state-dir",
                str(self.tmp / "agents" / name),
                "--drain-timeout",
                "2",
                "-v",
            ],
            PEARL_AGENT_TOKEN=self.tokens[name],
            PEARL_DATAPLANE_SECRET=SECRET,
            **env,
        )

    def kill9(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait()

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """The agents first, all at once (each drains its workers; one after another they took seconds each),
        then Celery, Daphne and Redis; whatever is left in the stack's process groups is killed."""
        for names in ([n for n in self.procs if n.startswith("agent-")], ["celery"], ["daphne"], ["redis"]):
            stop_processes([p for n in names if (p := self.procs.get(n)) is not None], grace_s=30.0)
        for pgid in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def postgres_cluster(transactional_db) -> Iterator[PrivatePostgres]:
    """A private PostgreSQL cluster, migrated, as this process's default database while the test runs (the
    stack's servers get it through `child_env`); skipped where one cannot be started."""
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    with private_postgres() as pg, default_database(pg.url):
        yield pg


@pytest.fixture
def stack(request, transactional_db, tmp_path, settings) -> Iterator[Stack]:
    """The stack on its own Redis; this test process sends its pushes through that Redis too. A test marked
    `replan_every(seconds)` also gets the periodic re-plan, created before beat starts: django-celery-beat
    misses a task created between its first read of the schedule and its first change check. A test marked
    `lease(seconds)` runs on that lease instead of the fault tests' short one; one marked `private_postgres` on
    its own PostgreSQL cluster (`stack.postgres`), which it may kill and start again; one marked
    `manual_placement` with the planner off (`PEARL_PLANNER=off`), as it places its workers itself: a node's
    registration and a job's arrival each queue the arbiter's task, which plans every live job, and its plan
    replaced workers such a test had just placed (a rollout worker stopped: `2C → 1C`)."""
    from channels.layers import channel_layers
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    pg = request.getfixturevalue("postgres_cluster") if request.node.get_closest_marker("private_postgres") else None
    redis_port, web_port = free_port(), free_port()
    redis_url = f"redis://127.0.0.1:{redis_port}"
    settings.REDIS_URL = redis_url
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": f"{redis_url}/1", "socket_timeout": 30}]},
        }
    }
    lease = request.node.get_closest_marker("lease")
    lease_s = float(lease.args[0]) if lease else LEASE_S
    manual = request.node.get_closest_marker("manual_placement") is not None
    settings.PEARL = {
        **settings.PEARL,
        "LEASE_S": lease_s,
        "HEARTBEAT_S": HEARTBEAT_S,
        "SWEEP_S": SWEEP_S,
        "PLANNER": not manual,
    }
    channel_layers.backends.clear()
    env = child_env(
        REDIS_URL=redis_url,
        PEARL_LEASE_S=str(lease_s),
        PEARL_HEARTBEAT_S=str(HEARTBEAT_S),
        PEARL_SWEEP_S=str(SWEEP_S),
        PEARL_PLANNER="off" if manual else "on",
    )
    env.pop("PEARL_AGENT_TOKEN", None)
    if pg is not None:  # production's persistent connections (off in tests), which must survive a server restart
        env["PEARL_DB_CONN_MAX_AGE"] = "60"
    s = Stack(base_url=f"http://127.0.0.1:{web_port}", redis_port=redis_port, tmp=tmp_path, env=env, postgres=pg)
    every, _ = IntervalSchedule.objects.get_or_create(every=1, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(name="sweeper", task="controlplane.sweep", interval=every)
    replan = request.node.get_closest_marker("replan_every")
    if replan:  # otherwise the planner stays out: those tests place workers themselves through the services
        seconds = int(replan.args[0])
        every_r, _ = IntervalSchedule.objects.get_or_create(every=seconds, period=IntervalSchedule.SECONDS)
        PeriodicTask.objects.create(
            name="replan", task="controlplane.replan_all", interval=every_r, expire_seconds=seconds
        )
    try:
        s.start_redis()
        s.start(
            "daphne",
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(web_port), "pearl_site.asgi:application"],
        )
        s.start(
            "celery",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "pearl_site",
                "worker",
                "-B",
                "--pool=solo",
                "-l",
                "info",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"fault-{os.getpid()}@%h",
                "-s",
                str(tmp_path / "beat-schedule"),
            ],
        )
        wait_port(web_port, proc=s.procs["daphne"])
        wait_for(lambda: "ready." in s.log("celery") or s.procs["celery"].poll() is not None, 60, "celery")
        assert s.procs["celery"].poll() is None, s.log("celery")
        yield s
    finally:
        s.stop()
        # a worker or driver whose agent died is told so (SIGHUP) and exits on its own, which on a loaded machine
        # can take a few seconds: what is still there after that grace outlived the stack
        leftover = processes_under(tmp_path)  # the agents' workers and drivers, the Celery worker's beat
        deadline = time.monotonic() + 10.0
        while leftover and time.monotonic() < deadline:
            time.sleep(0.2)
            leftover = processes_under(tmp_path)
        outlived = [_cmdline(pid) for pid in leftover]
        for pid in leftover:
            os.kill(pid, signal.SIGKILL)
        channel_layers.backends.clear()
        assert not leftover, f"processes outlived the stack: {outlived}"
