"""Hand-offs to the Celery workers: tasks are sent by name, so no service imports `controlplane.tasks`
(the adapters sit on top of the services, never below them), and the wake-ups of an executor task that
waits for its agents' reports.

`TaskName` is the one spelling of each task's name: `tasks.py` registers its tasks under these names and
the periodic schedule refers to them. Tasks take ids, never objects (JSON on the broker)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from functools import lru_cache
from typing import Any

import redis
from celery import current_app
from django.conf import settings
from django.db import transaction


class TaskName(StrEnum):
    SWEEP = "controlplane.sweep"
    ECHO = "controlplane.echo"
    PLAN_JOB = "controlplane.plan_job"
    EXECUTE_TRANSITION = "controlplane.execute_transition"
    REPLAN_ALL = "controlplane.replan_all"
    RUN_SIMULATION = "controlplane.run_simulation"
    TRAINED_STEP = "controlplane.trained_step"
    ARBITRATE = "controlplane.arbitrate"


def _send(name: TaskName, *args: Any, countdown: float | None = None) -> None:
    # current_app is the project's app: loading the settings (pearl_site.settings) runs pearl_site/__init__.py,
    # which creates it, in every process that has Django configured
    current_app.send_task(str(name), args=list(args), countdown=countdown)


def plan_job(job_id: int) -> None:
    """Send the job's plan task now (the plan queue's single flight decides when: `plan_queue`)."""
    _send(TaskName.PLAN_JOB, job_id)


def arbitrate() -> None:
    """Send the arbiter's task now (its single flight is the plan queue's: `plan_queue.enqueue_arbitration`)."""
    _send(TaskName.ARBITRATE)


def execute_transition(transition_id: int, owner: str = "", *, countdown: float | None = None) -> None:
    """Send a task that advances the transition (taking over from `owner`, whose lease it holds)."""
    _send(TaskName.EXECUTE_TRANSITION, transition_id, owner, countdown=countdown)


def execute_transition_on_commit(transition_id: int) -> None:
    """A transition was recorded: its executor starts once this transaction commits."""
    transaction.on_commit(lambda: execute_transition(transition_id), robust=True)


def run_simulation_on_commit(run_id: int) -> None:
    """A simulator comparison was recorded: a Celery worker runs it once this transaction commits."""
    transaction.on_commit(lambda: _send(TaskName.RUN_SIMULATION, run_id), robust=True)


def trained_step_on_commit(job_ids: Iterable[int]) -> None:
    """Trainer updates of these jobs were recorded: a Celery worker records their new checkpoints and logs the
    steps to their experiment trackers once this transaction commits (off the telemetry path: issue 36)."""
    ids = sorted(set(job_ids))

    def send() -> None:
        for j in ids:
            _send(TaskName.TRAINED_STEP, j)

    if ids:
        transaction.on_commit(send, robust=True)


def redis_client() -> redis.Redis:
    """The Redis that holds the plan queue and the executor wake-ups (nothing there is the only copy). One
    client (one connection pool) per URL and process: a heartbeat's wake-up reuses a connection instead of
    opening one."""
    return _client(settings.REDIS_URL)


@lru_cache(maxsize=4)
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2)


def _observed_key(job_id: int) -> str:
    return f"pearl:observed:{job_id}"


def kick_executor_on_commit(job_ids: Iterable[int]) -> None:
    """An agent reported a change to these jobs' workers: wake the executor waiting on them at once
    (`wait_for_report`) instead of at its next poll. At most one kick is kept per job."""
    ids = sorted({int(j) for j in job_ids})

    def kick() -> None:
        pipe = redis_client().pipeline()
        for j in ids:
            pipe.rpush(_observed_key(j), "1")
            pipe.ltrim(_observed_key(j), -1, -1)
            pipe.expire(_observed_key(j), 60)
        pipe.execute()

    if ids:
        transaction.on_commit(kick, robust=True)


def wait_for_report(job_id: int, timeout_s: float) -> bool:
    """Block until an agent reports a change to the job's workers or `timeout_s` passes."""
    return redis_client().blpop([_observed_key(job_id)], timeout=timeout_s) is not None
