"""Exactly-once samples under a live job (issue 34): the job's rollout driver is killed (SIGKILL) mid-rollout
with some of its step's trajectories finished, the node agent starts it again, and the step goes on with
the finished trajectories (durable at the trainer since before the driver counted them), rerunning only the
unfinished ones.

What is checked, from the trainer's own audit (`<ckpt>/updates.jsonl`, one line per committed update) and
the durable buffer at the kill: every trajectory finished at the kill is trained in its step's update and
none of them is run again (no `-rN` replacement of it); no trajectory is trained twice; each step's update
trains each slot of its batch once (no prompt skipped or repeated), steps and weight versions are
consecutive, and the loop's task cursor is where its step says."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from tests.fault.conftest import assert_invariants, wait_for
from tests.fault.test_faults import registered
from tests.support.cluster import make_job, swe_spec

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.replan_every(2)]

BATCH, GROUP = 8, 4
TIME_FACTOR = 0.05  # emulated H800 time x0.05: a SWE-like step takes seconds of wall time


def _job(name: str):
    return make_job(**swe_spec(name, batch_size=BATCH, group_size=GROUP, rollout_gpus=2))


def _ckpt(stack, node: str, job: str) -> Path | None:
    return next((stack.tmp / "agents" / node / "jobs" / job).glob("worker-*/ckpt"), None)


def _buffered(ckpt: Path) -> dict[int, set[str]]:
    """The trainer's durable buffer: per step not trained yet, the trajectories whose samples it acknowledged."""
    out: dict[int, set[str]] = {}
    for f in sorted((ckpt / "buffer").glob("step_*.jsonl")):
        names = set()
        for line in f.read_text().splitlines():
            try:
                names.add(json.loads(line)["trajectory"])
            except (ValueError, KeyError):  # a line being written
                continue
        out[int(f.stem.split("_")[1])] = names
    return out


def _driver_pid(agent_pid: int, job: str) -> int | None:
    """The job's rollout driver, a child of the node agent (`python -m agents.driver --job JOB`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == agent_pid and b"agents.driver" in argv and job.encode() in argv:
            return int(entry.name)
    return None


def _just_finished(ckpt: Path, within_s: float = 60.0) -> tuple[int, set[str]] | None:
    """Waits for a trajectory of a step in flight to become durable at the trainer, others of the step still
    unfinished: that step and its durable trajectories (None if none within `within_s`)."""
    before = _buffered(ckpt)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = _buffered(ckpt)
        for step, names in now.items():
            if names - before.get(step, set()) and len(names) < BATCH:
                return step, names
        before = now
    return None


def _assert_exactly_once(ckpt: Path, job, step: int, durable: set[str]) -> None:
    """The trainer's audit after the restart: each step's update committed once, consecutive versions, no
    trajectory trained twice, each batch slot once per step; the durable ones trained in their step as they were
    (not regenerated); the loop's task cursor where its step says; the job running, the cluster's invariants."""
    updates = [json.loads(line) for line in (ckpt / "updates.jsonl").read_text().splitlines()]
    steps = [u["step"] for u in updates]
    assert steps == list(range(len(steps))), steps  # each step's update committed once, none skipped
    assert [u["version"] for u in updates] == list(range(1, len(updates) + 1))  # consecutive weight versions
    trained = [t for u in updates for t in u["trajectories"]]
    assert len(trained) == len(set(trained)), "a trajectory trained twice"
    for u in updates:  # each slot of the batch (its prompt: group = slot // GROUP) once per step
        slots = sorted(int(t.split("-")[1][1:]) for t in u["trajectories"])
        assert slots == list(range(BATCH)), u
        assert not u["missing"], u
    killed = next(u for u in updates if u["step"] == step)
    assert durable <= set(killed["trajectories"]), (durable, killed)  # trained, as they were: not run again
    rerun = [t for t in killed["trajectories"] if "-r" in t]
    assert not {t.split("-r")[0] for t in rerun} & durable, rerun  # none of the finished was regenerated
    job.refresh_from_db()
    cp = job.loop_state
    assert cp["prompts_drawn"] == (cp["step"] + 1) * (BATCH // GROUP)  # the task cursor
    assert job.status == "running"
    assert_invariants()


def test_a_driver_killed_mid_rollout_resumes_its_step_with_the_finished_trajectories(stack):
    from controlplane.models import Job

    stack.agent("train-x", pool="training", slots=1, time_factor=TIME_FACTOR)
    stack.agent("roll-x", slots=2, time_factor=TIME_FACTOR)
    for name in ("train-x", "roll-x"):
        registered(name)
    job = _job("once")
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 1, 120, "a first update")
    ckpt = _ckpt(stack, "train-x", job.name)
    assert ckpt is not None

    # the moment a trajectory of a step in flight has just become durable (the driver's last checkpoint,
    # sent every 2 s, is then very likely older than it), with others of the step still unfinished
    found = wait_for(lambda: _just_finished(ckpt), 90, "a step with some trajectories finished")
    pid = _driver_pid(stack.procs["agent-train-x"].pid, job.name)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    step, _ = found
    durable = _buffered(ckpt).get(step, set())  # what the trainer acknowledged before the driver died
    assert 0 < len(durable) < BATCH
    v = Job.objects.get(pk=job.pk).weight_version
    wait_for(lambda: _driver_pid(stack.procs["agent-train-x"].pid, job.name) not in (None, pid), 30, "a new driver")
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= max(v, step + 1), 120, "the step in flight trained")

    _assert_exactly_once(ckpt, job, step, durable)


def test_the_training_node_killed_mid_rollout_resumes_with_its_trainer_and_driver(stack):
    """The job's training node agent SIGKILLed (its trainer and rollout driver die with it) and started again on
    the same state directory: the trainer comes back from its checkpoint and step buffer, the driver from the
    loop's checkpoint, and the step goes on with the trajectories that were durable at the kill."""
    from controlplane.models import Job

    stack.agent("train-y", pool="training", slots=1, time_factor=TIME_FACTOR)
    stack.agent("roll-y", slots=2, time_factor=TIME_FACTOR)
    for name in ("train-y", "roll-y"):
        registered(name)
    job = _job("once-node")
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 1, 120, "a first update")
    ckpt = _ckpt(stack, "train-y", job.name)
    assert ckpt is not None
    step, _ = wait_for(lambda: _just_finished(ckpt), 90, "a step with some trajectories finished")
    stack.kill9("agent-train-y")
    durable = _buffered(ckpt).get(step, set())
    assert 0 < len(durable) < BATCH
    stack.agent("train-y", pool="training", slots=1, time_factor=TIME_FACTOR)
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= step + 1, 150, "the step in flight trained")
    _assert_exactly_once(ckpt, job, step, durable)


