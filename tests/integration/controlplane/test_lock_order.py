"""Row locks on PostgreSQL: every use case takes job → node → worker in that order, so a heartbeat (which
holds its node and then writes its workers) and a transition (which changes workers and bumps their nodes)
never wait on each other in a cycle; and a deadlock victim that gets through anyway runs again.

Each order test holds one row in a transaction of its own, starts the real use case, waits until it is
blocked on that row, and then takes the rows the use case must not hold yet with NOWAIT. Before the lock
order was fixed, the use cases held their workers while waiting for the node: the NOWAIT failed here, and
in a live cluster PostgreSQL aborted one side (a lost heartbeat, or an executor task that stopped)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.db.models import F

from controlplane.core.agent_link import Heartbeat, ObservedWorker
from controlplane.models import Event, Job, Node, Worker
from controlplane.services import jobs, leases, planner
from controlplane.services.heartbeat import record_heartbeat
from controlplane.services.locks import lock_job, locked
from controlplane.services.retry import is_transient, retry_transient
from controlplane.services.workers import WorkerChange, change_workers, stop_worker
from tests.support.cluster import agents_converge, make_job, make_node, run_transition
from tests.support.environment import postgres_in_use

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def _postgres_only() -> None:
    if not postgres_in_use():
        pytest.skip("row locks need PostgreSQL (SQLite ignores SELECT ... FOR UPDATE)")


def _in_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
    def call() -> Any:
        try:
            return fn()
        finally:
            connections.close_all()

    return call


def _lock_waiters() -> int:
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return int(cur.fetchone()[0])


def hold_run_check(hold: Callable[[], object], run: Callable[[], Any], free: Callable[[], object]) -> Any:
    """`hold` locks a row in its own transaction; `run` (the use case) must come to wait for it; while it
    waits, `free` must get the rows it names at once (NOWAIT): the use case has not taken them yet."""
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with transaction.atomic():
            hold()
            held.set()
            assert release.wait(20)
            free()

    with ThreadPoolExecutor(2) as pool:
        h = pool.submit(_in_thread(holder))
        assert held.wait(10)
        s = pool.submit(_in_thread(run))
        deadline = time.monotonic() + 10
        while _lock_waiters() == 0 and not s.done():
            assert time.monotonic() < deadline, "the use case never waited for the held row"
            time.sleep(0.02)
        assert not s.done(), f"the use case did not wait for the held row: {s.result()!r}"
        release.set()
        h.result(timeout=20)
        return s.result(timeout=20)


def nowait(qs: Any) -> None:
    list(qs.select_for_update(nowait=True))


@pytest.fixture
def running_job() -> Job:
    """A job with two rollout workers on r1 and its trainer on t1, as the agents reported them."""
    make_node("r1", slots=2)
    make_node("t1", pool="training", slots=1)
    job = make_job(rollout_gpus=2, training_gpus=1)
    tr = planner.plan_job(job_id=job.pk, signal="step_start")
    assert run_transition(tr).status == "succeeded"
    agents_converge()
    job.refresh_from_db()
    return job


def _rollout(job: Job) -> Worker:
    worker = Worker.objects.filter(job=job, alive=True, node__name="r1").order_by("slot").first()
    assert worker is not None
    return worker


def _hold_node(name: str) -> Callable[[], object]:
    return lambda: locked(Node.objects.filter(name=name)).get()


def test_changing_a_worker_takes_its_node_first(running_job):
    w = _rollout(running_job)
    hold_run_check(
        _hold_node("r1"),
        lambda: change_workers(job_id=running_job.pk, changes=[WorkerChange(w.slot, activity="transitioning")]),
        lambda: nowait(Worker.objects.filter(pk=w.pk)),
    )
    w.refresh_from_db()
    assert w.activity == "transitioning"


def test_stopping_a_worker_takes_its_node_first(running_job):
    w = _rollout(running_job)
    hold_run_check(
        _hold_node("r1"),
        lambda: stop_worker(job_id=running_job.pk, slot=w.slot),
        lambda: nowait(Worker.objects.filter(pk=w.pk)),
    )
    w.refresh_from_db()
    assert not w.alive


def test_stopping_a_job_takes_its_nodes_first(running_job):
    hold_run_check(
        _hold_node("r1"),
        lambda: jobs.stop_job(job_id=running_job.pk, actor="test"),
        lambda: nowait(Worker.objects.filter(job=running_job)),
    )
    assert not Worker.objects.filter(job=running_job, alive=True).exists()


def test_training_begin_finish_and_update_take_the_trainers_node_first(running_job):
    trainer = Worker.objects.get(job=running_job, alive=True, role="training")
    jobs.set_training_active(job_id=running_job.pk, active=True, actor="test")
    agents_converge()  # the borrowed worker on t1 is reported back
    hold_run_check(
        _hold_node("t1"),
        lambda: jobs.start_update(job_id=running_job.pk, actor="test"),
        lambda: nowait(Worker.objects.filter(pk=trainer.pk)),
    )
    trainer.refresh_from_db()
    assert trainer.activity == "active"
    hold_run_check(
        _hold_node("t1"),
        lambda: jobs.set_training_active(job_id=running_job.pk, active=False, actor="test"),
        lambda: nowait(Worker.objects.filter(pk=trainer.pk)),
    )
    trainer.refresh_from_db()
    assert trainer.activity == "inactive"


def test_a_trainer_heartbeat_that_publishes_takes_the_job_before_its_node(running_job):
    """The deadlock CI met: a heartbeat held its node and waited for the job (to publish new weights),
    while a transition held the job and waited for that node (to bump its generation)."""
    t1 = Node.objects.get(name="t1")
    trainer = Worker.objects.get(job=running_job, alive=True, role="training")
    o = next(w for w in t1.observed if w["worker_id"] == trainer.pk)
    report = ObservedWorker(
        **{
            k: o[k] for k in ("worker_id", "role", "activity", "state", "endpoint", "inflight", "generation", "devices")
        },
        weight_version=running_job.weight_version + 1,
    )
    beat = Heartbeat(epoch=t1.epoch, generation=t1.generation, workers=[report])
    hold_run_check(
        lambda: lock_job(running_job.pk),
        lambda: record_heartbeat(node_id=t1.pk, message=beat, channel=t1.agent_channel),
        lambda: nowait(Node.objects.filter(pk=t1.pk)),
    )
    running_job.refresh_from_db()
    assert running_job.weight_version == report.weight_version


def test_a_heartbeat_that_publishes_nothing_takes_no_job_lock(running_job):
    """The everyday heartbeat stays as cheap as before: its node and its workers only."""
    t1 = Node.objects.get(name="t1")
    beat = Heartbeat(
        epoch=t1.epoch,
        generation=t1.generation,
        workers=[ObservedWorker(**{k: v for k, v in o.items()}) for o in t1.observed],
    )
    with ThreadPoolExecutor(1) as pool, transaction.atomic():
        lock_job(running_job.pk)
        beat_done = pool.submit(
            _in_thread(lambda: record_heartbeat(node_id=t1.pk, message=beat, channel=t1.agent_channel))
        )
        assert wait([beat_done], timeout=10).done, "the heartbeat waited for its job's lock"
    assert beat_done.result().refused == []
    renewed = Node.objects.get(pk=t1.pk)  # a report that changes nothing renews in Redis (services/leases.py)
    assert renewed.last_heartbeat is not None and t1.last_heartbeat is not None
    seen = max(renewed.last_heartbeat, leases.last_seen([t1.pk]).get(t1.pk, renewed.last_heartbeat))
    assert seen > t1.last_heartbeat


def test_events_of_a_locked_job_are_written_without_waiting_for_its_lock(running_job):
    """An event refers to its job: under FOR UPDATE its insert waited for the job's lock, so stopping a
    worker (its node, then the event) waited on the job while a transition held the job and waited on
    that node. Locks are FOR NO KEY UPDATE: the insert's key-share lock passes."""
    w = _rollout(running_job)
    with ThreadPoolExecutor(1) as pool, transaction.atomic():
        lock_job(running_job.pk)
        pool.submit(_in_thread(lambda: stop_worker(job_id=running_job.pk, slot=w.slot))).result(timeout=10)
    assert Event.objects.filter(kind="worker.stopped", job=running_job).exists()


