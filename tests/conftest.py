"""Shared fixtures: users and API clients, a live control plane (Daphne + optional Celery worker as
real subprocesses against the test database and the test Redis), and helpers."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTABLE = ("WARNING", "ERROR", "CRITICAL", "Traceback", "Error:", "deadlock")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    """A failed test that ran servers (Daphne, Celery, agents) shows what they logged of note: on CI the
    report is all there is, and the subprocesses' logs die with the runner's temporary directory."""
    outcome = yield
    report = outcome.get_result()
    tmp = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    if not report.failed or tmp is None:
        return
    for log in sorted(Path(tmp).rglob("*.log"))[:8]:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if any(k in ln for k in NOTABLE)]
        if lines:
            report.sections.append((f"notable lines of {log.relative_to(tmp)}", "\n".join(ln[:300] for ln in lines[-20:])))


def redis_url() -> str:
    from django.conf import settings

    return settings.REDIS_URL


def redis_available() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(redis_url(), socket_connect_timeout=0.5).ping())
    except Exception:
        return False


def postgres_in_use() -> bool:
    from django.db import connection

    return connection.vendor == "postgresql"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before port {port} opened")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"port {port} did not open within {timeout}s")


def database_url_for_children() -> str:
    """The URL of the database the test process is using right now (the test database)."""
    from django.db import connection

    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    user = s.get("USER") or ""
    pw = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    auth = f"{user}{pw}@" if user else ""
    return f"postgres://{auth}{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DATABASE_URL=database_url_for_children(), REDIS_URL=redis_url(), PEARL_TESTING="1", DEBUG="0",
        PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def make_node(name: str, *, pool: str = "reserved", slots: int = 4, hardware: str = "cpu", incarnation: str = "i1"):
    """Register a node the way its agent would (through the service, with its own token)."""
    from controlplane.core.agent_link import Register, SlotSpec
    from controlplane.models import AgentCredential
    from controlplane.services.credentials import issue_agent_token
    from controlplane.services.nodes import register_node

    issue_agent_token(node_name=name)
    cred = AgentCredential.objects.filter(node_name=name).latest("created")
    msg = Register(node=name, pool=pool, hardware=hardware, incarnation=incarnation,
                   slots=[SlotSpec(index=i, hardware=hardware, memory_mb=1024) for i in range(slots)])
    return register_node(credential_id=cred.pk, message=msg)


def agents_converge() -> None:
    """Every live node's agent reports its desired state as done, through the heartbeat service: each
    worker running in its role and activity, holding the weights the job allows, idle, on an endpoint
    of the node. What a real agent does after reconciling (agents/node.py), without processes."""
    from controlplane.core.agent_link import Heartbeat, ObservedWorker
    from controlplane.core.state import Activity, NodeStatus, Role
    from controlplane.models import Job, Node
    from controlplane.selectors.cluster import desired_state
    from controlplane.services.nodes import record_heartbeat

    for node in Node.objects.filter(status__in=[NodeStatus.READY, NodeStatus.DRAINING]):
        ds = desired_state(node)
        versions = dict(Job.objects.values_list("name", "weight_version"))
        workers = [ObservedWorker(worker_id=w.worker_id, role=w.role, state="running", inflight=0,
                                  activity=Activity.INACTIVE if w.role == Role.TRAINING and w.activity != Activity.ACTIVE
                                  else w.activity,
                                  weight_version=versions.get(w.job, 0), endpoint=f"http://127.0.0.1:{20000 + w.worker_id}",
                                  generation=ds.generation, devices=list(w.gpus))
                   for w in ds.workers]
        record_heartbeat(node_id=node.pk, message=Heartbeat(epoch=node.epoch, generation=ds.generation, workers=workers),
                         channel=node.agent_channel)


def run_transition(transition, rounds: int = 20):
    """Execute a transition to its end, the agents converging between executor passes."""
    from controlplane.services import executor

    for _ in range(rounds):
        tr = executor.execute_transition(transition_id=transition.pk)
        if tr.status != "running":
            return tr
        agents_converge()
    raise AssertionError(f"transition {transition.pk} still running after {rounds} rounds")


def make_job(name: str = "job1", **spec):
    from controlplane.services.jobs import create_job

    full = {"name": name, "rollout_gpus": 1, "training_gpus": 0} | spec
    return create_job(spec=full, actor="test")


@pytest.fixture(autouse=True)
def _fresh_throttle_counters(request):  # type: ignore[no-untyped-def]
    """API rate-limit counters live in the (per-process) cache, queued re-plan signals in Redis (keyed by
    job id, which tests reuse): no test inherits another's. (`make test-vllm` runs without Django.)"""
    if not request.config.pluginmanager.hasplugin("django"):
        yield
        return
    from django.core.cache import cache

    cache.clear()
    if redis_available():
        import redis

        r = redis.Redis.from_url(redis_url())
        for key in r.scan_iter("pearl:plan:*"):
            r.delete(key)
    yield


