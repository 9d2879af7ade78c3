"""Faults under a live RL job (issue: live agentic RL): the job's rollout driver runs the core loop
against emulated engines on real agents, the planner and executor run in Celery, and a node is taken
away in the middle of generation — its agent killed with SIGKILL, or an elastic node preempted. The
job's accounting must come out whole: every step trains exactly its batch, no trajectory is lost or
trained twice, the interrupted ones finish elsewhere from their kept prefixes."""

from __future__ import annotations

import time

import pytest

from tests.fault.conftest import assert_invariants, preempt_via_api, processes_under, record_timing, wait_for
from tests.fault.test_faults import call, registered
from tests.support.cluster import make_job, swe_spec

pytestmark = [pytest.mark.slow, pytest.mark.replan_every(2)]

BATCH = 8
TIME_FACTOR = "0.05"  # emulated H800 time ×0.05: a SWE-like step takes seconds of wall time


def _live_job(name: str, rollout_gpus: int):
    return make_job(**swe_spec(name, batch_size=BATCH, rollout_gpus=rollout_gpus))


def _records(job, kind: str) -> list[dict]:
    from controlplane.core.telemetry import TelemetryRecord
    from controlplane.models import TelemetrySample

    return [
        TelemetryRecord.from_json(r).as_dict()
        for r in TelemetrySample.objects.filter(job=job, kind=kind).order_by("id").values_list("record", flat=True)
    ]


def _busy_worker_on(node_name: str):
    """One of the node's workers has requests in flight now (generation is under way there): its agent's
    last heartbeat says so and the worker, asked just now, agrees. The heartbeat alone can be half a second
    old, longer than a turn at this time factor, and a node taken away after its turns ended interrupts none."""
    from controlplane.models import Node

    n = Node.objects.get(name=node_name)
    for o in n.observed:
        if o.get("inflight", 0) > 0 and o.get("role") != "training":
            try:
                if call(o["endpoint"], lambda c: c.stats()).running_batch > 0:
                    return o
            except Exception:  # the worker went away meanwhile
                continue
    return None


def _assert_whole_accounting(job) -> None:
    """Every trained step trained its whole batch, none lost; steps and versions never repeat; the
    loop's books balance (started = finished + stale-aborted + still running)."""
    job.refresh_from_db()
    trains, steps = _records(job, "train"), _records(job, "step")
    assert trains and steps
    assert all(t["trajectories"] == BATCH and t["missing_trajectories"] == 0 for t in trains), trains
    versions = [t["weight_version"] for t in trains]
    assert versions == list(range(versions[0], versions[0] + len(versions))), versions
    assert all(s["batch_size"] == BATCH for s in steps), steps
    assert len({s["step"] for s in steps}) == len(steps)
    cp = job.loop_state
    running = sum(1 for t in cp["trajectories"] if t["state"] not in ("done", "aborted"))
    assert cp["started_trajectories"] == cp["finished_trajectories"] + cp["stale_aborted"] + running, cp


@pytest.mark.long  # test_faults.py kills an agent in the default suite; this one, mid-generation, is a long run
def test_agent_killed_mid_generation_its_trajectories_finish_elsewhere(stack):
    from controlplane.models import Job, Node, Worker

    stack.agent("train-l", pool="training", slots=1, time_factor=float(TIME_FACTOR))
    stack.agent("roll-a", slots=2, time_factor=float(TIME_FACTOR))
    stack.agent("roll-b", slots=2, time_factor=float(TIME_FACTOR))
    for name in ("train-l", "roll-a", "roll-b"):
        registered(name)
    job = _live_job("live-kill", rollout_gpus=4)
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 1, 180, "a first update")
    wait_for(lambda: _busy_worker_on("roll-b"), 120, "generation on roll-b")

    t_kill = time.time()
    stack.kill9("agent-roll-b")  # its workers die with it (parent-death signal)
    node = Node.objects.get(name="roll-b")
    wait_for(lambda: Node.objects.get(pk=node.pk).status == "not_ready", 60, "the lease to expire")
    detect_s = time.time() - t_kill
    v = Job.objects.get(pk=job.pk).weight_version
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= v + 2, 240, "two more updates without roll-b")
    recover_s = time.time() - t_kill

    assert not Worker.objects.filter(node=node, alive=True, activity="active").exists()
    steps = _records(job, "step")
    assert sum(s["interruptions"] for s in steps) > 0, steps  # turns were cut on roll-b and routed again
    _assert_whole_accounting(job)
    assert Job.objects.get(pk=job.pk).status == "running"
    assert_invariants()
    record_timing("live_agent_kill", detect_s=detect_s, recover_s=recover_s)


def test_elastic_node_preempted_mid_generation_partials_finish_elsewhere(stack):
    from controlplane.models import Event, Job, Node

    stack.agent("train-p", pool="training", slots=1, time_factor=float(TIME_FACTOR))
    stack.agent("res-p", slots=2, time_factor=float(TIME_FACTOR))
    stack.agent("spot-p", pool="elastic", slots=2, time_factor=float(TIME_FACTOR))
    for name in ("train-p", "res-p", "spot-p"):
        registered(name)
    job = _live_job("live-preempt", rollout_gpus=4)
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 1, 180, "a first update")
    wait_for(lambda: _busy_worker_on("spot-p"), 120, "generation on spot-p")

    node = Node.objects.get(name="spot-p")
    t_notice = preempt_via_api(node.pk, 20, "op-live")
    deadline = t_notice + 20
    agent_pid = stack.procs["agent-spot-p"].pid
    # the node's workers are gone (drained, partials handed back, processes stopped) before the deadline
    wait_for(
        lambda: not [p for p in processes_under(stack.tmp / "agents" / "spot-p") if p != agent_pid],
        20,
        "the node's worker processes to stop",
    )
    gone_s = time.time() - t_notice
    assert time.time() < deadline, f"workers still ran {gone_s:.1f} s after the notice"
    wait_for(lambda: Node.objects.get(pk=node.pk).status == "gone", 40, "the node to be removed at the deadline")
    v = Job.objects.get(pk=job.pk).weight_version
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= v + 2, 240, "two more updates without spot-p")

    assert Event.objects.filter(kind="node.preemption_notice", node=node).exists()
    _assert_whole_accounting(job)
    assert Job.objects.get(pk=job.pk).status == "running"
    assert_invariants()
    record_timing("live_preemption", workers_gone_s=gone_s)
