"""Fault injection with real processes: kill -9 of an agent, a worker and the trainer, a Redis restart,
lease expiry of a paused agent, a preemption. After each: no slot bound twice, nothing outlives its
agent, partial outputs are reported (nothing lost), borrowed GPUs are back before training, and the
node recovers on its own."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import aiohttp
import pytest

from agents import dataplane as dp
from agents.worker_client import WorkerClient, session
from tests.fault.conftest import (
    SECRET,
    assert_invariants,
    last_events,
    preempt_via_api,
    processes_under,
    record_timing,
    wait_for,
)
from tests.support.cluster import make_job
from tests.support.processes import journaled_tokens

pytestmark = [pytest.mark.slow, pytest.mark.manual_placement]  # these tests place the workers themselves
# a test that kills no agent and pauses none holds a lease a loaded machine cannot lapse: a lapse of the fault
# stack's 3 s lease parks the node's workers, and with the planner off in these tests none would serve again
LONG_LEASE_S = 30.0


# ------------------------------------------------------------------ helpers
def registered(name: str):
    from controlplane.models import Node

    return wait_for(
        lambda: Node.objects.filter(name=name, status="ready", last_heartbeat__isnull=False).first(),
        what=f"{name} to register",
    )


def converged(node_id: int, worker_ids: list[int], **want) -> dict[int, dict] | None:
    """The agent applied the node's current generation and reports every worker running (as wanted)."""
    from controlplane.models import Node

    n = Node.objects.get(pk=node_id)
    obs = {o["worker_id"]: o for o in n.observed}
    if n.status != "ready" or n.applied_generation != n.generation:
        return None
    if not all(w in obs and obs[w]["state"] == "running" and obs[w]["endpoint"] for w in worker_ids):
        return None
    if not all(obs[w].get(k) == v for w in worker_ids for k, v in want.items()):
        return None
    return obs


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


async def _call(endpoint: str, coro_fn):
    s = session()
    try:
        return await coro_fn(WorkerClient(endpoint, SECRET, s))
    finally:
        await s.close()


def call(endpoint: str, coro_fn):
    try:
        return asyncio.run(_call(endpoint, coro_fn))
    except aiohttp.ClientConnectorError as exc:  # a worker gone: say what the cluster saw
        raise AssertionError(f"{exc}{last_events()}") from exc


def long_request(endpoint: str, request_id: str) -> dict:
    """Start a long generation in a thread; returns a dict that gets its result or error."""
    out: dict = {}

    def run() -> None:
        try:
            out["result"] = call(
                endpoint,
                lambda c: c.generate(
                    dp.GenerateRequest(
                        request_id=request_id, prompt="x" * 20, sampling=dp.SamplingParams(max_tokens=8000)
                    )
                ),
            )
        except Exception as exc:  # the connection may drop when the worker dies
            out["error"] = exc

    threading.Thread(target=run, daemon=True).start()
    return out


def worker_dir(stack, node: str, job: str, worker_id: int) -> Path:
    return stack.tmp / "agents" / node / "jobs" / job / f"worker-{worker_id}"


def fault_with(node_name: str, kinds: tuple[str, ...], request_id: str):
    from controlplane.models import Event

    for ev in Event.objects.filter(kind="worker.fault", node__name=node_name).order_by("id"):
        if ev.data.get("kind") in kinds and any(a.get("request_id") == request_id for a in ev.data.get("aborted", [])):
            return ev
    return None


