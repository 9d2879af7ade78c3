"""A live RL job across hosts (issue 21, items 3 and 4): the bridge places an agent on each of three Ray
nodes, each in its own network namespace; every agent binds and advertises its node's Ray IP, so the
job's rollout driver (on the trainer's node) reaches the rollout workers on the two other nodes, and
they pull weights from the trainer. Under that one job, in order (they share its setup):

- the bridge is SIGKILLed and restarted;
- the database and Daphne are crashed mid-step and restarted;
- the control plane is cut off from every node for 30 s;
- one rollout node (r2) is SIGKILLed (its raylet's process group) in the middle of generation;
- a spot node (r3, elastic) joins and the next plan puts the job's rollout workers on it;
- r3 is drained by Ray for preemption with a 10 s deadline and killed at the deadline.

The last three build on each other (run them alone as `-k "killed or joins or spot"`).

After each, the job goes on and every step trains exactly its batch: nothing lost or trained twice (the
loop's TRAIN and STEP records, its checkpointed books), as `tests/fault/test_live_faults.py` checks on
one host. Figures go to PEARL_FAULT_TIMINGS (benchmarks/bench_multihost.py reads them)."""

from __future__ import annotations

import functools
import json
import sys
import time
from typing import Any

import pytest

from tests.multihost.conftest import HEAD_IP, LEASE_S, RAY_PORT, Cluster, wait_for
from tests.multihost.test_ray_cluster import _ts, record
from tests.support.cluster import swe_spec

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # a hang guard: the first test builds the job

BATCH = 8
TIME_FACTOR = "0.2"  # emulated time: turns long enough that a node killed while it reports requests in flight cuts them


def start_bridge(cluster: Cluster) -> None:
    """The bridge, as `Cluster.start_bridge` starts it, at this scenario's time factor."""
    argv = [
        sys.executable,
        "manage.py",
        "ray_bridge",
        "--address",
        f"{HEAD_IP}:{RAY_PORT}",
        "--control-plane",
        cluster.control_plane,
        "--time-factor",
        TIME_FACTOR,
        "--state-root",
        str(cluster.hosts.tmp / "agents"),
        "--interval",
        "0.5",
    ]
    cluster.hosts.start("bridge", "cp", argv, cluster.env)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def _records(cluster: Cluster, job: int, kind: str) -> list[dict]:
    from controlplane.core.telemetry import TelemetryRecord

    rows = cluster.db.rows(
        "SELECT record FROM controlplane_telemetrysample WHERE job_id = %s AND kind = %s ORDER BY id", job, kind
    )
    return [TelemetryRecord.from_json(_json(r[0])).as_dict() for r in rows]


def _job(cluster: Cluster, job: int) -> dict:
    version, status, loop = cluster.db.rows(
        "SELECT weight_version, status, loop_state FROM controlplane_job WHERE id = %s", job
    )[0]
    return {"weight_version": version, "status": status, "loop_state": _json(loop)}


def _busy(cluster: Cluster, host: str, fresh_s: float = 0.2, inflight: int = 2) -> bool:
    """The agent at host's address reported, within the last `fresh_s`, rollout workers with at least
    `inflight` requests in flight (the test cannot ask the workers themselves: they are in other
    namespaces; a turn at this time factor can end within a heartbeat period, so an older report may
    describe nothing still running)."""
    ip = cluster.nodes[host]
    rows = cluster.db.rows("SELECT observed, last_heartbeat FROM controlplane_node WHERE ray_address = %s", ip)
    return any(
        beat is not None
        and time.time() - _ts(beat) < fresh_s
        and sum(o.get("inflight", 0) for o in _json(observed) or [] if o.get("role") != "training") >= inflight
        for observed, beat in rows
    )


def _ready(cluster: Cluster, host: str) -> bool:
    return any(n["ray_address"] == cluster.nodes[host] and n["status"] == "ready" for n in cluster.db.nodes().values())


