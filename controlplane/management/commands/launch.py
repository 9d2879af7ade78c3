"""The one-command local launcher: migrate, Redis (unless REDIS_URL answers), Daphne, a Celery
worker, Celery beat and a few demo node agents on logical slots, each supervised (a child that dies
is restarted; the stack stays up). Production mode by default: DEBUG off, SECRET_KEY from the
environment or generated once into the var directory; `--debug` for development. Prints the
dashboard URL, the API docs URL and a token; Ctrl-C (or SIGTERM) stops every child and its workers."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.management.supervisor import AlreadyRunning, Child, Supervisor, hold_lock, port_free, port_holder

DEMO_NODES = [
    # name, pool, slots, hardware: logical slots; H800 slots host the emulated Qwen3-8B job, cpu slots the tiny
    # torch model that really trains here. The H800 part is the paper's Qwen3-8B cluster (PEARL §7: 16 training,
    # 4 reserved, <= 12 preemptible GPUs) at half scale: 8 training, 2 reserved, <= 6 preemptible as three 2-GPU
    # nodes (one TP2 worker each, so the replay holds Bamboo's levels exactly). Rollout-dominated as the paper's
    # premise (§2: rollout 4.5-5.7x training): the simulator puts its rollout at 3.2x the training step on
    # dedicated GPUs alone, so the training GPUs idle between updates and are borrowed (README, "What you see").
    ("rollout-0", "reserved", 2, "H800"),
    ("spot-0", "elastic", 2, "H800"),
    ("spot-1", "elastic", 2, "H800"),
    ("spot-2", "elastic", 2, "H800"),
    ("train-0", "training", 8, "H800"),
    ("cpu-roll", "reserved", 2, "cpu"),
    ("cpu-train", "training", 1, "cpu"),
]
DEMO_TRACE = "controlplane/sim/traces/bamboo-seg1.csv"  # replayed on the elastic nodes (spot-0 … spot-2)
POOLS = ("reserved", "elastic", "training")
DEMO_OPERATOR = "demo"  # the operator the launcher creates; its demo jobs are submitted in this user's name


def read_nodes(path: str) -> list[tuple[str, str, int, str]]:
    """A cluster of logical nodes from a YAML or JSON file: a list of {name, pool, slots, hardware}."""
    import yaml

    try:
        items = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CommandError(f"--nodes {path}: {exc}") from None
    if not isinstance(items, list) or not items:
        raise CommandError(f"--nodes {path}: expected a list of {{name, pool, slots, hardware}}")
    from controlplane.core.profiles import get_hardware

    nodes, seen = [], set()
    for i, n in enumerate(items):
        if not isinstance(n, dict) or set(n) - {"name", "pool", "slots", "hardware"}:
            raise CommandError(f"--nodes {path}: item {i} must have exactly name, pool, slots, hardware")
        name, pool, slots, hardware = n.get("name"), n.get("pool"), n.get("slots"), n.get("hardware", "H800")
        if not isinstance(name, str) or not name or name in seen:
            raise CommandError(f"--nodes {path}: item {i}: name must be a unique non-empty string")
        if pool not in POOLS:
            raise CommandError(f"--nodes {path}: {name}: pool must be one of {', '.join(POOLS)}")
        if not isinstance(slots, int) or not 1 <= slots <= 64:
            raise CommandError(f"--nodes {path}: {name}: slots must be an integer in 1..64")
        try:  # a mixed cluster names each node's chip; the emulated engines are timed by that chip's profile
            hardware = get_hardware(str(hardware)).name
        except ValueError as exc:
            raise CommandError(f"--nodes {path}: {name}: {exc}") from None
        seen.add(name)
        nodes.append((name, pool, slots, hardware))
    return nodes


@contextlib.contextmanager
def _no_dashboard_pushes() -> Iterator[None]:
    """Use an in-process channel layer for writes made before any dashboard or Redis can exist."""
    from channels.layers import channel_layers

    saved = settings.CHANNEL_LAYERS
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    try:
        yield
    finally:
        settings.CHANNEL_LAYERS = saved
        channel_layers.backends.clear()


def _redis_ok(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except Exception:
        return False


def shared_demo_jobs(cluster: list[tuple[str, str, int, str]], count: int, tag: int) -> list[dict[str, Any]]:
    """`--demo-jobs N` (issue 35): N equal emulated Qwen3-8B SWE-like jobs on the GPU nodes, each free to use the
    whole rollout pool (reserved + preemptible: the arbiter divides it among them, by equal weights) and an even
    split of the training GPUs (TP2 groups). A cluster whose training GPUs cannot give each job a group is a
    clear error."""
    tp = 2
    training = {hw: 0 for _, p, _, hw in cluster if p == "training" and hw != "cpu"}
    for _, pool, slots, hw in cluster:
        if pool == "training" and hw != "cpu":
            training[hw] += slots
    roll_hw = sorted({hw for _, p, _, hw in cluster if p != "training" and hw != "cpu"})
    rollout = sum(s for _, p, s, hw in cluster if p != "training" and hw != "cpu")
    if count < 1 or len(training) != 1 or rollout < tp:
        raise CommandError("--demo-jobs needs N >= 1, GPU training nodes of one chip type and rollout GPU nodes")
    ((train_hw, train_gpus),) = training.items()
    each = train_gpus // count // tp * tp
    if each < tp:
        raise CommandError(
            f"--demo-jobs {count}: {train_gpus} {train_hw} training GPUs cannot give each job a {tp}-GPU group"
        )
    return [
        {
            "name": f"share{i}-{tag}",
            "model": "qwen3-8b",
            "hardware": train_hw,
            **({"hardware_types": roll_hw} if roll_hw != [train_hw] else {}),
            "engine": "emulated",
            "environment": "swe-like",
            "tp": tp,
            "batch_size": 32,
            "group_size": 16,
            "rollout_gpus": rollout - rollout % tp,
            "training_gpus": each,
            "max_staleness": 1,
            "max_trajectory_tokens": 32768,
        }
        for i in range(count)
    ]


class Command(BaseCommand):
    help = "Start the whole PEARL stack locally (Redis, Daphne, Celery worker + beat, demo agents, a demo job)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PEARL_PORT", "8000")))
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--no-agents", action="store_true", help="start no demo agents")
        parser.add_argument("--no-demo-job", action="store_true", help="do not create the demo jobs")
        parser.add_argument(
            "--demo-jobs",
            type=int,
            default=0,
            metavar="N",
            help="instead of the demo jobs, N emulated SWE-like jobs that share the GPU nodes' rollout pool (the "
            "cluster arbiter divides it; the training GPUs split evenly among them)",
        )
        parser.add_argument(
            "--nodes",
            default="",
            help="YAML/JSON list of {name, pool, slots, hardware}: the logical "
            "nodes to start agents for, instead of the demo's",
        )
        parser.add_argument(
            "--trace", default=DEMO_TRACE, help="availability trace replayed on the elastic nodes ('' for none)"
        )
        parser.add_argument(
            "--trace-speedup",
            type=float,
            default=None,
            help="trace seconds per wall second (default: 1 / --time-factor, the emulated job's clock)",
        )
        parser.add_argument("--time-factor", type=float, default=0.05, help="emulated engine time scale")
        parser.add_argument(
            "--interference",
            type=float,
            default=1.0,
            help="emulated engines: prefill next to running decodes costs this x its roofline time",
        )
        parser.add_argument("--ready-timeout", type=float, default=120.0)
        parser.add_argument("--debug", action="store_true", help="development mode (DEBUG on); off by default")
        parser.add_argument(
            "--ray-address",
            default="",
            metavar="HOST:PORT",
            help="also run the Ray bridge against this Ray cluster: an agent on every Ray node "
            "(use with --no-agents to start no local demo agents)",
        )
        parser.add_argument(
            "--ray-control-plane",
            default="",
            metavar="URL",
            help="the URL the Ray nodes' agents dial (default http://HOST:PORT of this launcher)",
        )

    def step(self, text: str) -> None:
        self.stdout.write(self.style.HTTP_INFO(f"==> {text}"))
        self.stdout.flush()

    def handle(self, *args: Any, **opts: Any) -> None:
        started = time.monotonic()
        opts["cluster"] = read_nodes(opts["nodes"]) if opts["nodes"] else DEMO_NODES
        var = Path(settings.VAR_DIR)
        root = Path(settings.BASE_DIR)
        py = sys.executable
        try:
            lock = hold_lock(var)  # held until this process ends, however it ends
        except AlreadyRunning as exc:
            raise CommandError(
                f"PEARL is already running from {var}: launcher pid {exc.pid} holds {exc.path}; "
                f"stop it first (kill {exc.pid}) or use another PEARL_VAR_DIR"
            ) from None
        self._check_port(opts["host"], opts["port"], "the web server (--port or PEARL_PORT)")

        children: list[tuple[str, str]] = []  # (name, command line)
        env: dict[str, str] = {}
        redis_url = settings.REDIS_URL
        if os.environ.get("REDIS_URL") and _redis_ok(redis_url):
            self.step(f"using Redis at {redis_url}")
        elif _redis_ok(redis_url):
            self.step(f"reusing the Redis already answering at {redis_url}")
        else:
            if not shutil.which("redis-server"):
                raise CommandError(
                    "redis-server is not installed and REDIS_URL does not answer; run scripts/setup.sh or set REDIS_URL"
                )
            port = redis_url.rsplit(":", 1)[-1].split("/")[0]
            if port.isdigit():
                self._check_port("127.0.0.1", int(port), "Redis (REDIS_URL)")
            self.step(f"starting Redis on port {port} (no persistence)")
            children.append(
                ("redis", f"redis-server --port {port} --bind 127.0.0.1 --save '' --appendonly no --loglevel warning")
            )
        env["REDIS_URL"] = redis_url
        self.step("migrating the database")
        call_command("migrate", verbosity=0)
        with open(os.devnull, "w") as devnull:
            call_command("setup_periodic_tasks", verbosity=0, stdout=devnull)

        self.step("creating the demo operator and tokens")
        with _no_dashboard_pushes():  # nothing listens yet, and the launcher's Redis may not be up
            password, token = self._demo_user(var)
        children.append(("web", f"{py} -m daphne -b {opts['host']} -p {opts['port']} pearl_site.asgi:application"))
        children.append(
            (
                "worker",
                f"{py} -m celery -A pearl_site worker --pool=threads --concurrency=4 -l warning "
                "--without-gossip --without-mingle -n pearl-worker@%h",
            )
        )
        children.append(
            ("beat", f"{py} -m celery -A pearl_site beat -l warning --schedule {var / 'celerybeat-schedule'}")
        )
        if not opts["no_agents"]:
            from controlplane.services.credentials import issue_agent_token

            control = f"http://127.0.0.1:{opts['port']}"
            # the job's rollout driver reaches every worker with one data-plane secret (GET /workers on each
            # agent); weights need no shared secret: the control plane hands out scoped, per-job tokens
            env["PEARL_DATAPLANE_SECRET"] = secrets.token_urlsafe(24)
            for name, pool, slots, hardware in opts["cluster"]:
                with _no_dashboard_pushes():
                    env["TOKEN_" + name.upper().replace("-", "_")] = issue_agent_token(node_name=name, actor="launcher")
                engine = "torch" if hardware == "cpu" else "emulated"
                interference = (
                    f" --interference {opts['interference']}"
                    if engine == "emulated" and opts["interference"] != 1.0
                    else ""
                )
                children.append(
                    (
                        f"agent-{name}",
                        f"{py} -m agents.node --control-plane {control} --node {name} --slots {slots} --pool {pool} "
                        f"--hardware {hardware} --engine {engine} --time-factor {opts['time_factor']}{interference} "
                        f"--state-dir {var / 'agents' / name}",
                    )
                )
            if opts["trace"]:
                children.append(
                    (
                        "trace",
                        f"{py} manage.py replay_availability --trace {shlex.quote(opts['trace'])} "
                        f"--speedup {opts['trace_speedup'] or 1.0 / opts['time_factor']}",
                    )
                )
        if opts["ray_address"]:
            from controlplane.services.bridges import issue_bridge_token

            with _no_dashboard_pushes():
                env["PEARL_BRIDGE_TOKEN"] = issue_bridge_token(name="launcher-ray", actor="launcher")
            env.setdefault("PEARL_DATAPLANE_SECRET", secrets.token_urlsafe(24))
            agent_url = opts["ray_control_plane"] or f"http://{opts['host']}:{opts['port']}"
            children.append(
                (
                    "ray-bridge",
                    f"{py} manage.py ray_bridge --address {shlex.quote(opts['ray_address'])} "
                    f"--control-plane {shlex.quote(agent_url)} --time-factor {opts['time_factor']}",
                )
            )
        envfile = var / "demo.env"
        envfile.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        os.chmod(envfile, 0o600)

        # prometheus_client's multiprocess mode: /metrics on Daphne sums the Celery worker's histograms too.
        # The directory must start empty: its files outlive the processes that wrote them.
        metrics_dir = var / "prometheus"
        shutil.rmtree(metrics_dir, ignore_errors=True)
        metrics_dir.mkdir(parents=True)
        base_env = dict(
            os.environ,
            DEBUG="1" if opts["debug"] else "0",
            PYTHONUNBUFFERED="1",
            PYTHONPATH=str(root),
            PEARL_VAR_DIR=str(var),
            REDIS_URL=redis_url,
            PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        )
        supervised = []
        for name, line in children:
            child_env = {k: v for k, v in base_env.items() if not k.startswith("TOKEN_")}
            if name == "ray-bridge":  # the bridge's own credential, and the secret its agents serve with
                child_env |= {
                    "PEARL_BRIDGE_TOKEN": env["PEARL_BRIDGE_TOKEN"],
                    "PEARL_DATAPLANE_SECRET": env["PEARL_DATAPLANE_SECRET"],
                }
            if name.startswith("agent-"):  # each agent gets its own token only
                key = "TOKEN_" + name[len("agent-") :].upper().replace("-", "_")
                child_env |= {"PEARL_AGENT_TOKEN": env[key], "PEARL_DATAPLANE_SECRET": env["PEARL_DATAPLANE_SECRET"]}
            tier = 2 if name.startswith("agent-") or name in ("trace", "ray-bridge") else 0 if name == "redis" else 1
            supervised.append(Child(name=name, argv=shlex.split(line), env=child_env, tier=tier))
        self.step(
            f"starting {len(supervised)} supervised processes ({'debug' if opts['debug'] else 'production'} mode)"
        )
        sup = Supervisor(supervised, cwd=str(root), out=sys.stdout)

        def stop(*_: Any) -> None:
            sup.stopping.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        sup.start_all()
        watcher = threading.Thread(target=sup.run, daemon=True)
        watcher.start()
        try:
            self._wait_ready(opts, sup, started)
            if not opts["no_demo_job"] and not opts["no_agents"]:
                self._demo_job(opts)
            url = f"http://{opts['host']}:{opts['port']}"
            self.stdout.write(
                self.style.SUCCESS(
                    f"\nPEARL is up in {time.monotonic() - started:.1f} s\n"
                    f"  dashboard   {url}/            (user: {DEMO_OPERATOR}, password: {password})\n"
                    f"  API docs    {url}/api/docs/\n"
                    f"  API token   {token}          (curl -H 'Authorization: Token {token}' {url}/api/cluster/)\n"
                    f"  health      {url}/healthz    metrics: {url}/metrics\n"
                    f"  credentials {var / 'demo-credentials.json'}\n"
                    "A process that dies is restarted. Press Ctrl-C to stop everything.\n"
                )
            )
            self.stdout.flush()
            while not sup.stopping.wait(0.5):
                pass
        finally:
            self.step("stopping every process")
            sup.stop()
            watcher.join(timeout=5)
            lock.close()

    def _check_port(self, host: str, port: int, what: str) -> None:
        """Refuse to start when a port we need is taken, saying which and by whom (a launcher that
        started anyway would restart-loop its server, or wait on a health check someone else answers)."""
        if not port_free(host, port):
            holder = port_holder(port)
            raise CommandError(
                f"port {port} on {host}, needed by {what}, is already in use"
                f"{' by ' + holder if holder else ''}; stop that process or choose another port"
            )

    def _demo_user(self, var: Path) -> tuple[str, str]:
        from django.contrib.auth.models import Group, User
        from rest_framework.authtoken.models import Token

        from controlplane.selectors.users import OPERATORS_GROUP

        creds = var / "demo-credentials.json"
        user, created = User.objects.get_or_create(
            username=DEMO_OPERATOR, defaults={"is_staff": True, "is_superuser": True}
        )
        saved = json.loads(creds.read_text()) if creds.exists() else {}
        password: str = saved["password"] if not created and saved.get("password") else secrets.token_urlsafe(9)
        user.set_password(password)
        user.save()
        user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
        token = Token.objects.get_or_create(user=user)[0].key
        creds.write_text(json.dumps({"username": DEMO_OPERATOR, "password": password, "token": token}))
        os.chmod(creds, 0o600)
        return password, token

    def _wait_ready(self, opts: dict[str, Any], sup: Supervisor, started: float) -> None:
        url = f"http://127.0.0.1:{opts['port']}/healthz"
        deadline = time.monotonic() + opts["ready_timeout"]
        last = ""
        want_nodes = 0 if opts["no_agents"] else len(opts["cluster"])
        from controlplane.models import Node

        while time.monotonic() < deadline:
            if sup.stopping.is_set():
                raise CommandError("stopped during start-up")
            status = "web starting"
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    body = json.loads(r.read())
            except urllib.error.HTTPError as e:
                try:
                    body = json.loads(e.read() or b"{}")
                except ValueError:
                    body = None
            except Exception:  # not up yet, or an answer that is not PEARL's health check
                body = None
            if not isinstance(body, dict):
                body = None
            if body:
                failing = [k for k, v in body.get("checks", {}).items() if v != "ok"]
                status = "waiting for " + ", ".join(failing) if failing else "healthy"
            nodes = Node.objects.filter(status="ready").count()
            if status == "healthy":
                status += f", {nodes}/{want_nodes} agents registered"
            if status != last:
                self.stdout.write(f"    [{time.monotonic() - started:5.1f}s] {status}")
                self.stdout.flush()
                last = status
            if body and body.get("status") == "ok" and nodes >= want_nodes:
                return
            time.sleep(0.5)
        raise CommandError("the stack did not become ready in time")

    def _demo_job(self, opts: dict[str, Any]) -> None:
        """Two jobs: the tiny torch model learning the calculator task on the cpu nodes, and an emulated
        Qwen3-8B SWE-like job on the cluster's GPU nodes (training on the training nodes' chip, rolling out on
        every chip type of the reserved and elastic nodes: a mixed `--nodes` cluster gives a mixed pool).

        The SWE job's shape is the paper's (PEARL §7: GRPO group 16, TP2, max staleness 1, 32K trajectories,
        rollout batch 64 on 16 training + 4 reserved + <= 12 preemptible GPUs), its batch scaled with the
        cluster: B = 32 on the demo's half-scale cluster. Each step's rollout then takes about 3x its update
        (on the dedicated GPUs alone), so the trainer idles and its GPUs are borrowed between updates."""
        from django.contrib.auth.models import User

        from controlplane.models import Job
        from controlplane.services.jobs import create_job

        if Job.objects.filter(status__in=["pending", "running", "paused"]).exists():  # a paused one holds its GPUs
            return
        operator = User.objects.filter(username=DEMO_OPERATOR).first()  # "created by" names it, as for `pearl submit`
        n = int(time.time()) % 100000
        cluster = opts["cluster"]
        if opts.get("demo_jobs"):
            for spec in shared_demo_jobs(cluster, int(opts["demo_jobs"]), n):
                create_job(spec=spec, actor="launcher", user=operator)
                self.step(
                    f"demo job {spec['name']} submitted ({spec['model']}, emulated, {spec['training_gpus']} training "
                    f"GPUs, up to {spec['rollout_gpus']} rollout GPUs shared by the arbiter)"
                )
            return
        slots = {pool: sum(s for _, p, s, hw in cluster if p == pool and hw != "cpu") for pool in POOLS}
        cpu = {pool: sum(s for _, p, s, hw in cluster if p == pool and hw == "cpu") for pool in POOLS}
        train_hw = sorted({hw for _, p, _, hw in cluster if p == "training" and hw != "cpu"})
        roll_hw = sorted({hw for _, p, _, hw in cluster if p != "training" and hw != "cpu"})
        jobs: list[dict[str, Any]] = []
        if cpu["training"] and cpu["reserved"] + cpu["elastic"]:
            jobs.append(
                {
                    "name": f"calc-{n}",
                    "model": "tiny",
                    "hardware": "cpu",
                    "engine": "torch",
                    "environment": "calculator",
                    "tp": 1,
                    "batch_size": 16,
                    "group_size": 8,
                    "rollout_gpus": min(2, cpu["reserved"] + cpu["elastic"]),
                    "training_gpus": 1,
                    "max_staleness": 1,
                }
            )
        rollout, training = slots["reserved"] + slots["elastic"], slots["training"]
        if len(train_hw) == 1 and rollout >= 2 and training >= 2:
            groups = max(1, round(4 * (training + rollout) / 32))  # the paper's 4 groups of 16 on 32 GPUs
            jobs.append(
                {
                    "name": f"swe-{n}",
                    "model": "qwen3-8b",
                    "hardware": train_hw[0],
                    **({"hardware_types": roll_hw} if roll_hw != train_hw else {}),
                    "engine": "emulated",
                    "environment": "swe-like",
                    "tp": 2,
                    "batch_size": 16 * groups,
                    "group_size": 16,
                    "rollout_gpus": rollout - rollout % 2,
                    "training_gpus": training - training % 2,
                    "max_staleness": 1,
                    "max_trajectory_tokens": 32768,
                }
            )
        for spec in jobs:
            create_job(spec=spec, actor="launcher", user=operator)
            where = spec["hardware"] + (
                f", rollout on {'+'.join(spec['hardware_types'])}" if "hardware_types" in spec else ""
            )
            self.step(
                f"demo job {spec['name']} submitted ({spec['model']} on {where}, {spec['engine']} engine, "
                f"{spec['environment']}, B={spec['batch_size']}, {spec['rollout_gpus']}+{spec['training_gpus']} GPUs, "
                "policy pearl)"
            )
