"""Leases renewed in Redis (issue 22): a heartbeat that changes nothing writes no row and opens no
transaction; a changed report still writes; expiry still fences; the sweep reads only expired nodes; a
real Redis restart (a private redis-server) or Redis down makes no node look lost."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from controlplane.core.agent_link import Heartbeat, ObservedWorker
from controlplane.core.state import Activity, Role
from controlplane.models import Node, Worker
from controlplane.services import expiry, heartbeat, leases
from controlplane.services.errors import StaleEpoch
from tests.support.cluster import make_job, make_node
from tests.support.environment import redis_available
from tests.support.processes import free_port, wait_port

pytestmark = pytest.mark.django_db(transaction=True)

WRITES = ("INSERT", "UPDATE", "DELETE")
TRANSACTION = ("BEGIN", "SAVEPOINT", "COMMIT", "RELEASE SAVEPOINT")


@pytest.fixture(autouse=True)
def _redis() -> None:
    if not redis_available():
        pytest.skip("Redis is not reachable")
    r = leases.client()
    r.delete(leases.LEASES, leases.HOLDERS, leases.BOOT, leases.BACKLOG)


def statements(ctx: CaptureQueriesContext) -> list[str]:
    return [q["sql"].lstrip().upper() for q in ctx.captured_queries]


def writes(ctx: CaptureQueriesContext) -> list[str]:
    return [s for s in statements(ctx) if s.startswith(WRITES)]


def transactions(ctx: CaptureQueriesContext) -> list[str]:
    return [s for s in statements(ctx) if s.startswith(TRANSACTION)]


def beat(node: Node, *, generation: int | None = None, inflight: int = 0) -> Heartbeat:
    workers = [
        ObservedWorker(
            worker_id=999_999, role=Role.DECODE, activity=Activity.ACTIVE, state="running", inflight=inflight
        )
    ]
    applied = node.generation if generation is None else generation
    return Heartbeat(epoch=node.epoch, generation=applied, workers=workers)


def test_a_heartbeat_that_changes_nothing_writes_no_row_and_opens_no_transaction() -> None:
    node = make_node("n1")
    first = heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))  # a new report: the row is written
    assert first.refused == [] and Node.objects.get(pk=node.pk).applied_generation == node.generation
    before = leases.client().zscore(leases.LEASES, str(node.pk))
    time.sleep(0.01)
    with CaptureQueriesContext(connection) as ctx:
        again = heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    assert again.generation == node.generation and again.refused == []
    assert writes(ctx) == [] and transactions(ctx) == [], statements(ctx)
    assert len(ctx.captured_queries) == 1  # one read: the row (fencing: channel, epoch)
    after = leases.client().zscore(leases.LEASES, str(node.pk))
    assert after is not None and before is not None and after > before  # the lease was renewed, in Redis


def test_a_changed_report_still_writes_the_row() -> None:
    node = make_node("n1")
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    with CaptureQueriesContext(connection) as ctx:
        heartbeat.record_heartbeat(node_id=node.pk, message=beat(node, inflight=3))
    assert any(s.startswith("UPDATE") for s in writes(ctx))
    assert Node.objects.get(pk=node.pk).observed[0]["inflight"] == 3
    with CaptureQueriesContext(connection) as ctx:  # and that report, repeated, is free again
        heartbeat.record_heartbeat(node_id=node.pk, message=beat(node, inflight=3))
    assert writes(ctx) == []


def test_a_changed_report_writes_its_workers_in_one_statement_however_many() -> None:
    """A heartbeat's changed workers are one UPDATE (was one per worker: 8 of a changed 8-worker heartbeat's
    15 queries), so its cost does not grow with the node's GPUs."""
    from controlplane.services import workers

    node = make_node("n1", slots=4)
    job = make_job(rollout_gpus=4)
    ids = [
        workers.start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[i], role="colocated", activity="active").pk
        for i in range(4)
    ]
    node.refresh_from_db()

    def report(busy: int) -> Heartbeat:
        running = [
            ObservedWorker(
                worker_id=w, role=Role.COLOCATED, activity=Activity.ACTIVE, state="running", inflight=int(k < busy)
            )
            for k, w in enumerate(ids)
        ]
        return Heartbeat(epoch=node.epoch, generation=node.generation, workers=running)

    counts = []
    for busy in (0, 1, 4):  # then one worker changes, then three
        with CaptureQueriesContext(connection) as ctx:
            heartbeat.record_heartbeat(node_id=node.pk, message=report(busy))
        counts.append(len(ctx.captured_queries))
        updates = [s for s in writes(ctx) if s.startswith('UPDATE "CONTROLPLANE_WORKER"')]
        assert len(updates) == (busy > 0), statements(ctx)
    assert counts[1] == counts[2], counts
    assert sorted(Worker.objects.filter(pk__in=ids).values_list("inflight", flat=True)) == [1, 1, 1, 1]


