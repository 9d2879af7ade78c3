"""The readers of a node's lease use the effective one (issue 22): a heartbeat that changes nothing renews the
lease in Redis only, so the row's `last_heartbeat` and `lease_expires` are coarse; /metrics, the REST API (and
`pearl nodes`' cluster endpoint) and the elastic capacity driver read the Redis renewal, and fall back to the row
when Redis is down."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from controlplane.core.agent_link import Heartbeat, ObservedWorker
from controlplane.core.state import Activity, Role
from controlplane.models import Node
from controlplane.selectors import leases as lease_reads
from controlplane.services import heartbeat, leases
from controlplane.services.availability import set_elastic_capacity
from tests.support.cluster import make_node
from tests.support.environment import fresh_leases

pytestmark = pytest.mark.django_db(transaction=True)

STALE_S = 50.0  # how old the row's coarse last-seen is made to look (below the coarse lease's reach)


@pytest.fixture(autouse=True)
def _redis() -> None:
    fresh_leases()


@pytest.fixture
def redis_down(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The selectors' Redis is a port nothing listens on (the real client, refused connections), made as the
    product makes its client (`from_url`: no connection retries; the constructor's default retries ten times
    with backoff, 3.7 s a call, which only made these tests slow)."""
    dead = redis.Redis.from_url("redis://127.0.0.1:1/2", socket_timeout=0.2, socket_connect_timeout=0.2)
    monkeypatch.setattr(lease_reads, "client", lambda: dead)
    monkeypatch.setattr(leases, "client", lambda: dead)
    yield


def beat(node: Node) -> Heartbeat:
    worker = ObservedWorker(worker_id=999_999, role=Role.DECODE, activity=Activity.ACTIVE, state="running", inflight=0)
    workers = [worker]
    return Heartbeat(epoch=node.epoch, generation=node.generation, workers=workers)


def renewed_in_redis_only(node: Node) -> Node:
    """Two heartbeats reporting the same: the first writes the row, the second renews the lease in Redis only.
    The row's last-seen is then set STALE_S back (what it looks like DB_REFRESH_S after its last write)."""
    node.refresh_from_db()
    heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=STALE_S))
    time.sleep(0.01)
    with CaptureQueriesContext(connection) as ctx:
        heartbeat.record_heartbeat(node_id=node.pk, message=beat(node))
    assert not [q for q in ctx.captured_queries if q["sql"].lstrip().upper().startswith(("UPDATE", "INSERT"))]
    node.refresh_from_db()
    assert node.last_heartbeat is not None and (timezone.now() - node.last_heartbeat).total_seconds() >= STALE_S
    return node


