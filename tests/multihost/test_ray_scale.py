"""How many logical Ray nodes one bridge and one control plane hold on this machine (issue 21, Measure).
A benchmark, not a test of the default run: it runs only with PEARL_MULTIHOST_SCALE=4,8,... (the node
counts to grow through; `benchmarks/bench_multihost.py --scale` sets it) and records its figures in
PEARL_FAULT_TIMINGS.

At each count it adds Ray nodes (each its own namespace and raylet, 2 logical GPUs; with
PEARL_MULTIHOST_SCALE_MODE=logical, raylets that share one namespace and address), waits for every
agent to register, then measures: the resident memory and idle CPU of all the nodes' sessions and of
the control plane's processes, how long the bridge takes from a Ray drain to PEARL's notice, and
whether every lease held for 10 s. It stops growing at the first count where memory would run short
(MemAvailable under MIN_FREE_MIB plus one node), an agent does not register in time, or a lease is
lost, and records which limit it was."""

from __future__ import annotations

import functools
import os
import time

import pytest

from tests.multihost.conftest import Cluster, wait_for
from tests.multihost.test_ray_cluster import _ts, group_usage, record

SIZES = [int(x) for x in os.environ.get("PEARL_MULTIHOST_SCALE", "").split(",") if x.strip()]
# namespaces: each Ray node its own host (namespace, address); logical: every Ray node a raylet on one shared host
MODE = os.environ.get("PEARL_MULTIHOST_SCALE_MODE", "namespaces")
MIN_FREE_MIB = 3072  # left to the other jobs on this machine
DRAIN_S = 600  # the drained node stays up (and held) for the rest of the run
CONTROL = ("daphne", "celery", "bridge", "redis", "postgres")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(3600),
    pytest.mark.skipif(
        not SIZES, reason="a benchmark: set PEARL_MULTIHOST_SCALE=4,8,... (benchmarks/bench_multihost.py --scale)"
    ),
]


def _available_mib() -> float:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:")) / 1024


def _pss_mib(cluster: Cluster, names: list[str]) -> float:
    """Proportional set size (MiB) of every live process in those sessions: RSS counts the pages the Ray
    processes share (libraries, the same Python) once per process, PSS splits them, so it adds up."""
    sessions = {cluster.hosts.procs[n].pid for n in names}
    kib = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[3]) not in sessions:
                    continue
            with open(f"/proc/{entry}/smaps_rollup") as f:
                kib += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration):
            continue
    return kib / 1024


def _usage(cluster: Cluster, names: list[str]) -> tuple[float, float]:
    rss, cpu = 0.0, 0.0
    for name in names:
        r, c = group_usage(cluster.hosts.procs[name].pid)
        rss, cpu = rss + r, cpu + c
    return rss, cpu


def _ready_count(cluster: Cluster) -> int:
    """Agents registered, bound and holding their lease (a node drained earlier in the run counts: it still
    is); the cluster has no other Ray-bound nodes."""
    return sum(1 for n in cluster.db.nodes().values() if n["ray_node_id"] and n["status"] in ("ready", "draining"))


def _notices(cluster: Cluster, name: str) -> list[dict]:
    return [e for e in cluster.db.events("node.preemption_notice") if e["node"] == name]


def test_how_many_ray_nodes_one_bridge_and_one_control_plane_hold(cluster: Cluster):
    cluster.start_bridge()
    hosts: list[str] = []
    per_node_mib = 300.0  # a first guess (BENCHMARKS.md: ~280 MiB PSS), replaced by what is measured
    limit = f"not reached up to {SIZES[-1]} nodes"
    for size in SIZES:
        need = (size - len(hosts)) * per_node_mib
        if _available_mib() - need < MIN_FREE_MIB:
            limit = f"memory: {_available_mib():.0f} MiB available, {size} nodes need ~{need:.0f} MiB more"
            break
        t0 = time.time()
        while len(hosts) < size:
            host = f"s{len(hosts) + 1}"
            if MODE == "logical":
                cluster.add_logical_node(host, "lg", len(hosts), gpus=2)
            else:
                cluster.add_node(host, gpus=2)
            hosts.append(host)
        try:
            wait_for(lambda: _ready_count(cluster) == len(hosts), 300 + 20 * size, f"{size} agents")
        except AssertionError:
            limit = f"registration: {_ready_count(cluster)} of {size} agents ready after {time.time() - t0:.0f} s"
            break
        up_s = time.time() - t0
        lost_before = len(cluster.db.events("node.lease_expired"))
        _, nodes_cpu0 = _usage(cluster, [f"ray-{h}" for h in hosts])
        _, cp_cpu0 = _usage(cluster, list(CONTROL))
        time.sleep(10)
        nodes_rss, nodes_cpu = _usage(cluster, [f"ray-{h}" for h in hosts])
        cp_rss, cp_cpu = _usage(cluster, list(CONTROL))
        nodes_pss = _pss_mib(cluster, [f"ray-{h}" for h in hosts])
        per_node_mib = nodes_pss / len(hosts)  # what a node really adds (RSS counts shared pages per process)
        # the bridge's reaction at this size: a preemption drain of a node not drained yet, far deadline
        victim = min(
            (n for n in cluster.db.nodes().values() if n["status"] == "ready" and n["ray_node_id"]),
            key=lambda n: n["name"],
        )
        cluster.ray_drain(victim["ray_node_id"], DRAIN_S)
        notice = wait_for(
            functools.partial(_notices, cluster, victim["name"]),
            60,
            "the notice",
        )[0]
        # `ray drain-node` sets the deadline DRAIN_S after it drains (its own start-up is not the bridge's)
        t_drain = _ts(cluster.db.nodes()[victim["name"]]["preemption_deadline"]) - DRAIN_S
        lost = len(cluster.db.events("node.lease_expired")) - lost_before
        record(
            "ray_scale",
            mode=MODE,
            nodes=size,
            up_s=up_s,
            nodes_rss_mib=nodes_rss,
            rss_per_node_mib=nodes_rss / len(hosts),
            pss_per_node_mib=per_node_mib,
            control_pss_mib=_pss_mib(cluster, list(CONTROL)),
            nodes_idle_cpu_pct=100 * (nodes_cpu - nodes_cpu0) / 10,
            control_rss_mib=cp_rss,
            control_cpu_pct=100 * (cp_cpu - cp_cpu0) / 10,
            drain_to_notice_s=_ts(notice["created"]) - t_drain,
            leases_lost=lost,
            mem_available_mib=_available_mib(),
        )
        if lost:
            limit = f"leases: {lost} lost in 10 s at {size} nodes"
            break
    record("ray_scale_limit", mode=MODE, nodes=len(hosts), limit=limit)
    assert hosts