def test_an_in_flight_count_that_moves_while_busy_writes_nothing_and_going_idle_does() -> None:
    """A serving worker's count moves on almost every beat: only its idleness is a change (what drivers
    route by and the executor's drained checks read); the stored count is the last written report's."""
    node = make_node("n1")
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node, inflight=3))
    for count in (5, 1, 7):
        with CaptureQueriesContext(connection) as ctx:
            heartbeat.record_heartbeat(node_id=node.pk, message=beat(node, inflight=count))
        assert writes(ctx) == [] and transactions(ctx) == [], (count, statements(ctx))
    assert Node.objects.get(pk=node.pk).observed[0]["inflight"] == 3
    with CaptureQueriesContext(connection) as ctx:
        heartbeat.record_heartbeat(node_id=node.pk, message=beat(node, inflight=0))
    assert any(s.startswith("UPDATE") for s in writes(ctx))
    assert Node.objects.get(pk=node.pk).observed[0]["inflight"] == 0
    with CaptureQueriesContext(connection) as ctx:  # busy again: a change too
        heartbeat.record_heartbeat(node_id=node.pk, message=beat(node, inflight=2))
    assert Node.objects.get(pk=node.pk).observed[0]["inflight"] == 2


def test_a_changed_report_commits_without_waiting_for_the_wal_flush_and_a_registration_waits() -> None:
    """`heartbeat.relaxed_commit`: the heartbeat's transaction only (SET LOCAL); the session's setting, and so a
    registration's (a new epoch: fencing), stays the synchronous commit."""
    if connection.vendor != "postgresql":
        pytest.skip("synchronous_commit is PostgreSQL's")
    with CaptureQueriesContext(connection) as ctx:
        node = make_node("n1")
    assert not any("SYNCHRONOUS_COMMIT" in q for q in statements(ctx))
    with CaptureQueriesContext(connection) as ctx:
        heartbeat.record_heartbeat(node_id=node.pk, message=beat(node, inflight=1))
    assert "SET LOCAL SYNCHRONOUS_COMMIT TO OFF" in statements(ctx)
    assert Node.objects.get(pk=node.pk).observed[0]["inflight"] == 1  # committed all the same
    with connection.cursor() as c:
        c.execute("SHOW synchronous_commit")
        assert c.fetchone()[0] == "on"


def test_the_row_gets_a_coarse_last_seen_at_most_once_per_refresh_span(settings) -> None:
    settings.PEARL = {**settings.PEARL, "LEASE_DB_REFRESH_S": 0.0}  # the row lease is always under one lease
    node = make_node("n1")
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    seen = Node.objects.get(pk=node.pk).last_heartbeat
    with CaptureQueriesContext(connection) as ctx:
        heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    assert [s.split()[0] for s in writes(ctx)] == ["UPDATE"] and transactions(ctx) == []
    last = Node.objects.get(pk=node.pk).last_heartbeat
    assert last is not None and seen is not None and last > seen
    with CaptureQueriesContext(connection) as ctx:  # the record follows the row: the next beat is fast again
        heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    assert len(writes(ctx)) == 1 and transactions(ctx) == []


