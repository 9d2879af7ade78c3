"""Helpers every write use case shares: row locks and the invariant check.

Lock order. Every transaction that locks or writes more than one of these rows takes them in the order
job → node → worker (jobs by id, nodes by id): the hierarchy of the state model (a job's workers sit on
nodes; a worker's GPUs are its node's). A transaction that took a worker row and then waited for its
node, while a heartbeat held the node and waited for the worker, was a deadlock that PostgreSQL broke by
aborting one of them: a lost heartbeat or a stopped executor. `lock_nodes` is how a use case that
changes workers takes their nodes first. What is left (a cycle through rows outside this order) is
retried by the entry points (`retry_transient`).
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable, TypeVar

from django.db import DatabaseError, connection, transaction
from django.db.models import Model, QuerySet

from controlplane.core.invariants import check_invariants
from controlplane.models import Job, Node, WorkerGPU
from controlplane.selectors.cluster import training_flags, worker_views
from controlplane.services.errors import Conflict, InvariantViolation, NotFound

M = TypeVar("M", bound=Model)
R = TypeVar("R")

log = logging.getLogger(__name__)


def locked(qs: QuerySet[M]) -> QuerySet[M]:
    """SELECT ... FOR NO KEY UPDATE OF the queryset's own rows on PostgreSQL. Rows joined by select_related
    stay unlocked: each use case takes them itself, in the lock order. NO KEY: no use case changes a key,
    and a row inserted elsewhere that refers to a locked one (an event of a locked job, a telemetry sample
    of a locked node) takes only a key-share lock, which this one does not block; FOR UPDATE would make
    every such insert a hidden lock on the job or node, out of the lock order. SQLite serialises writers
    with IMMEDIATE transactions."""
    return qs.select_for_update(of=("self",), no_key=True)


def lock_job(job_id: int, *, field: str = "id", live: str = "") -> Job:
    """The job row, locked for this transaction. 404 if it does not exist; with `live` (what the caller
    is about to do), 409 if the job already ended."""
    job = locked(Job.objects.filter(pk=job_id)).first()
    if job is None:
        raise NotFound(f"job {job_id} does not exist", field=field)
    if live and job.status in (Job.Status.STOPPED, Job.Status.FAILED):
        raise Conflict(f"job {job.name} is already {job.status}; {live}", field="status")
    return job


def lock_nodes(node_ids: Iterable[int]) -> dict[int, Node]:
    """These nodes' rows, locked in id order (the lock order above), by id."""
    ids = sorted({int(i) for i in node_ids})
    return {n.pk: n for n in locked(Node.objects.filter(pk__in=ids)).order_by("pk")} if ids else {}


# PostgreSQL's deadlock_detected and serialization_failure: the transaction was rolled back as a whole
# and may simply run again (PostgreSQL manual, 13.2 and 13.3.4).
TRANSIENT_SQLSTATES = frozenset({"40P01", "40001"})


def is_transient(exc: BaseException) -> bool:
    """A database error that rolled its transaction back and that a retry of the whole use case may pass."""
    cause = exc.__cause__ or exc.__context__
    return isinstance(exc, DatabaseError) and getattr(cause, "sqlstate", None) in TRANSIENT_SQLSTATES


def retry_transient(fn: Callable[..., R], *args: Any, attempts: int = 4, **kwargs: Any) -> R:
    """Run a use case, running it again when the database aborted it as a deadlock victim or for a
    serialization failure. Only at an entry point (a socket message, a task): inside a caller's
    transaction nothing can be retried, and the error goes up to where it can."""
    for attempt in range(1, attempts + 1):
        try:
            return fn(*args, **kwargs)
        except DatabaseError as exc:
            if attempt == attempts or connection.in_atomic_block or not is_transient(exc):
                raise
            log.warning("%s: %s; retrying (%d of %d)", getattr(fn, "__name__", fn), str(exc).splitlines()[0], attempt, attempts - 1)
            time.sleep(0.01 * 2 ** attempt)
    raise AssertionError("unreachable")


def assert_invariants(*, job_ids: Iterable[int] = (), gpu_ids: Iterable[int] = ()) -> None:
    """Check DESIGN §4 over every alive worker touching these jobs or GPUs; raise 409 if violated."""
    job_ids = list(job_ids)
    # Other jobs' workers on the same GPUs count too: widen to every GPU the jobs hold.
    gpu_ids = set(gpu_ids) | set(WorkerGPU.objects.filter(alive=True, worker__job_id__in=job_ids).values_list("gpu_id", flat=True))
    views = worker_views(job_ids=job_ids, gpu_ids=gpu_ids)
    problems = check_invariants(views, training_flags({v.job for v in views} | set(job_ids)))
    if problems:
        raise InvariantViolation("; ".join(problems))


