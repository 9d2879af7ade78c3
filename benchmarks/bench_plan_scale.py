"""The planner and executor at 8,192 GPUs (issue 22, item 3): a capacity change on an N-node cluster (8 GPU
slots a node, one worker a slot) -> decision -> plan -> executor -> every agent's confirmation, end to end.

The cluster: N elastic nodes, one job (tp 1, colocated by override) whose workers fill all but `--spare` nodes.
The capacity change: a preemption notice on `--preempt` of the nodes with workers. The plan it causes stops
their workers (forced), starts as many on the spare nodes, syncs their weights and admits them at once.

Two ways to run it:
- full stack (default): the agents are emulated in `--generators` separate processes (`load_agents.py` in its
  reconcile mode: every desired state is reported as done in a heartbeat sent at once, as the real agent
  does after a reconcile), over real websockets to `--daphnes` Daphne processes; a Celery worker runs the
  planner and the executor; Redis; PostgreSQL. Timed from the notice (a service call here, as the REST
  endpoint makes it) to the transition's success (the executor saw every agent's confirmation), with the
  plan's and each phase's times from the database rows, and the desired-state messages each node got.
- `--inproc`: the same services in this one process, the agents' confirmations written through the heartbeat
  service: what the planner and executor cost without the sockets (for py-spy).

Usage: DATABASE_URL=postgres://.../pearl_plan .venv/bin/python benchmarks/bench_plan_scale.py
       [--nodes 128,512,1024] [--preempt 0.0625] [--spare 0.0625] [--daphnes 2] [--generators 2]
       [--heartbeat 10] [--single-notices] [--inproc [--py-spy FILE]] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import harness
from bench_controlplane import PY, ROOT

GPUS = 8


def seed(n: int, spare: int) -> tuple[list[list[Any]], int]:
    """n elastic nodes of GPUS slots (not ready until their agent registers); one colocated job whose active
    workers fill the first n - spare nodes. Returns the agents' [name, token, []] and the job id."""
    from controlplane.models import Job, Override
    from controlplane.services.jobs import create_job

    nodes, tokens = harness.seed_nodes("plan", n, gpus=GPUS, pool="elastic", address="127.0.0.1")
    used = nodes[: n - spare]
    job = create_job(
        spec={"name": "plan-job", "rollout_gpus": len(used) * GPUS, "training_gpus": 0, "hardware": "h800"},
        actor="bench",
    )
    Override.objects.update_or_create(job=job, defaults={"force_mode": "colocated"})
    Job.objects.filter(pk=job.pk).update(status="running", mode="colocated", n_colocated=len(used) * GPUS)
    harness.seed_workers(job, used, GPUS, endpoints=True)
    return [[nd.name, tokens[nd.name], []] for nd in nodes], job.pk


def report_of(ds: Any) -> list[dict[str, Any]]:
    """What an agent that reconciled to this desired state reports (the emulator's rule, in load_agents.py)."""
    return [
        {
            "worker_id": w.worker_id,
            "role": str(w.role),
            "activity": str(w.activity),
            "state": "running",
            "weight_version": w.min_weight_version,
            "endpoint": f"http://127.0.0.1:{20000 + w.worker_id % 40000}",
            "inflight": 0,
            "generation": ds.generation,
            "devices": list(w.gpus),
        }
        for w in ds.workers
    ]


def inproc_converge(node_ids: list[int] | None = None) -> int:
    """Every node behind its desired state (or those given) reports it done through the heartbeat service."""
    from django.db.models import F

    from controlplane.core.agent_link import Heartbeat, ObservedWorker
    from controlplane.models import Node
    from controlplane.selectors.cluster import desired_state
    from controlplane.services.heartbeat import record_heartbeat

    qs = Node.objects.filter(status__in=["ready", "draining"])
    qs = qs.filter(pk__in=node_ids) if node_ids is not None else qs.filter(applied_generation__lt=F("generation"))
    n = 0
    for node in qs:
        ds = desired_state(node)
        msg = Heartbeat(
            epoch=node.epoch, generation=ds.generation, workers=[ObservedWorker(**o) for o in report_of(ds)]
        )
        record_heartbeat(node_id=node.pk, message=msg, channel=node.agent_channel)
        n += 1
    return n