@pytest.fixture(scope="module")
def job(cluster: Cluster) -> int:
    """Three Ray nodes (one training GPU, two nodes of two rollout GPUs), the bridge, and a running job
    that has published its first update across hosts."""
    cluster.add_node("t1", gpus=1, pool="training")
    cluster.add_node("r1", gpus=2, pool="reserved")
    cluster.add_node("r2", gpus=2, pool="reserved")
    start_bridge(cluster)
    for host in ("t1", "r1", "r2"):
        wait_for(functools.partial(_ready, cluster, host), 240, f"the agent on {host}")
    spec = swe_spec("across", batch_size=BATCH, rollout_gpus=4)
    out = cluster.manage(
        "shell",
        "-c",
        f"from controlplane.services.jobs import create_job; print(create_job(spec={spec!r}, actor='test').pk)",
    )
    job = int(out.strip().splitlines()[-1])
    wait_for(lambda: _job(cluster, job)["weight_version"] >= 1, 300, "a first update across hosts")
    return job


def books(cluster: Cluster, job: int) -> dict[str, int]:
    """Every step trained exactly its batch, in order, none twice and none short (nothing lost or
    duplicated); the loop's books balance. Returns the totals a fault's figures are read from."""
    version = _job(cluster, job)["weight_version"]
    wait_for(  # the driver's TRAIN record of an update arrives after the update is published
        lambda: any(t["weight_version"] >= version for t in _records(cluster, job, "train")),
        60,
        f"the TRAIN record of version {version}",
    )
    steps, trains = _records(cluster, job, "step"), _records(cluster, job, "train")
    state = _job(cluster, job)
    loop = state["loop_state"]
    running = sum(1 for t in loop["trajectories"] if t["state"] not in ("done", "aborted"))
    versions = [t["weight_version"] for t in trains]
    trained = [t["step"] for t in trains]
    figures = {
        "updates": len(trains),
        "trained_trajectories": sum(t["trajectories"] for t in trains),
        # the trainer had no samples of a trajectory the loop finished, or the loop's books do not balance
        "lost": sum(t["missing_trajectories"] for t in trains)
        + abs(loop["started_trajectories"] - loop["finished_trajectories"] - loop["stale_aborted"] - running),
        # a step trained (or started) twice, a version published twice
        "duplicated": (len(trained) - len(set(trained)))
        + (len(steps) - len({s["step"] for s in steps}))
        + (len(versions) - len(set(versions))),
        "short_updates": sum(1 for t in trains if t["trajectories"] != BATCH),
        "interruptions": sum(s["interruptions"] for s in steps),
        "stale_aborted": int(loop["stale_aborted"]),
        # trajectories started again from scratch for any reason but staleness or a failed environment (a
        # fault's cut turns resume from their prefixes instead): every step starts BATCH, each restart one more
        "restarted": loop["started_trajectories"]
        - BATCH * len(loop["steps"])
        - int(loop["stale_aborted"])
        - int(loop.get("failed_trajectories", 0)),
    }
    assert trains, "no TRAIN record"
    assert figures["lost"] == figures["duplicated"] == figures["short_updates"] == 0, (figures, trains, loop)
    assert versions == list(range(versions[0], versions[0] + len(versions))), versions  # none skipped
    assert all(s["batch_size"] == BATCH for s in steps), steps
    assert state["status"] == "running", state
    return figures


def goes_on(
    cluster: Cluster, job: int, before: dict[str, int], fault: str, *, since: float, updates: int = 1, **figures: Any
) -> dict[str, int]:
    """After a fault: the job trains `updates` more versions (counted from now) and its books still balance
    (`books`); the fault's figures are recorded with recovery (seconds from `since`) and what the books
    gained since `before`: trajectories resumed, lost, duplicated, updates. Returns the books after."""
    v = _job(cluster, job)["weight_version"]
    wait_for(
        lambda: _job(cluster, job)["weight_version"] >= v + updates, 300 * updates, f"{updates} update(s) after {fault}"
    )
    after = books(cluster, job)
    record(
        fault,
        **figures,
        recover_s=time.time() - since,
        resumed=after["interruptions"] - before["interruptions"],
        lost=after["lost"] - before["lost"],
        duplicated=after["duplicated"] - before["duplicated"],
        updates=after["updates"] - before["updates"],
    )
    return after


