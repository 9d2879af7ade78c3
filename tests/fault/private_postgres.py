"""A private PostgreSQL cluster a fault test may kill (`kill -9` of the postmaster) and start again: the shared
server on 127.0.0.1:5432 and SQLite may not be killed. Debian's server binaries, run as the `postgres` OS user (initdb
refuses root) in a temporary directory it owns, on a free loopback port, trust authentication."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.processes import free_port, wait_port

# Debian's layout, /usr/lib/postgresql/<major>/bin: the newest major present (15 here)
BIN = max(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), default=Path("/nonexistent"))
DATABASE = "pearl"


def unavailable() -> str | None:
    """Why a private cluster cannot be started here (None: it can)."""
    if not all((BIN / b).exists() for b in ("initdb", "postgres")):
        return f"PostgreSQL's server binaries are not in {BIN}"
    if os.geteuid() != 0:
        return "starting a private PostgreSQL cluster as the postgres OS user needs root"
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres OS user"
    return None


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _processes_in(root: Path) -> list[int]:
    """Live processes working in `root`: the server and its children run in its data directory (each child
    makes its own session, and outlives a killed postmaster a moment, so neither the group nor the parent
    finds them)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd.startswith(str(root)) and _alive(int(entry.name)):
            out.append(int(entry.name))
    return out


@dataclass
class PrivatePostgres:
    root: Path
    port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE}"

    def _run(self, *argv: str) -> None:
        subprocess.run(argv, check=True, capture_output=True, user="postgres", group="postgres", cwd=self.root)

    def init(self) -> None:
        self._run(str(BIN / "initdb"), "-D", str(self.root / "data"), "-U", "postgres", "-A", "trust", "-E", "UTF8")

    def start(self) -> None:
        """The postmaster itself (not pg_ctl's child), so that `kill9` kills the server as a crash would."""
        log = open(self.root / "postgres.log", "ab")  # noqa: SIM115 (the server's, closed with it)
        argv = [str(BIN / "postgres"), "-D", str(self.root / "data"), "-p", str(self.port)]
        argv += ["-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.root}"]
        argv += ["-c", "max_connections=200"]
        for _ in range(50):  # a killed postmaster's backends may still hold the shared memory a moment
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, user="postgres", group="postgres", start_new_session=True
            )
            try:
                wait_port(self.port, timeout=30, proc=self.proc)
            except RuntimeError:
                time.sleep(0.2)
                continue
            self._accepting()
            return
        raise RuntimeError(f"PostgreSQL did not start: {self.log()}")

    def _accepting(self, timeout: float = 60.0) -> None:
        """Wait out crash recovery: the port opens before the server takes connections ("starting up")."""
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", connect_timeout=5).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline or (self.proc is not None and self.proc.poll() is not None):
                    raise
                time.sleep(0.1)

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {DATABASE}")

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def log(self) -> str:
        return (self.root / "postgres.log").read_text(errors="replace")[-4000:]

    def stop(self) -> list[int]:
        """Stop the server (fast shutdown), then kill whatever still works in its directory (a killed
        postmaster's children included); returns what was left (the caller's "no process outlives it" check)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        left = _processes_in(self.root)
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        return left


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    root = Path(tempfile.mkdtemp(prefix="pearl-pg-"))
    pw = pwd.getpwnam("postgres")
    os.chown(root, pw.pw_uid, pw.pw_gid)
    pg = PrivatePostgres(root=root, port=free_port())
    try:
        pg.init()
        pg.start()
        pg.create_database()
        yield pg
    finally:
        left = pg.stop()
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"PostgreSQL processes outlived the test: {left}"


@contextmanager
def default_database(url: str) -> Iterator[None]:
    """This process's `default` connection on `url` (migrated), the previous one back after: the test's own
    queries and the stack's servers (`child_env` reads this connection) then use the same database."""
    import dj_database_url
    from django.core.management import call_command
    from django.db import connections
    from django.db.utils import load_backend

    previous = connections["default"]
    previous.close()
    config = connections.configure_settings({"default": dj_database_url.parse(url, conn_health_checks=True)})
    settings_dict = config["default"]
    connections["default"] = load_backend(settings_dict["ENGINE"]).DatabaseWrapper(settings_dict, "default")
    try:
        call_command("migrate", verbosity=0, interactive=False)
        yield
    finally:
        connections["default"].close()
        connections["default"] = previous