# ------------------------------------------------------------------ kill -9 of an agent
def test_agent_kill9_orphans_die_lease_expires_restart_recovers(stack):
    from controlplane.models import Event, Node, Worker, WorkerGPU
    from controlplane.services.workers import WorkerChange, change_workers, start_worker

    stack.agent("roll-a")
    node = registered("roll-a")
    job = make_job("fault-agent", model="qwen3-8b", hardware="h800", rollout_gpus=2, training_gpus=0)
    ws = [
        start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[i], role="colocated", activity="active")
        for i in (0, 1)
    ]
    obs = wait_for(lambda: converged(node.pk, [w.pk for w in ws]), what="workers running")
    pids = {w.pk: call(obs[w.pk]["endpoint"], lambda c: c.get("health"))["pid"] for w in ws}
    long_request(obs[ws[0].pk]["endpoint"], "in-flight")
    wait_for(lambda: journaled_tokens(worker_dir(stack, "roll-a", job.name, ws[0].pk)), what="tokens in the journal")

    t_kill = time.time()
    stack.kill9("agent-roll-a")
    wait_for(lambda: not any(alive(p) for p in pids.values()), 30, "the orphaned workers to die with their agent")
    expired = wait_for(lambda: Event.objects.filter(kind="node.lease_expired", node=node).first(), what="lease expiry")
    detect_s = expired.created.timestamp() - t_kill
    fenced = Node.objects.get(pk=node.pk)
    assert fenced.status == "not_ready" and fenced.epoch > node.epoch
    assert not WorkerGPU.objects.filter(worker__in=ws, active=True).exists()  # fenced before any reassignment
    assert_invariants()

    t_restart = time.time()
    stack.agent("roll-a")  # a new incarnation, same state directory
    obs = wait_for(lambda: converged(node.pk, [w.pk for w in ws]), what="the node to recover")
    recover_s = time.time() - t_restart
    # nothing lost: the request the dead worker had in flight was reported with its partial output
    ev = wait_for(
        lambda: fault_with("roll-a", ("orphan_gone", "orphan_killed"), "in-flight"), what="the orphan's partials"
    )
    (partial,) = [a for a in ev.data["aborted"] if a["request_id"] == "in-flight"]
    assert partial["tokens"] and partial["finish_reason"] == "abort"
    # the same slots, new processes, each pinned to its slot's device
    change_workers(job_id=job.pk, changes=[WorkerChange(w.slot, activity="active") for w in ws])
    obs = wait_for(lambda: converged(node.pk, [w.pk for w in ws], activity="active"), what="workers active again")
    for i, w in enumerate(ws):
        h = call(obs[w.pk]["endpoint"], lambda c: c.get("health"))
        assert h["pid"] != pids[w.pk] and h["devices"] == [i] and obs[w.pk]["devices"] == [i]
        assert Worker.objects.get(pk=w.pk).alive
    assert_invariants()
    record_timing("agent_kill9", detect_s=detect_s, recover_s=recover_s)


# ------------------------------------------------------------------ kill -9 of a worker
@pytest.mark.lease(LONG_LEASE_S)
def test_worker_kill9_restarted_in_place_with_partials_reported(stack):
    from controlplane.models import Event
    from controlplane.services.workers import start_worker

    stack.agent("roll-w", slots=1)
    node = registered("roll-w")
    job = make_job("fault-worker", model="qwen3-8b", hardware="h800", rollout_gpus=1, training_gpus=0)
    w = start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[0], role="colocated", activity="active")
    obs = wait_for(lambda: converged(node.pk, [w.pk]), what="worker running")
    pid = call(obs[w.pk]["endpoint"], lambda c: c.get("health"))["pid"]
    long_request(obs[w.pk]["endpoint"], "w-in-flight")
    wait_for(lambda: journaled_tokens(worker_dir(stack, "roll-w", job.name, w.pk)), what="tokens in the journal")
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    crash = wait_for(lambda: fault_with("roll-w", ("crashed",), "w-in-flight"), what="the crash report")
    detect_s = crash.created.timestamp() - t_kill
    wait_for(
        lambda: Event.objects.filter(kind="worker.fault", node=node, data__kind="restarted").exists(), what="restart"
    )
    obs = wait_for(
        lambda: (o := converged(node.pk, [w.pk])) and o[w.pk]["endpoint"] != obs[w.pk]["endpoint"] and o,
        what="the new process to be reported",
    )
    recover_s = time.time() - t_kill
    h = call(obs[w.pk]["endpoint"], lambda c: c.get("health"))
    assert h["pid"] != pid and h["devices"] == [0]
    out = call(
        obs[w.pk]["endpoint"],
        lambda c: c.generate(
            dp.GenerateRequest(request_id="after", prompt="hi", sampling=dp.SamplingParams(max_tokens=3))
        ),
    )
    assert len(out.tokens) == 3
    assert_invariants()
    record_timing("worker_kill9", detect_s=detect_s, recover_s=recover_s)


# ------------------------------------------------------------------ kill -9 of the trainer; borrowed GPUs back first
def _train_step(endpoint: str, step: int) -> int:
    from tests.unit.agents.test_trainer import fixed_batch

    async def run(c: WorkerClient) -> int:
        auth = {"Authorization": f"Bearer {SECRET}"}
        async with c.session.post(
            f"{endpoint}/samples",
            headers=auth,
            json={"samples": [dp.DATA_PLANE.dump(x) for x in fixed_batch(step)], "train": False},
        ) as r:
            assert r.status == 200, await r.text()
        async with c.session.post(f"{endpoint}/step", headers=auth) as r:
            return (await r.json())["version"]

    return call(endpoint, run)