def inproc_register(job_id: int) -> None:
    """Make every node ready as its agent's registration would (bulk: the registrations are not measured)."""
    from django.utils import timezone

    from controlplane.models import Node

    far = timezone.now() + timedelta(hours=1)
    for node in Node.objects.all():
        Node.objects.filter(pk=node.pk).update(status="ready", agent_channel=f"inproc-{node.pk}", lease_expires=far)
    inproc_converge(list(Node.objects.values_list("id", flat=True)))


def phases(tr_id: int, t0: float) -> dict[str, Any]:
    """When the plan was recorded, and when each step kind's last step finished, seconds after t0."""
    from django.db.models import Max

    from controlplane.models import Transition, TransitionStep

    tr = Transition.objects.get(pk=tr_id)
    out: dict[str, Any] = {
        "planned_s": round(tr.created.timestamp() - t0, 3),
        "started_s": round(tr.started.timestamp() - t0, 3) if tr.started else None,
        "finished_s": round(tr.finished.timestamp() - t0, 3) if tr.finished else None,
        "status": tr.status,
        "steps": TransitionStep.objects.filter(transition=tr).count(),
        "plan": {k: tr.plan.get(k) for k in ("target", "d_worker", "d_role")},
    }
    for row in TransitionStep.objects.filter(transition=tr).values("kind").annotate(last=Max("finished")):
        out[f"{row['kind']}_done_s"] = round(row["last"].timestamp() - t0, 3) if row["last"] else None
    return out


def preempt(n_preempt: int, single: bool = False) -> tuple[float, list[int]]:
    """The capacity change: preemption notices on the last n_preempt nodes that hold workers, in one call (as
    the Ray bridge delivers a drain of several nodes), or with `single` one call per node."""
    from django.utils import timezone

    from controlplane.models import Node, Worker
    from controlplane.services import draining

    held = sorted(set(Worker.objects.filter(alive=True).values_list("node_id", flat=True)))
    victims = held[-n_preempt:]
    t0 = time.time()
    deadline = timezone.now() + timedelta(minutes=30)
    if single:
        for nid in victims:
            draining.preemption_notice(node_id=nid, deadline=deadline, actor="bench")
    else:
        draining.preemption_notices(deadlines=dict.fromkeys(victims, deadline), actor="bench")
    assert Node.objects.filter(pk__in=victims, status="draining").count() == len(victims)
    return t0, victims


def run_inproc(n: int, args: argparse.Namespace) -> dict[str, Any]:
    from django.db import connection

    spare = max(1, round(n * args.spare))
    _, job_id = seed(n, spare)
    inproc_register(job_id)
    with connection.cursor() as c:
        c.execute("SELECT pg_backend_pid()")
        backend = int(c.fetchone()[0])
    queries = [0]

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        queries[0] += 1
        return execute(sql, params, many, context)

    spy = _py_spy(args.py_spy, n)
    cpu0, pg0 = harness.cpu_s(os.getpid()), harness.cpu_s(backend)
    try:
        with connection.execute_wrapper(count):
            out = _capacity_change_inproc(n, spare, job_id, args, queries)
    finally:
        if spy is not None:  # py-spy writes its profile on SIGINT
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=120)
    out["cpu_s"] = {
        "bench (services, one thread)": round(harness.cpu_s(os.getpid()) - cpu0, 2),
        "postgres backend": round(harness.cpu_s(backend) - pg0, 2),
    }
    out["queries"] = queries[0]
    connection.close()
    return out


def _py_spy(out: str, n: int) -> subprocess.Popen[bytes] | None:
    """With --py-spy FILE: sample this process (on-CPU stacks, collapsed format, FILE.<n>) during the measured part
    only: the seeding and the registrations are not profiled."""
    if not out:
        return None
    spy = Path(PY).parent / "py-spy"
    cmd = [str(spy), "record", "--pid", str(os.getpid()), "--rate", "250", "--format", "raw", "-o", f"{out}.{n}"]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attaches
    return p