def test_the_whole_stack_killed_mid_rollout_resumes_with_the_finished_trajectories(stack):
    """The launcher's whole stack SIGKILLed at once (Redis, Daphne, the Celery worker with beat, every node
    agent with its workers, trainer and rollout driver) and started again on the same database and state
    directories, as a second `make demo` does: the step in flight goes on with the trajectories that were
    durable at the kill, none regenerated, none trained twice."""
    from controlplane.models import Job
    from tests.support.processes import wait_port

    stack.agent("train-z", pool="training", slots=1, time_factor=TIME_FACTOR)
    stack.agent("roll-z", slots=2, time_factor=TIME_FACTOR)
    for name in ("train-z", "roll-z"):
        registered(name)
    job = _job("once-stack")
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 1, 120, "a first update")
    ckpt = _ckpt(stack, "train-z", job.name)
    assert ckpt is not None
    step, _ = wait_for(lambda: _just_finished(ckpt), 90, "a step with some trajectories finished")
    argv = {name: list(stack.procs[name].args) for name in ("daphne", "celery")}
    for name in ("agent-train-z", "agent-roll-z", "celery", "daphne", "redis"):
        stack.kill9(name)
    durable = _buffered(ckpt).get(step, set())
    assert 0 < len(durable) < BATCH

    stack.start_redis()
    stack.start("daphne", argv["daphne"])
    ready_before = stack.log("celery").count("ready.")
    stack.start("celery", argv["celery"])
    wait_port(int(stack.base_url.rsplit(":", 1)[1]), proc=stack.procs["daphne"])
    wait_for(lambda: stack.log("celery").count("ready.") > ready_before, 60, "celery again")
    stack.agent("train-z", pool="training", slots=1, time_factor=TIME_FACTOR)
    stack.agent("roll-z", slots=2, time_factor=TIME_FACTOR)
    wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= step + 1, 150, "the step in flight trained")
    _assert_exactly_once(ckpt, job, step, durable)