def _beat_since(cluster: Cluster, host: str, t: float) -> bool:
    """The node at host's address is ready and its agent heartbeated after t (its link is back)."""
    rows = cluster.db.rows(
        "SELECT status, last_heartbeat FROM controlplane_node WHERE ray_address = %s", cluster.nodes[host]
    )
    return any(st == "ready" and beat is not None and _ts(beat) > t for st, beat in rows)


def _generating(cluster: Cluster) -> bool:
    """Some rollout node reported requests in flight within the last second (a fault struck now finds
    turns running: they finish, or are cut and counted)."""
    return any(_busy(cluster, h, fresh_s=1.0, inflight=1) for h in ("r1", "r2"))


def _worker_ids(cluster: Cluster, job: int) -> set[int]:
    return {r[0] for r in cluster.db.rows("SELECT id FROM controlplane_worker WHERE job_id = %s AND alive", job)}


def _placed(cluster: Cluster) -> int:
    return len([x for x in cluster.bridge_lines() if x["bridge"] == "place_agent"])


def test_every_worker_of_the_job_serves_on_its_nodes_own_address(cluster: Cluster, job: int):
    endpoints = [
        r[0] for r in cluster.db.rows("SELECT endpoint FROM controlplane_worker WHERE job_id = %s AND alive", job)
    ]
    hosts = {e.split("//", 1)[1].rsplit(":", 1)[0] for e in endpoints if e}
    assert hosts == {cluster.nodes[h] for h in ("t1", "r1", "r2")}, endpoints  # each on its node's own address
    books(cluster, job)


def test_the_bridge_restarted_mid_run(cluster: Cluster, job: int):
    """The bridge is SIGKILLed while turns are in flight and started again: it places no agent twice and
    stops none (the agents are detached actors), sends no node event again, and the job goes on."""
    before = books(cluster, job)
    nodes_before = {k: (v["status"], v["epoch"]) for k, v in cluster.db.nodes().items()}
    wait_for(functools.partial(_generating, cluster), 180, "generation in flight")
    t_kill = time.time()
    cluster.hosts.kill("bridge")
    (cluster.hosts.tmp / "bridge.log").rename(cluster.hosts.tmp / "bridge-1.log")
    start_bridge(cluster)
    wait_for(lambda: any(x["bridge"] == "bridge" for x in cluster.bridge_lines()), 60, "the bridge to start again")
    goes_on(cluster, job, before, "bridge_restart_job", since=t_kill, back_s=time.time() - t_kill)
    assert [x for x in cluster.bridge_lines() if x["bridge"] != "bridge"] == []  # nothing placed, stopped, sent
    assert {k: (v["status"], v["epoch"]) for k, v in cluster.db.nodes().items()} == nodes_before


def test_the_database_and_daphne_restarted_mid_step(cluster: Cluster, job: int):
    """PostgreSQL and Daphne crash (SIGKILL) while turns are in flight and come back 5 s later: the
    agents keep their workers serving and the driver keeps generating meanwhile; the driver's link and
    the agents' reconnect (down longer than the test's lease, the nodes are fenced once the sweeper reads
    the database again and re-join with a new epoch, which may replace their workers: recorded, not
    asserted), the bridge rides it out, and the job goes on, every step training exactly its batch."""
    before, workers = books(cluster, job), _worker_ids(cluster, job)
    placed = _placed(cluster)
    wait_for(functools.partial(_generating, cluster), 180, "generation in flight")
    t_down, t_up = cluster.restart_database_and_daphne(down_s=5.0)
    wait_for(lambda: all(_beat_since(cluster, h, t_up) for h in ("t1", "r1", "r2")), 120, "every agent linked again")
    # an update after the restart: it trains the step whose turns were in flight through it
    goes_on(
        cluster,
        job,
        before,
        "db_daphne_restart",
        since=t_up,
        down_s=t_up - t_down,
        relinked_s=time.time() - t_up,
        fenced_nodes=len([e for e in cluster.db.events("node.lease_expired") if _ts(e["created"]) > t_down]),
        workers_replaced=len(workers - _worker_ids(cluster, job)),
    )
    assert _placed(cluster) == placed  # the bridge rode it out: no agent placed again
    assert cluster.hosts.procs["bridge"].poll() is None


