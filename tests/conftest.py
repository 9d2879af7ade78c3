"""Shared fixtures: users and API clients, a live control plane (Daphne + optional Celery worker as
real subprocesses against the test database and the test Redis). The helpers tests call are in
`tests/support/`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.environment import child_env, redis_available, redis_url
from tests.support.processes import free_port, start_process, stop_processes, wait_port

NOTABLE = ("WARNING", "ERROR", "CRITICAL", "Traceback", "Error:", "deadlock")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
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
            report.sections.append(
                (f"notable lines of {log.relative_to(tmp)}", "\n".join(ln[:300] for ln in lines[-20:]))
            )


@pytest.fixture(autouse=True)
def _fresh_throttle_counters(request):
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


@pytest.fixture
def control_plane_server(transactional_db, tmp_path) -> Iterator[ControlPlane]:
    """A real Daphne serving this test's database, on a free port (websockets included)."""
    if not redis_available():
        pytest.skip("Redis is not reachable")
    port = free_port()
    proc = start_process(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "pearl_site.asgi:application"],
        child_env(),
        tmp_path / "daphne.log",
    )
    try:
        wait_port(port, proc=proc)
    except Exception as err:
        stop_processes([proc])
        raise RuntimeError((tmp_path / "daphne.log").read_text()[-3000:]) from err
    cp = ControlPlane(base_url=f"http://127.0.0.1:{port}", ws_url=f"ws://127.0.0.1:{port}", procs=[proc])
    yield cp
    stop_processes(cp.procs)


@pytest.fixture
def celery_worker_process(transactional_db, tmp_path) -> Iterator[subprocess.Popen]:
    """A real Celery worker subprocess on the test Redis broker and the test database."""
    if not redis_available():
        pytest.skip("Redis is not reachable")
    log = tmp_path / "celery.log"
    proc = start_process(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "pearl_site",
            "worker",
            "--pool=solo",
            "-l",
            "info",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"test-{os.getpid()}@%h",
        ],
        child_env(),
        log,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "ready." not in log.read_text(errors="ignore"):
        if proc.poll() is not None:
            raise RuntimeError(log.read_text()[-3000:])
        time.sleep(0.2)
    yield proc
    stop_processes([proc])