def _capacity_change_inproc(
    n: int, spare: int, job_id: int, args: argparse.Namespace, queries: list[int]
) -> dict[str, Any]:
    """The measured part: notice -> plan -> executor passes, each followed by the agents' confirmations.
    `queries[0]` counts the queries so far (each phase's share is reported)."""
    from controlplane.services import executor, planner

    n_pre = max(1, round(n * args.preempt))
    q0, c0 = queries[0], time.process_time()
    t0, _ = preempt(n_pre, single=args.single_notices)
    t_notice = time.time() - t0
    q_notice, c_notice = queries[0] - q0, time.process_time() - c0
    tr = planner.plan_job(job_id=job_id, signal="capacity_change")
    assert tr is not None, "the capacity change planned nothing"
    t_plan = time.time() - t0
    q_plan, c_plan = queries[0] - q0 - q_notice, time.process_time() - c0 - c_notice
    passes = converge_s = c_agents = 0.0
    q_agents = 0
    outcome = "waiting"
    owner = ""
    while outcome == "waiting":
        t = time.time()
        tr2, outcome = executor.advance(transition_id=tr.pk, owner=owner)
        owner = tr2.lease_owner
        passes += 1
        c, qc, cc = time.time(), queries[0], time.process_time()
        inproc_converge()
        converge_s += time.time() - c
        q_agents += queries[0] - qc
        c_agents += time.process_time() - cc
        if time.time() - t > 600:
            break
    q_executor = queries[0] - q0 - q_notice - q_plan - q_agents
    c_executor = time.process_time() - c0 - c_notice - c_plan - c_agents
    total = time.time() - t0
    out = {
        "mode": "inproc",
        "nodes": n,
        "gpus": n * GPUS,
        "preempted_nodes": n_pre,
        "spare_nodes": spare,
        "notices": "one call per node" if args.single_notices else "one call",
        "notice_s": round(t_notice, 3),
        "plan_s": round(t_plan - t_notice, 3),
        "total_s": round(total, 3),
        "executor_s": round(total - t_plan - converge_s, 3),
        "agents_s (heartbeat service)": round(converge_s, 3),
        "executor_passes": passes,
        "queries_by_phase": {"notices": q_notice, "plan": q_plan, "executor": q_executor, "agents": q_agents},
        "cpu_s_by_phase (bench process)": {
            k: round(v, 2)
            for k, v in (("notices", c_notice), ("plan", c_plan), ("executor", c_executor), ("agents", c_agents))
        },
        "outcome": outcome,
    }
    return out | phases(tr.pk, t0)


def wait_for(cond: Any, timeout: float, what: str, every: float = 0.1) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(every)
    raise TimeoutError(f"timed out waiting for {what}")