@pytest.mark.lease(LONG_LEASE_S)
def test_trainer_kill9_resumes_version_and_borrowed_gpus_return_before_training(stack):
    from controlplane.models import Job, Node, Worker
    from controlplane.selectors.cluster import desired_state
    from controlplane.services.errors import Conflict
    from controlplane.services.jobs import set_training_active, start_update
    from controlplane.services.workers import start_worker

    stack.agent("train-t", pool="training", slots=1, engine="torch")
    stack.agent("roll-t", slots=1)
    t_node, r_node = registered("train-t"), registered("roll-t")
    job = make_job("fault-trainer", rollout_gpus=1, training_gpus=1, max_staleness=0)
    trainer = start_worker(job_id=job.pk, node_id=t_node.pk, gpu_indexes=[0], role="training", activity="inactive")
    borrowed = start_worker(job_id=job.pk, node_id=t_node.pk, gpu_indexes=[0], role="colocated", activity="active")
    rollout = start_worker(job_id=job.pk, node_id=r_node.pk, gpu_indexes=[0], role="colocated", activity="active")
    t_obs = wait_for(lambda: converged(t_node.pk, [trainer.pk, borrowed.pk]), 120, "trainer and borrowed worker")
    wait_for(lambda: converged(r_node.pk, [rollout.pk]), what="rollout worker")

    # Training Begin returns the borrowed worker at once; the trainer may not compute until its agent
    # has parked it (no plan or transition in between: the return is due by a deadline)
    t_begin = time.time()
    set_training_active(job_id=job.pk, active=True, actor="test")
    assert Worker.objects.get(pk=borrowed.pk).activity == "inactive"
    with pytest.raises(Conflict, match="not returned"):
        start_update(job_id=job.pk, actor="test")
    assert Worker.objects.get(pk=trainer.pk).activity == "inactive"
    wait_for(lambda: converged(t_node.pk, [borrowed.pk], activity="inactive"), what="the borrowed worker to return")
    return_s = time.time() - t_begin
    assert call(t_obs[borrowed.pk]["endpoint"], lambda c: c.get("health"))["state"] == "sleeping"
    start_update(job_id=job.pk, actor="test")  # now the trainer computes
    assert Worker.objects.get(pk=trainer.pk).activity == "active"
    assert_invariants()

    assert _train_step(t_obs[trainer.pk]["endpoint"], 0) == 1
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version == 1, what="v1 published")
    wait_for(lambda: converged(r_node.pk, [rollout.pk], weight_version=1), what="the rollout worker to pull v1")
    set_training_active(job_id=job.pk, active=False, actor="test")

    old_endpoint = t_obs[trainer.pk]["endpoint"]
    pid = call(old_endpoint, lambda c: c.get("health"))["pid"]
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)
    t_obs = wait_for(
        lambda: (
            (o := converged(t_node.pk, [trainer.pk], weight_version=1))
            and o[trainer.pk]["endpoint"] != old_endpoint
            and o
        ),
        120,
        "the trainer to come back at v1",
    )
    recover_s = time.time() - t_kill
    new_endpoint = t_obs[trainer.pk]["endpoint"]
    assert Worker.objects.get(pk=trainer.pk).endpoint == new_endpoint
    assert Job.objects.get(pk=job.pk).weight_version == 1  # resumed, not restarted from 0
    assert desired_state(Node.objects.get(pk=r_node.pk)).workers[0].weights_url == new_endpoint
    # it trains on from its checkpoint, and the rollout worker pulls from the new endpoint
    assert _train_step(new_endpoint, 1) == 2
    wait_for(lambda: converged(r_node.pk, [rollout.pk], weight_version=2), what="the rollout worker to pull v2")
    assert_invariants()
    record_timing("trainer_kill9", recover_s=recover_s)
    record_timing("borrowed_return_at_training_begin", return_s=return_s)


# ------------------------------------------------------------------ Redis restart
def test_redis_restart_the_link_heals_and_changes_still_arrive(stack):
    from controlplane.services.workers import WorkerChange, change_workers, start_worker

    stack.agent("roll-r", slots=1)
    node = registered("roll-r")
    job = make_job("fault-redis", model="qwen3-8b", hardware="h800", rollout_gpus=1, training_gpus=0)
    w = start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[0], role="colocated", activity="active")
    wait_for(lambda: converged(node.pk, [w.pk]), what="worker running")
    stack.kill9("redis")
    time.sleep(2 * 0.5 + 0.5)  # a few heartbeats while Redis is gone
    t_back = time.time()
    stack.start_redis()  # empty: every group membership and queued message is gone
    change_workers(job_id=job.pk, changes=[WorkerChange(w.slot, activity="inactive")])  # its push may be lost
    wait_for(lambda: converged(node.pk, [w.pk], activity="inactive"), what="the change to reach the agent")
    recover_s = time.time() - t_back
    change_workers(job_id=job.pk, changes=[WorkerChange(w.slot, activity="active")])
    wait_for(lambda: converged(node.pk, [w.pk], activity="active"), what="the next change")
    # Celery is back too: the sweeper keeps running (a paused agent is detected again)
    from controlplane.models import Event

    os.kill(stack.procs["agent-roll-r"].pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: Event.objects.filter(kind="node.lease_expired", node=node).exists(), what="the sweeper after Redis"
        )
    finally:
        os.kill(stack.procs["agent-roll-r"].pid, signal.SIGCONT)
    wait_for(lambda: converged(node.pk, [w.pk]), what="recovery after the pause")
    assert_invariants()
    record_timing("redis_restart", recover_s=recover_s)