def test_a_heartbeat_that_waited_for_the_row_lock_renews_from_when_it_got_it(settings) -> None:
    """A changed report waits for its node's row while a transition's executor holds it: its lease runs from
    when it took the row (and Redis' from its commit), not from when it began, or it would renew into a time
    already past and the next sweep would fence a node that is heartbeating (the vLLM job's two rollout
    nodes were fenced so in CI, at a role change on a loaded machine)."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's (SQLite's writes are serialized whole)")
    settings.PEARL = {**settings.PEARL, "LEASE_S": 1.0}
    node = make_node("n1")
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    held, hold_s = threading.Event(), 1.5

    def executor() -> None:  # another connection holds the node's row lock for longer than one lease
        try:
            with transaction.atomic():
                list(Node.objects.select_for_update().filter(pk=node.pk))
                held.set()
                time.sleep(hold_s)
        finally:
            connections.close_all()

    holder = threading.Thread(target=executor)
    holder.start()
    assert held.wait(10)
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node, inflight=2))  # a new report: the locked path
    released = time.time()
    holder.join()
    redis_lease = leases.client().zscore(leases.LEASES, str(node.pk))
    assert redis_lease is not None and redis_lease > released + 0.5, (redis_lease, released)
    assert expiry.expire_leases() == []
    assert Node.objects.get(pk=node.pk).status == "ready"


def test_expiry_decided_by_redis_still_fences() -> None:
    node = make_node("n1")
    for _ in range(3):
        heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    row = Node.objects.get(pk=node.pk)
    lease = leases.lease_s()
    assert row.lease_expires is not None
    assert (row.lease_expires - timezone.now()).total_seconds() > lease * 2  # the row's lease is coarse
    assert expiry.expire_leases(now=timezone.now() + timedelta(seconds=lease / 2)) == []
    assert expiry.expire_leases(now=timezone.now() + timedelta(seconds=lease + 1)) == ["n1"]
    lost = Node.objects.get(pk=node.pk)
    assert lost.status == "not_ready" and lost.epoch == node.epoch + 1
    assert leases.client().zscore(leases.LEASES, str(node.pk)) is None  # the new epoch has no Redis renewal
    with pytest.raises(StaleEpoch):
        heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    back = heartbeat.record_heartbeat(node_id=node.pk, message=beat(lost))  # the current epoch recovers the node
    assert back.refused == [] and Node.objects.get(pk=node.pk).status == "ready"


def test_a_row_written_behind_redis_wins() -> None:
    """An operator (or a test) that sets the row's lease decides: Redis' record extends another lease."""
    node = make_node("n1")
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    Node.objects.filter(pk=node.pk).update(lease_expires=timezone.now() - timedelta(seconds=1))
    assert expiry.expire_leases() == ["n1"]


def test_the_sweep_reads_only_the_expired_nodes() -> None:
    made = [make_node(f"n{i}") for i in range(12)]
    for n in made:
        heartbeat.record_heartbeat(node_id=n.pk, message=beat(n))
    leases.client().zadd(leases.LEASES, {str(made[0].pk): time.time() - 1})  # n0's renewals stopped
    with CaptureQueriesContext(connection) as ctx:
        assert expiry.expire_leases() == ["n0"]
    node_reads = [
        s
        for s in statements(ctx)
        if s.startswith("SELECT") and 'FROM "CONTROLPLANE_NODE"' in s and '"CONTROLPLANE_NODE"."ID" = ' in s
    ]
    assert len(node_reads) == 1, statements(ctx)  # n0's locked row: the 11 live nodes were not read one by one


class PrivateRedis:
    """A redis-server of this test's own, on a free port, that the test can restart (empty)."""

    def __init__(self, tmp: Path) -> None:
        self.port, self.tmp = free_port(), tmp
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, proc=self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def private_redis(tmp_path: Path, settings) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path)
    server.start()
    settings.REDIS_URL = f"redis://127.0.0.1:{server.port}"  # the leases follow; the channel layer stays
    try:
        yield server
    finally:
        server.stop()


def _until_reachable() -> None:
    for _ in range(50):
        try:
            leases.client().ping()
            return
        except redis.RedisError:
            time.sleep(0.1)


def test_a_redis_restart_makes_no_node_look_lost(private_redis: PrivateRedis) -> None:
    made = [make_node(f"n{i}") for i in range(3)]
    for n in made:
        heartbeat.record_heartbeat(node_id=n.pk, message=beat(n))
        heartbeat.record_heartbeat(node_id=n.pk, message=beat(n))
    assert expiry.expire_leases() == []  # the sweeper stamps this Redis' generation
    private_redis.stop()
    private_redis.start()  # empty: every renewal and record is gone
    _until_reachable()
    later = timezone.now() + timedelta(seconds=leases.lease_s() + 1)  # past every Redis renewal it had
    assert expiry.expire_leases(now=later) == []  # the rows' coarse leases hold
    assert leases.client().get(leases.BOOT) is not None  # the empty Redis was noticed: a new generation
    assert set(Node.objects.values_list("status", flat=True)) == {"ready"}
    n = made[0]
    heartbeat.record_heartbeat(node_id=n.pk, message=beat(n))  # no record: the database path, once
    with CaptureQueriesContext(connection) as ctx:
        heartbeat.record_heartbeat(node_id=n.pk, message=beat(n))
    assert writes(ctx) == [] and transactions(ctx) == []  # then Redis renews again
    # a node that never came back is still lost once its row lease runs out
    gone = timezone.now() + leases.longest_row_lease() + timedelta(seconds=1)
    assert sorted(expiry.expire_leases(now=gone)) == ["n0", "n1", "n2"]


def test_redis_down_the_database_renews_the_exact_lease(private_redis: PrivateRedis) -> None:
    node = make_node("n1")
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    private_redis.stop()
    t0 = timezone.now()
    with CaptureQueriesContext(connection) as ctx:
        assert heartbeat.record_heartbeat(node_id=node.pk, message=beat(node)).refused == []
    assert any(s.startswith("UPDATE") for s in writes(ctx))  # the old path: a row-locked transaction
    row = Node.objects.get(pk=node.pk)
    assert row.lease_expires is not None
    assert row.lease_expires <= t0 + timedelta(seconds=leases.lease_s() + 1)  # the exact lease, not the coarse
    assert expiry.expire_leases(now=timezone.now() + timedelta(seconds=1)) == []
    assert expiry.expire_leases(now=timezone.now() + timedelta(seconds=leases.lease_s() + 1)) == ["n1"]