def test_the_control_plane_cut_off_from_every_node_for_30_s(cluster: Cluster, job: int):
    """Daphne, Celery, Redis, the database and the bridge lose every node (the Ray head keeps them): the
    leases run out and PEARL fences the nodes; the driver keeps generating on the workers it knows over
    the data plane (node to node, still linked). After the heal every agent holds its lease again on the
    same Ray node, no agent was placed twice, and the job goes on, every step training exactly its batch."""
    before = books(cluster, job)
    live = ("t1", "r1", "r2")
    nodes_before = {
        h: next(n for n in cluster.db.nodes().values() if n["ray_address"] == cluster.nodes[h]) for h in live
    }
    placed = _placed(cluster)
    wait_for(functools.partial(_generating, cluster), 180, "generation in flight")
    cluster.hosts.link("cp", up=False)
    t_cut = time.time()
    try:
        time.sleep(30)
    finally:
        cluster.hosts.link("cp", up=True)
    t_heal = time.time()
    fenced: dict[str, float] = {}  # each node's first fencing in the cut, seconds after it began
    for e in cluster.db.events("node.lease_expired"):
        if t_cut < _ts(e["created"]) < t_heal + LEASE_S:  # the sweeper may run a pass late on loaded cores
            fenced.setdefault(e["node"], _ts(e["created"]) - t_cut)
    assert set(fenced) == {nodes_before[h]["name"] for h in live}, fenced  # every lease ran out
    wait_for(lambda: all(_ready(cluster, h) for h in live), 120, "every node to hold its lease again")
    goes_on(
        cluster,
        job,
        before,
        "partition_control_plane_30s_job",
        since=t_heal,
        fenced_s=max(fenced.values()),
        rejoin_s=time.time() - t_heal,
    )
    nodes_after = {
        h: next(n for n in cluster.db.nodes().values() if n["ray_address"] == cluster.nodes[h]) for h in live
    }
    assert all(nodes_after[h]["ray_node_id"] == nodes_before[h]["ray_node_id"] for h in live)
    assert all(nodes_after[h]["epoch"] > nodes_before[h]["epoch"] for h in live)  # fenced, re-joined anew
    assert _placed(cluster) == placed
    names = {nodes_before[h]["name"] for h in live}
    assert not [x for x in cluster.bridge_lines() if x["bridge"] == "gone" and x["name"] in names]  # Ray kept them


def test_a_killed_rollout_node_its_trajectories_resume_elsewhere(cluster: Cluster, job: int):
    before = books(cluster, job)
    wait_for(lambda: _busy(cluster, "r2"), 300, "generation on r2")
    t_kill = time.time()
    cluster.hosts.kill("ray-r2")  # SIGKILL of the raylet's process group: raylet, agent actor, its workers
    wait_for(
        lambda: (
            next(n for n in cluster.db.nodes().values() if n["ray_address"] == cluster.nodes["r2"])["status"] != "ready"
        ),
        60,
        "PEARL to see r2 lost",
    )
    # two updates: the first may train the step before the one the kill cut (max staleness 1), whose STEP record
    # (with its interruptions) is written only when its rollout is complete
    after = goes_on(cluster, job, before, "ray_node_killed_job", since=t_kill, updates=2, detect_s=time.time() - t_kill)
    assert after["interruptions"] > before["interruptions"]  # turns were cut on r2 and routed again