@pytest.fixture
def operator(django_user_model):
    from django.contrib.auth.models import Group

    user = django_user_model.objects.create_user(username="op", password="op-password-123")
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    return user


@pytest.fixture
def viewer(django_user_model):
    return django_user_model.objects.create_user(username="viewer", password="viewer-password-123")


@pytest.fixture
def api(operator):
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=operator).key}")
    return client


@dataclass
class ControlPlane:
    base_url: str
    ws_url: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def agent_token(self, node_name: str, pool: str = "reserved") -> str:
        """A per-node agent token (the pool is what the agent then registers with)."""
        from controlplane.services.credentials import issue_agent_token

        return issue_agent_token(node_name=node_name)

    def user_token(self, username: str = "ops", operator: bool = True) -> str:
        from django.contrib.auth.models import Group, User
        from rest_framework.authtoken.models import Token

        user, _ = User.objects.get_or_create(username=username, defaults={"is_staff": operator})
        if operator:
            user.groups.add(Group.objects.get_or_create(name="operators")[0])
        return Token.objects.get_or_create(user=user)[0].key


def _start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture
def control_plane_server(transactional_db, tmp_path) -> Iterator[ControlPlane]:
    """A real Daphne serving this test's database, on a free port (websockets included)."""
    if not redis_available():
        pytest.skip("Redis is not reachable")
    port = free_port()
    proc = _start([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "pearl_site.asgi:application"],
                  child_env(), tmp_path / "daphne.log")
    try:
        wait_port(port, proc=proc)
    except Exception:
        _stop([proc])
        raise RuntimeError((tmp_path / "daphne.log").read_text()[-3000:])
    cp = ControlPlane(base_url=f"http://127.0.0.1:{port}", ws_url=f"ws://127.0.0.1:{port}", procs=[proc])
    yield cp
    _stop(cp.procs)


@pytest.fixture
def celery_worker_process(transactional_db, tmp_path) -> Iterator[subprocess.Popen]:
    """A real Celery worker subprocess on the test Redis broker and the test database."""
    if not redis_available():
        pytest.skip("Redis is not reachable")
    log = tmp_path / "celery.log"
    proc = _start([sys.executable, "-m", "celery", "-A", "pearl_site", "worker", "--pool=solo", "-l", "info",
                   "--without-gossip", "--without-mingle", "-n", f"test-{os.getpid()}@%h"], child_env(), log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "ready." not in log.read_text(errors="ignore"):
        if proc.poll() is not None:
            raise RuntimeError(log.read_text()[-3000:])
        time.sleep(0.2)
    yield proc
    _stop([proc])


def journaled_tokens(state_dir: Path) -> bool:
    """The worker's in-flight journal holds requests, each with some generated tokens."""
    try:
        entries = json.loads((state_dir / "inflight.json").read_text())["inflight"]
    except (OSError, ValueError, KeyError):
        return False
    return bool(entries) and all(e.get("tokens") for e in entries)
