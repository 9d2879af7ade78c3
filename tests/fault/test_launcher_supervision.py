"""The launcher's own supervision (issue 21, item 6), with real processes: children die with a
launcher killed by SIGKILL (restarted ones too), a second launcher on the same var directory is
refused with the live one's pid, and a port that is taken is named before anything starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.fault.conftest import processes_under, wait_for
from tests.support.environment import ROOT
from tests.support.processes import free_port


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def children_of(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
        except OSError:
            continue
    return out


def launcher_env(var: Path, port: int, redis_port: int) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "DEBUG", "PEARL_TESTING", "SECRET_KEY", "DJANGO_ALLOW_ASYNC_UNSAFE")
    }
    return env | {
        "PEARL_VAR_DIR": str(var),
        "PEARL_PORT": str(port),
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}",
        "PYTHONPATH": str(ROOT),
    }


SUPERVISED = textwrap.dedent("""
    import sys, threading, time
    from controlplane.management.supervisor import Child, Supervisor
    kids = [Child(name=f"c{i}", argv=["sleep", "300"], env={"PATH": "/usr/bin:/bin"}) for i in range(2)]
    sup = Supervisor(kids, cwd=sys.argv[1], out=open(sys.argv[2], "a"))
    sup.start_all()
    threading.Thread(target=sup.run, args=(0.1,), daemon=True).start()
    while True:
        print(" ".join(str(k.proc.pid) for k in kids if k.proc), flush=True)
        time.sleep(0.2)
""")


def test_children_die_with_a_supervisor_killed_by_sigkill_restarted_ones_too(tmp_path):
    sup = subprocess.Popen(
        [sys.executable, "-c", SUPERVISED, str(ROOT), str(tmp_path / "sup.log")],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    seen: set[int] = set()
    try:
        first = [int(p) for p in sup.stdout.readline().split()]
        assert len(first) == 2 and all(alive(p) for p in first)
        seen |= set(first)
        os.kill(first[0], signal.SIGKILL)  # restarted by the watcher thread, not the main one
        while True:
            pids = [int(p) for p in sup.stdout.readline().split()]
            if len(pids) == 2 and pids[0] != first[0]:
                break
        seen |= set(pids)
        assert all(alive(p) for p in pids)
        os.kill(sup.pid, signal.SIGKILL)
        sup.wait(timeout=10)
        wait_for(lambda: not any(alive(p) for p in pids), 10, "the supervised children to die with their supervisor")
    finally:
        for pid in seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if sup.poll() is None:
            os.kill(sup.pid, signal.SIGKILL)
            sup.wait()


def test_a_child_whose_launcher_is_already_gone_does_not_start(tmp_path):
    """The race between fork and prctl: the wrapper checks its parent is still the one it was given."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "controlplane.management.supervisor",
            "--parent",
            "1",
            "--",
            "touch",
            str(tmp_path / "ran"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0 and "gone" in r.stderr
    assert not (tmp_path / "ran").exists()


def run_launch(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "launch", "--no-demo-job", "--trace", "", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.parametrize("which", ["web", "redis"])
def test_a_taken_port_is_named_before_anything_starts(tmp_path, which):
    port, redis_port = free_port(), free_port()
    taken = port if which == "web" else redis_port
    with socket.socket() as s:
        s.bind(("127.0.0.1", taken))
        s.listen()  # accepts and never answers: neither a PEARL health check nor a Redis
        r = run_launch(launcher_env(tmp_path / "var", port, redis_port), "--no-agents")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"port {taken} on 127.0.0.1" in out and f"pid {os.getpid()}" in out, out
    assert ("web server" if which == "web" else "Redis") in out
    assert "Traceback" not in out and "JSONDecodeError" not in out, out
    assert not processes_under(tmp_path / "var")


@pytest.mark.slow
def test_a_launcher_killed_by_sigkill_takes_its_stack_with_it_and_a_second_start_is_refused(tmp_path):
    var, port, redis_port = tmp_path / "var", free_port(), free_port()
    env = launcher_env(var, port, redis_port)
    with open(tmp_path / "launch.log", "wb") as log:
        launcher = subprocess.Popen(
            [sys.executable, "manage.py", "launch", "--no-demo-job", "--no-agents", "--trace", ""],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    children: list[int] = []
    try:
        wait_for(
            lambda: b"PEARL is up" in (tmp_path / "launch.log").read_bytes() or launcher.poll() is not None,
            240,
            "the stack to come up",
        )
        assert launcher.poll() is None, (tmp_path / "launch.log").read_text()[-3000:]
        children = children_of(launcher.pid)
        assert len(children) >= 4, children  # redis, web, worker, beat

        second = run_launch(env, "--no-agents", "--port", str(free_port()))
        out = second.stdout + second.stderr
        assert second.returncode != 0 and f"pid {launcher.pid}" in out and "already running" in out, out
        assert "Traceback" not in out
        assert json.loads((var / "demo-credentials.json").read_text())["token"]  # the first one's files are intact

        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=10)
        wait_for(lambda: not any(alive(p) for p in children), 60, "the launcher's children to die with it")
        with socket.socket() as s:  # nothing holds the web port any more
            assert s.connect_ex(("127.0.0.1", port)) != 0
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        left = [p for p in children if alive(p)]
        for pid in left:
            os.killpg(pid, signal.SIGKILL)
    assert not left, f"outlived the launcher: {left}"