def _workers_on(cluster: Cluster, job: int, host: str) -> int:
    """The job's live rollout workers on the node at host's address."""
    rows = cluster.db.rows(
        "SELECT count(*) FROM controlplane_worker w JOIN controlplane_node n ON n.id = w.node_id "
        "WHERE w.job_id = %s AND w.alive AND w.role <> 'training' AND n.ray_address = %s",
        job,
        cluster.nodes[host],
    )
    return int(rows[0][0])


def test_a_new_node_joins_and_the_next_plan_uses_it(cluster: Cluster, job: int):
    """A spot (elastic) Ray node joins mid-run, while the job is two rollout GPUs short (r2 died above):
    the bridge places an agent on it, the agent registers, the next plan starts the job's rollout
    workers on it and they serve turns, and the job goes on, every step training exactly its batch.
    (Follows the kill above: alone, run it as `-k "killed or joins"`.)"""
    r2 = [n for n in cluster.db.nodes().values() if n["ray_address"] == cluster.nodes["r2"]]
    assert r2 and r2[0]["status"] != "ready", "r2 must be gone (the kill scenario runs first)"
    before = books(cluster, job)
    placed = _placed(cluster)
    t_join = time.time()
    cluster.add_node("r3", gpus=2, pool="elastic")
    wait_for(functools.partial(_ready, cluster, "r3"), 240, "the agent on r3")
    t_ready = time.time()
    wait_for(lambda: _workers_on(cluster, job, "r3") == 2, 240, "the job's rollout workers on r3")
    t_used = time.time()
    wait_for(lambda: _busy(cluster, "r3", fresh_s=1.0, inflight=1), 240, "turns served on r3")
    goes_on(
        cluster,
        job,
        before,
        "ray_node_joins_job",
        since=t_join,
        registered_s=t_ready - t_join,
        used_s=t_used - t_join,
    )
    assert _placed(cluster) == placed + 1  # one agent, for the new node only


def test_a_spot_node_drained_with_a_10_s_deadline_then_killed_at_it(cluster: Cluster, job: int):
    """Ray drains the spot node r3 for preemption with a 10 s deadline while it serves turns (what
    KubeRay does on a cloud's spot notice), and its machine dies at the deadline: PEARL's notice carries
    Ray's deadline, the job's workers on r3 are gone before it, the cut trajectories resume on r1 from
    their prefixes, and the job goes on, every step training exactly its batch. (Follows the join above.)"""
    assert _workers_on(cluster, job, "r3") > 0, "r3 must serve the job (the join scenario runs first)"
    before = books(cluster, job)
    r3 = next(n for n in cluster.db.nodes().values() if n["ray_address"] == cluster.nodes["r3"])
    wait_for(functools.partial(_busy, cluster, "r3"), 180, "generation on r3")
    t_drain = cluster.ray_drain(r3["ray_node_id"], 10)
    notice = wait_for(
        lambda: [e for e in cluster.db.events("node.preemption_notice") if e["node"] == r3["name"]], 30, "the notice"
    )[0]
    deadline = _ts(cluster.db.nodes()[r3["name"]]["preemption_deadline"])
    assert t_drain + 10 - 1 < deadline <= time.time() + 10, (t_drain, deadline)  # Ray's 10 s, not a default
    wait_for(
        lambda: _workers_on(cluster, job, "r3") == 0,
        max(0.1, deadline - time.time()),
        "r3's workers to be gone before its deadline",
    )
    gone_before_s = deadline - time.time()
    time.sleep(max(0.0, deadline - time.time()))
    cluster.hosts.kill("ray-r3")  # the cloud takes the machine at the deadline
    # two updates, as after the kill: the STEP record of the step the drain cut comes when its rollout completes
    after = goes_on(
        cluster,
        job,
        before,
        "ray_preemption_job",
        since=deadline,
        updates=2,
        notice_s=_ts(notice["created"]) - (deadline - 10),
        workers_gone_before_deadline_s=gone_before_s,
    )
    # partial trajectories are kept: the drain lets r3's turns in flight finish (or cuts them: resumed), and the
    # trajectories go on on r1 with their turns so far; none starts again from scratch
    assert after["restarted"] == before["restarted"], (before, after)