# ------------------------------------------------------------------ lease expiry of a paused agent
def test_paused_agent_is_fenced_then_resyncs(stack):
    from controlplane.models import Event, Node, WorkerGPU
    from controlplane.services.workers import start_worker

    agent = stack.agent("roll-p", slots=1)
    node = registered("roll-p")
    job = make_job("fault-lease", model="qwen3-8b", hardware="h800", rollout_gpus=1, training_gpus=0)
    w = start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[0], role="colocated", activity="active")
    obs = wait_for(lambda: converged(node.pk, [w.pk]), what="worker running")
    pid = call(obs[w.pk]["endpoint"], lambda c: c.get("health"))["pid"]
    t_pause = time.time()
    os.kill(agent.pid, signal.SIGSTOP)  # a paused lease holder (GC pause, VM stall)
    try:
        expired = wait_for(
            lambda: Event.objects.filter(kind="node.lease_expired", node=node).first(), what="lease expiry"
        )
        detect_s = expired.created.timestamp() - t_pause
        fenced = Node.objects.get(pk=node.pk)
        assert fenced.status == "not_ready" and fenced.epoch == node.epoch + 1
        assert not WorkerGPU.objects.filter(worker=w, active=True).exists()
        assert_invariants()
    finally:
        t_resume = time.time()
        os.kill(agent.pid, signal.SIGCONT)
    # its heartbeats carry the old epoch: refused; it resyncs to the fenced desired state and recovers
    obs = wait_for(lambda: converged(node.pk, [w.pk], activity="inactive"), what="resync after the pause")
    recover_s = time.time() - t_resume
    assert Node.objects.get(pk=node.pk).epoch == node.epoch + 1
    assert Event.objects.filter(kind="node.recovered", node=node).exists()
    assert call(obs[w.pk]["endpoint"], lambda c: c.get("health"))["pid"] == pid  # the same process, fenced, parked
    assert_invariants()
    record_timing("lease_expiry_paused_agent", detect_s=detect_s, recover_s=recover_s)


# ------------------------------------------------------------------ preemption
@pytest.mark.lease(LONG_LEASE_S)
def test_preemption_drains_reports_partials_and_removes_the_node(stack):
    from controlplane.models import GPU, Node, Worker
    from controlplane.services.workers import start_worker

    stack.agent("spot-x", pool="elastic", slots=1)
    node = registered("spot-x")
    job = make_job("fault-preempt", model="qwen3-8b", hardware="h800", rollout_gpus=1, training_gpus=0)
    w = start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[0], role="colocated", activity="active")
    obs = wait_for(lambda: converged(node.pk, [w.pk]), what="worker running")
    pid = call(obs[w.pk]["endpoint"], lambda c: c.get("health"))["pid"]
    busy = long_request(obs[w.pk]["endpoint"], "preempted")
    wait_for(lambda: journaled_tokens(worker_dir(stack, "spot-x", job.name, w.pk)), what="tokens in the journal")

    t_notice = preempt_via_api(node.pk, 4, "op-fault")
    result = wait_for(lambda: busy.get("result") or busy.get("error"), what="the drained request")
    assert (
        isinstance(result, dp.GenerationResult) and result.finish_reason == "abort" and result.tokens
    )  # partial back to its caller
    drained = wait_for(lambda: fault_with("spot-x", ("drained",), "preempted"), what="the drained partial reported")
    assert drained.data["aborted"][0]["tokens"]
    wait_for(lambda: not alive(pid), what="the worker to stop")
    drain_s = time.time() - t_notice
    wait_for(lambda: Node.objects.get(pk=node.pk).status == "gone", what="the node to be removed at the deadline")
    assert not Worker.objects.filter(node=node, alive=True).exists()
    assert not GPU.objects.filter(node=node, present=True).exists()
    assert not [p for p in processes_under(stack.tmp / "agents" / "spot-x") if p != stack.procs["agent-spot-x"].pid]
    assert_invariants()
    record_timing("preemption", drain_s=drain_s)
