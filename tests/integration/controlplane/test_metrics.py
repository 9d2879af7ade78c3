"""/metrics through prometheus_client: the cluster gauges read from the database, the latency histograms
counting what this process handled (heartbeats, plans, transition steps, turns), the endpoint's
authentication, and prometheus_client's multiprocess mode summing another process's histograms."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from itertools import pairwise

import pytest
from channels.db import database_sync_to_async
from prometheus_client.parser import text_string_to_metric_families
from rest_framework.test import APIClient

from controlplane.core.agent_link import TelemetryBatch
from controlplane.core.telemetry import turn
from controlplane.models import TransitionStep
from controlplane.services import credentials, planner, telemetry
from controlplane.services.principals import job_principal
from controlplane.services.workers import start_worker
from pearl_site.asgi import application
from tests.support.cluster import agents_converge, make_job, make_node, run_transition
from tests.support.environment import ROOT, child_env, redis_available
from tests.support.sockets import WebsocketCommunicator


def scrape(client: APIClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, parsed as Prometheus parses it: (sample name, sorted labels) -> value."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r["Content-Type"].startswith("text/plain; version=0.0.4")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.content.decode())
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def grew(before: dict, after: dict, name: str, **labels: str) -> float:
    """How much a sample grew between two scrapes (histograms are process-wide: tests see deltas)."""
    return value(after, name, **labels) - value(before, name, **labels)


def counted(samples: dict, histogram: str) -> float:
    """Observations of a histogram, over all its label values."""
    return sum(v for (name, _), v in samples.items() if name == f"{histogram}_count")


@pytest.mark.django_db
def test_the_cluster_gauges_parse_with_their_names_and_labels(api):
    n = make_node("n1", slots=2)
    job = make_job()
    start_worker(job_id=job.pk, node_id=n.pk, gpu_indexes=[0], role="colocated", activity="active")
    samples = scrape(api)
    assert value(samples, "pearl_nodes", status="ready") == 1 and value(samples, "pearl_nodes", status="gone") == 0
    assert value(samples, "pearl_gpus", role="colocated", activity="active") == 1
    assert value(samples, "pearl_gpus", role="none", activity="idle") == 1
    assert value(samples, "pearl_gpus_active", role="colocated") == 1
    assert value(samples, "pearl_workers", role="colocated") == 1
    assert value(samples, "pearl_jobs", status=job.status) == 1
    assert ("pearl_transitions", (("status", "pending"),)) in samples
    assert 0 <= value(samples, "pearl_agent_heartbeat_age_seconds", node="n1", pool="reserved") < 60
    families = {f.name: f.type for f in text_string_to_metric_families(api.get("/metrics").content.decode())}
    assert {
        n: families.get(n)
        for n in (
            "pearl_heartbeat_handling_seconds",
            "pearl_plan_seconds",
            "pearl_transition_step_seconds",
            "pearl_turn_seconds",
        )
    } == {
        "pearl_heartbeat_handling_seconds": "histogram",
        "pearl_plan_seconds": "histogram",
        "pearl_transition_step_seconds": "histogram",
        "pearl_turn_seconds": "histogram",
    }


@pytest.mark.django_db
def test_metrics_need_a_login_or_an_api_token():
    r = APIClient().get("/metrics")
    assert r.status_code in (401, 403) and b"pearl_nodes" not in r.content


@pytest.mark.django_db
def test_plans_and_transition_steps_are_counted(api):
    make_node("n1", slots=2)
    job = make_job(rollout_gpus=2)
    before = scrape(api)
    transition = planner.plan_job(job_id=job.pk, signal="step_start")
    assert transition is not None
    agents_converge()
    assert run_transition(transition).status == "succeeded"
    after = scrape(api)
    assert grew(before, after, "pearl_plan_seconds_count", signal="step_start") == 1
    assert grew(before, after, "pearl_plan_seconds_sum", signal="step_start") > 0
    done = TransitionStep.objects.filter(transition=transition, status="done", started__isnull=False)
    assert done.count() >= 2  # two workers started, then the finalisation
    steps = "pearl_transition_step_seconds"
    assert counted(after, steps) - counted(before, steps) == done.count()
    starts = done.filter(kind="start_worker").count()
    assert grew(before, after, "pearl_transition_step_seconds_count", kind="start_worker") == starts == 2


@pytest.mark.django_db
def test_turns_reported_by_the_driver_are_counted_with_their_duration(api):
    make_node("n1", slots=1)
    job = make_job("j")
    before = scrape(api)
    records = [
        turn(job="j", step=0, trajectory="s0-t0", turn=i, duration_s=d).to_json() for i, d in enumerate((1.5, 2.0))
    ]
    # no duration (a vLLM engine's per-request record): not a turn time
    records.append(turn(job="j", step=0, trajectory="s0-t1", turn=0).to_json())
    assert telemetry.ingest(principal=job_principal(job), message=TelemetryBatch(epoch=1, records=records)) == 3
    after = scrape(api)
    assert grew(before, after, "pearl_turn_seconds_count") == 2
    assert grew(before, after, "pearl_turn_seconds_sum") == pytest.approx(3.5)
    assert grew(before, after, "pearl_turn_seconds_bucket", le="1.0") == 0
    assert grew(before, after, "pearl_turn_seconds_bucket", le="2.5") == 2


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not redis_available(), reason="Redis is not reachable")
async def test_heartbeats_on_the_agent_link_are_counted(api):
    token = await database_sync_to_async(credentials.issue_agent_token)(node_name="hb1")
    ws = WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())]
    )
    ws.scope["client"] = ("127.0.0.1", 50000)
    assert (await ws.connect())[0]
    await ws.send_json_to(
        {
            "type": "register",
            "node": "hb1",
            "pool": "reserved",
            "hardware": "cpu",
            "incarnation": "i1",
            "slots": [{"index": 0, "hardware": "cpu", "memory_mb": 1024}],
        }
    )
    reg = await ws.receive_json_from(timeout=5)
    assert reg["type"] == "registered"
    before = await database_sync_to_async(scrape)(api)
    await ws.send_json_to({"type": "heartbeat", "epoch": reg["epoch"], "generation": 0, "workers": []})
    await ws.send_json_to({"type": "heartbeat", "epoch": reg["epoch"] - 1, "generation": 0, "workers": []})
    while (await ws.receive_json_from(timeout=5))["type"] != "error":  # the stale one is refused: both handled
        pass
    after = await database_sync_to_async(scrape)(api)
    await ws.disconnect()
    assert grew(before, after, "pearl_heartbeat_handling_seconds_count") == 2


MULTIPROCESS_OBSERVER = textwrap.dedent(
    """
    from controlplane.services import latency
    for seconds in (0.2, 0.3):
        latency.PLAN_SECONDS.labels(signal="periodic").observe(seconds)
    latency.TRANSITION_STEP_SECONDS.labels(kind="start_worker").observe(4.0)
    """
)


@pytest.mark.django_db
def test_multiprocess_mode_serves_the_histograms_of_every_process_of_the_host(api, tmp_path, monkeypatch):
    """A Celery worker observed plans and a step in its own memory-mapped files: /metrics sums them."""
    env = child_env() | {"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    subprocess.run([sys.executable, "-c", MULTIPROCESS_OBSERVER], cwd=ROOT, env=env, check=True, timeout=60)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    make_node("n1", slots=1)
    samples = scrape(api)
    assert value(samples, "pearl_plan_seconds_count", signal="periodic") == 2
    assert value(samples, "pearl_plan_seconds_sum", signal="periodic") == pytest.approx(0.5)
    assert value(samples, "pearl_transition_step_seconds_count", kind="start_worker") == 1
    assert value(samples, "pearl_nodes", status="ready") == 1  # the gauges still come from the database


def test_the_loop_reports_each_turn_with_its_duration_generation_and_environment():
    """The driver's TURN records (what pearl_turn_seconds counts) carry the turn's time: from its prompt
    being ready (the trajectory's start, or the previous turn's environment step) to its own environment
    step's end."""
    from controlplane.core import loop as lp
    from controlplane.core.state import Role
    from controlplane.core.telemetry import RecordKind
    from tests.unit.core.loop_world import ToyWorld, run_heap

    world = ToyWorld({0: Role.COLOCATED})
    config = lp.LoopConfig(batch_size=2, group_size=2, max_staleness=1, return_deadline_s=2.0)
    _, cmds = run_heap(world, config, [], until=30.0)
    turns = [c.record for _, c in cmds if type(c) is lp.Telemetry and c.record.kind is RecordKind.TURN]
    assert len(turns) >= 4 and all(r.duration_s > 0 for r in turns)
    later = 0
    by_trajectory: dict[str, list] = {}
    for r in turns:
        by_trajectory.setdefault(r.trajectory, []).append(r)
    for rs in by_trajectory.values():
        for previous, r in pairwise(rs):
            assert r.duration_s == pytest.approx(r.time_s - previous.time_s, abs=1e-3)
            later += 1
    assert later >= 2