def test_a_deadlock_victim_runs_again():
    """Two use cases lock two nodes in opposite orders: PostgreSQL aborts one; retry_transient runs it again."""
    a, b = make_node("a"), make_node("b")
    barrier = threading.Barrier(2)
    attempts: Counter[str] = Counter()
    errors: list[BaseException] = []

    def use_case(name: str, first: int, second: int) -> None:
        with transaction.atomic():
            attempts[name] += 1
            locked(Node.objects.filter(pk=first)).get()
            if attempts[name] == 1:
                barrier.wait(10)
            Node.objects.filter(pk=second).update(generation=F("generation") + 1)

    def raw(name: str, first: int, second: int) -> None:
        try:
            use_case(name, first, second)
        except OperationalError as exc:
            errors.append(exc)

    with ThreadPoolExecutor(2) as pool:  # without the retry: one side is the victim
        list(pool.map(lambda args: _in_thread(lambda: raw(*args))(), [("ab", a.pk, b.pk), ("ba", b.pk, a.pk)]))
    assert len(errors) == 1 and is_transient(errors[0]), errors

    attempts.clear()
    barrier.reset()
    before = dict(Node.objects.values_list("name", "generation"))
    with ThreadPoolExecutor(2) as pool:
        list(
            pool.map(
                lambda args: _in_thread(lambda: retry_transient(use_case, *args))(),
                [("ab", a.pk, b.pk), ("ba", b.pk, a.pk)],
            )
        )
    assert sorted(attempts.values()) == [1, 2]
    after = dict(Node.objects.values_list("name", "generation"))
    assert after == {"a": before["a"] + 1, "b": before["b"] + 1}


def test_inside_a_callers_transaction_a_deadlock_is_not_retried():
    """Its transaction is aborted as a whole: only the entry point can run the use case again."""
    calls = []

    def victim() -> None:
        calls.append(1)
        with connection.cursor() as cur:
            cur.execute("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40P01'; END $$")

    with pytest.raises(OperationalError) as err, transaction.atomic():
        retry_transient(victim)
    assert is_transient(err.value) and calls == [1]
    calls.clear()
    with pytest.raises(OperationalError):
        retry_transient(victim, attempts=3)  # at an entry point: run again, up to `attempts`
    assert calls == [1, 1, 1]


def test_an_api_request_that_loses_a_deadlock_gets_a_409_that_says_to_send_it_again():
    from controlplane.api.errors import exception_handler

    with pytest.raises(OperationalError) as err, connection.cursor() as cur:
        cur.execute("DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40P01'; END $$")
    response = exception_handler(err.value, {})
    assert response is not None and response.status_code == 409
    assert response.data["error"] == "conflict" and "send it again" in response.data["detail"]