def run_stack(n: int, args: argparse.Namespace, env: dict[str, str], tmp: Path) -> dict[str, Any]:
    from django.db import connection

    from controlplane.models import Node, Transition

    spare = max(1, round(n * args.spare))
    agents, _ = seed(n, spare)
    n_pre = max(1, round(n * args.preempt))
    env = dict(env, PEARL_HEARTBEAT_S=str(args.heartbeat), PEARL_LEASE_S=str(max(15.0, 3 * args.heartbeat)))
    procs: list[subprocess.Popen[Any]] = []
    ports, web = harness.start_daphnes(args.daphnes, cwd=ROOT, env=env, tmp=tmp)
    procs += web
    gens: list[subprocess.Popen[str]] = []
    try:
        started = time.time()
        spec = {"period": args.heartbeat, "job": "plan-job", "probe_every": 1 << 30, "change_every": 0}
        spec |= {"duration": 36000, "reconcile": True, "slots": GPUS, "pool": "elastic"}
        gens = harness.start_generators(agents, generators=args.generators, ports=ports, tmp=tmp, **spec)
        harness.wait_ready(gens, tmp)
        registered_s = time.time() - started
        # the planner starts once every agent registered: the signals queued meanwhile are planned on the whole
        # cluster (started earlier, it would shrink the job to the nodes registered so far, then grow it back)
        celery = harness.start_celery(
            ["--pool=threads", "-c", str(args.celery_threads), "-l", "warning"],
            cwd=ROOT,
            env=env,
            log=tmp / "celery.log",
        )
        procs.append(celery)

        def settled() -> bool:
            behind = Node.objects.filter(status="ready", applied_generation__lt=models_F("generation")).count()
            active = Transition.objects.filter(status__in=["pending", "running"]).exists()
            return behind == 0 and not active

        from django.db.models import F as models_F

        wait_for(settled, 900, "the registrations' re-plans to settle", every=1.0)
        time.sleep(args.heartbeat)  # one quiet heartbeat period
        harness.send(gens, {"t_start": time.time(), "count_desired": True})
        time.sleep(0.5)
        cpu0 = {p.pid: harness.cpu_s(p.pid) for p in procs}
        gcpu0 = sum(harness.cpu_s(p.pid) for p in gens)
        last = Transition.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        t0, _ = preempt(n_pre, single=args.single_notices)
        try:
            wait_for(
                lambda: Transition.objects.filter(pk__gt=last).exists(), 300, "the capacity change's transition", 0.05
            )
        except TimeoutError:
            from controlplane.models import Event

            for e in Event.objects.order_by("-id")[:15]:
                print(e.created, e.kind, e.message[:200], file=sys.stderr)
            raise
        tr_id = Transition.objects.filter(pk__gt=last).order_by("pk").values_list("pk", flat=True)[0]
        wait_for(
            lambda: Transition.objects.filter(pk=tr_id).exclude(status__in=["pending", "running"]).exists(),
            600,
            "the transition to end",
            0.05,
        )
        wall = time.time() - t0
        cpu = {p.pid: harness.cpu_s(p.pid) - cpu0[p.pid] for p in procs}
        gcpu = sum(harness.cpu_s(p.pid) for p in gens) - gcpu0
        harness.send(gens, {"stop": True}, last=True)
        outs = harness.results(gens)
    finally:
        harness.stop(gens, kill=True)
        harness.stop(procs)
    per_node = [c for o in outs for c in o.get("desired_counts", {}).values()]
    touched = [c for c in per_node if c > 0]
    out: dict[str, Any] = {
        "mode": "stack",
        "nodes": n,
        "gpus": n * GPUS,
        "preempted_nodes": n_pre,
        "spare_nodes": spare,
        "daphnes": args.daphnes,
        "generators": args.generators,
        "heartbeat_s": args.heartbeat,
        "registered_s": round(registered_s, 1),
        "end_to_end_s": round(wall, 3),
        "nodes_sent_desired_state": len(touched),
        "desired_states_per_touched_node_max": max(touched, default=0),
        "desired_states_total": sum(touched),
        "cpu_s": {
            "daphne": round(sum(cpu[w.pid] for w in web), 2),
            "celery": round(cpu[celery.pid], 2),
            "agents": round(gcpu, 2),
        },
        "failed_agents": sum(o["failed_agents"] for o in outs),
        "errors": [e for o in outs for e in o["errors"]][:5],
    }
    out |= phases(tr_id, t0)
    connection.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", default="128,512,1024")
    p.add_argument("--preempt", type=float, default=0.0625, help="share of the nodes that get a preemption notice")
    p.add_argument("--spare", type=float, default=0.0625, help="share of the nodes left free for the new workers")
    p.add_argument("--daphnes", type=int, default=2)
    p.add_argument("--generators", type=int, default=2)
    p.add_argument("--celery-threads", type=int, default=4)
    p.add_argument("--heartbeat", type=float, default=10.0, help="the agents' heartbeat period (s)")
    p.add_argument("--inproc", action="store_true", help="services in this process, no sockets (for py-spy)")
    p.add_argument("--single-notices", action="store_true", help="one preemption_notice call per node, not one for all")
    p.add_argument("--py-spy", default="", help="--inproc: py-spy profile of the measured part to FILE.<nodes>")
    p.add_argument("--out", default="")
    args = p.parse_args()
    db_url = harness.postgres_url()
    tmp = Path(tempfile.mkdtemp(prefix="pearl-plan-"))
    redis, rport = harness.start_redis()
    runs = []
    try:
        redis_url = f"redis://127.0.0.1:{rport}"
        env = dict(os.environ, DATABASE_URL=db_url, REDIS_URL=redis_url, DEBUG="0", PEARL_VAR_DIR=str(tmp))
        env.pop("PEARL_TESTING", None)
        for n in [int(x) for x in args.nodes.split(",")]:
            harness.setup(db_url, redis_url, tmp)  # a fresh database per size
            if not args.inproc:
                os.environ.pop("PEARL_TESTING", None)
            r = run_inproc(n, args) if args.inproc else run_stack(n, args, env, tmp)
            runs.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    finally:
        harness.stop([redis])
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": [round(x, 1) for x in os.getloadavg()],
        "runs": runs,
    }
    harness.write_report(out, args.out)


if __name__ == "__main__":
    main()