SIGNAL_PRIORITY = ("training_begin", "training_finished", "step_start", "capacity_change", "periodic")


def enqueue_plan(job_id: int, signal: str) -> None:
    """Ask a Celery worker to re-plan the job once this transaction commits (ids, never objects).

    Single flight per job: the signal joins the job's queue in Redis and a plan task is sent only if
    none is queued or running; that task plans once for every signal queued meanwhile (one plan sees
    the current state anyway; the decision records the weightiest signal). No signal is dropped."""
    transaction.on_commit(lambda: _enqueue_now(job_id, signal), robust=True)


def _redis() -> "Any":
    import redis
    from django.conf import settings

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)


def _enqueue_now(job_id: int, signal: str) -> None:
    from controlplane import tasks

    r = _redis()
    r.rpush(f"pearl:plan:{job_id}", signal)
    r.expire(f"pearl:plan:{job_id}", 3600)
    if r.set(f"pearl:plan:{job_id}:queued", "1", nx=True, ex=300):
        tasks.plan_job.delay(job_id)


def _observed_key(job_id: int) -> str:
    return f"pearl:observed:{job_id}"


def kick_executor_on_commit(job_ids: Iterable[int]) -> None:
    """An agent reported a change to these jobs' workers: wake the executor waiting on them at once
    (`wait_for_report`) instead of at its next poll. At most one kick is kept per job."""
    ids = sorted({int(j) for j in job_ids})

    def kick() -> None:
        pipe = _redis().pipeline()
        for j in ids:
            pipe.rpush(_observed_key(j), "1")
            pipe.ltrim(_observed_key(j), -1, -1)
            pipe.expire(_observed_key(j), 60)
        pipe.execute()

    if ids:
        transaction.on_commit(kick, robust=True)


def wait_for_report(job_id: int, timeout_s: float) -> bool:
    """Block until an agent reports a change to the job's workers or `timeout_s` passes."""
    return _redis().blpop([_observed_key(job_id)], timeout=timeout_s) is not None


def replan_live_jobs(signal: str, *, node_id: int | None = None) -> None:
    """A capacity change: re-plan every live job (or, with `node_id`, those with a worker there)."""
    from controlplane.models import Worker

    jobs = Job.objects.filter(status__in=[Job.Status.PENDING, Job.Status.RUNNING])
    if node_id is not None:
        jobs = jobs.filter(pk__in=Worker.objects.filter(node_id=node_id).values("job_id"))
    for job_id in jobs.values_list("id", flat=True):
        enqueue_plan(job_id, signal)


def defer_plan(job_id: int, signal: str) -> None:
    """The job has a transition in flight: keep the signal until it ends (`resume_deferred_plans`)."""
    r = _redis()
    r.rpush(f"pearl:plan:{job_id}:deferred", signal)
    r.expire(f"pearl:plan:{job_id}:deferred", 3600)


def _take_all(r: Any, key: str) -> set[str]:
    """Every distinct signal in a Redis list, taking the list (read and delete in one transaction)."""
    pipe = r.pipeline()
    pipe.lrange(key, 0, -1)
    pipe.delete(key)
    raw, _ = pipe.execute()
    return {x.decode() for x in raw}


def resume_deferred_plans(job_id: int) -> None:
    """A transition of the job ended: the signals that came meanwhile are planned now (after commit)."""
    def resume() -> None:
        for signal in _take_all(_redis(), f"pearl:plan:{job_id}:deferred"):
            _enqueue_now(job_id, signal)

    transaction.on_commit(resume, robust=True)


def take_plan_signals(job_id: int) -> str | None:
    """The weightiest signal queued for the job (all of them are taken), or None: then the job's plan
    task is no longer queued (a signal arriving right after sends a new one)."""
    r = _redis()
    key = f"pearl:plan:{job_id}"
    signals = _take_all(r, key)
    if not signals:
        r.delete(f"{key}:queued")
        if r.llen(key) and r.set(f"{key}:queued", "1", nx=True, ex=300):
            return take_plan_signals(job_id)  # one arrived between the two calls: this task takes it
        return None
    return min(signals, key=lambda s: SIGNAL_PRIORITY.index(s) if s in SIGNAL_PRIORITY else len(SIGNAL_PRIORITY))