def count_redis_reads(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The node ids of each Redis read of last-seen (the real read still runs)."""
    calls: list[list[int]] = []
    real = lease_reads.last_seen

    def spy(ids: Iterable[int]) -> dict[int, datetime]:
        ids = list(ids)
        calls.append(ids)
        return real(ids)

    monkeypatch.setattr(lease_reads, "last_seen", spy)
    return calls


def heartbeat_ages(client: APIClient) -> dict[str, float]:
    r = client.get("/metrics")
    assert r.status_code == 200
    return {
        s.labels["node"]: s.value
        for family in text_string_to_metric_families(r.content.decode())
        for s in family.samples
        if s.name == "pearl_agent_heartbeat_age_seconds"
    }


def age(iso: str) -> float:
    when = parse_datetime(iso)
    assert isinstance(when, datetime)
    return (timezone.now() - when).total_seconds()


def test_metrics_show_the_age_of_the_redis_renewal_in_one_round_trip(api: APIClient, monkeypatch) -> None:
    renewed_in_redis_only(make_node("n1"))
    renewed_in_redis_only(make_node("n2"))
    calls = count_redis_reads(monkeypatch)
    ages = heartbeat_ages(api)
    assert set(ages) == {"n1", "n2"} and all(0 <= a < 5 for a in ages.values()), ages
    assert len(calls) == 1 and len(calls[0]) == 2  # one Redis round trip for every node


def test_metrics_fall_back_to_the_rows_last_seen_when_redis_is_down(api: APIClient, redis_down) -> None:
    n1 = make_node("n1")
    Node.objects.filter(pk=n1.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=STALE_S))
    assert STALE_S <= heartbeat_ages(api)["n1"] < STALE_S + 5


def test_the_api_gives_the_effective_last_heartbeat_in_lists_and_single_answers(api: APIClient) -> None:
    n1 = renewed_in_redis_only(make_node("n1"))
    renewed_in_redis_only(make_node("n2"))
    listed = api.get("/api/nodes/").json()["results"]
    assert {n["name"] for n in listed} == {"n1", "n2"}
    assert all(age(n["last_heartbeat"]) < 5 for n in listed), listed
    one = api.get(f"/api/nodes/{n1.pk}/").json()
    assert age(one["last_heartbeat"]) < 5
    drained = api.post(f"/api/nodes/{n1.pk}/drain/").json()  # a service's answer, serialized on its own
    assert age(drained["last_heartbeat"]) < 5
    (cluster_n1,) = [n for n in api.get("/api/cluster/").json()["nodes"] if n["name"] == "n1"]  # `pearl nodes`
    assert cluster_n1["heartbeat_age_s"] < 5 and age(cluster_n1["last_heartbeat"]) < 5


def test_the_api_reads_redis_once_per_page_not_per_node(api: APIClient, monkeypatch) -> None:
    for name in ("n1", "n2", "n3"):
        renewed_in_redis_only(make_node(name))
    calls = count_redis_reads(monkeypatch)
    assert len(api.get("/api/nodes/").json()["results"]) == 3
    assert len(calls) == 1 and sorted(calls[0]) == sorted(Node.objects.values_list("pk", flat=True))


def test_the_api_falls_back_to_the_rows_last_heartbeat_when_redis_is_down(api: APIClient, redis_down) -> None:
    n1 = make_node("n1")
    Node.objects.filter(pk=n1.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=STALE_S))
    (listed,) = api.get("/api/nodes/").json()["results"]
    assert STALE_S <= age(listed["last_heartbeat"]) < STALE_S + 5


def preempted(name: str) -> Node:
    """An elastic node under a preemption notice, its agent still heartbeating (in Redis only)."""
    node = make_node(name, pool="elastic", slots=4, hardware="H800")
    assert set_elastic_capacity(gpus=0, notice_s=300, actor="trace").preempted == (name,)
    return renewed_in_redis_only(node)


def test_availability_returns_a_node_whose_lease_is_renewed_in_redis_only() -> None:
    node = preempted("e1")
    up = set_elastic_capacity(gpus=4, notice_s=30, actor="trace")
    assert up.returned == ("e1",) and up.after_gpus == 4
    assert Node.objects.get(pk=node.pk).status == "ready"


def test_availability_does_not_return_a_node_whose_redis_lease_ran_out() -> None:
    node = preempted("e1")
    assert node.lease_expires is not None and node.lease_expires > timezone.now()  # the coarse row lease
    leases.client().zadd(leases.LEASES, {str(node.pk): time.time() - 1})  # the agent stopped renewing
    up = set_elastic_capacity(gpus=4, notice_s=30, actor="trace")
    assert up.returned == () and up.after_gpus == 0
    assert Node.objects.get(pk=node.pk).status == "draining"


def test_availability_falls_back_to_the_rows_lease_when_redis_is_down(redis_down) -> None:
    node = make_node("e1", pool="elastic", slots=4, hardware="H800")
    assert set_elastic_capacity(gpus=0, notice_s=300, actor="trace").preempted == ("e1",)
    Node.objects.filter(pk=node.pk).update(lease_expires=timezone.now() + timedelta(seconds=30))
    assert set_elastic_capacity(gpus=4, notice_s=30, actor="trace").returned == ("e1",)
