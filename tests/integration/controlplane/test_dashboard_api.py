"""Endpoints and services behind the dashboard and the CLI: undrain/return, job status and per-step
series, history that survives pruning, exact-or-ratio overrides, simulator runs, the admin."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.core.agent_link import TelemetryBatch
from controlplane.core.telemetry import step, train, turn
from controlplane.models import Event, Node, Override, SimulationRun, TelemetrySample
from controlplane.services import draining, planner, simulations, telemetry
from controlplane.services.principals import job_principal
from tests.support.cluster import make_job, make_node

pytestmark = pytest.mark.django_db


def test_undrain_returns_draining_and_preempted_nodes(api):
    node = make_node("spot-a", pool="elastic", slots=2)
    r = api.post(f"/api/nodes/{node.pk}/undrain/")
    assert r.status_code == 409 and r.json()["field"] == "status"  # a ready node has nothing to return from
    api.post(f"/api/nodes/{node.pk}/drain/")
    r = api.post(f"/api/nodes/{node.pk}/undrain/")
    assert r.status_code == 200 and r.json()["status"] == "ready"
    api.post(f"/api/nodes/{node.pk}/preemption/", {"deadline_s": 60}, format="json")
    r = api.post(f"/api/nodes/{node.pk}/undrain/")
    assert r.status_code == 200 and r.json()["preemption_deadline"] is None  # the notice is cancelled
    # Past its deadline it is gone; if its agent still holds a lease it comes back, GPUs included.
    draining.preemption_notice(node_id=node.pk, deadline=timezone.now() + timedelta(seconds=1), actor="t")
    draining.remove_preempted(now=timezone.now() + timedelta(seconds=5))
    assert Node.objects.get(pk=node.pk).status == "gone"
    assert api.post(f"/api/nodes/{node.pk}/undrain/").json()["gpus"] == 2
    Node.objects.filter(pk=node.pk).update(status="draining", lease_expires=timezone.now() - timedelta(seconds=1))
    assert api.post(f"/api/nodes/{node.pk}/undrain/").json()["status"] == "not_ready"  # no lease: waits for a heartbeat
    assert Event.objects.filter(kind="node.returned", actor="op").count() == 4
    assert api.post("/api/nodes/abc/undrain/").json()["field"] == "id"


def test_undrain_needs_an_operator(viewer):
    from rest_framework.test import APIClient

    node = make_node("n1")
    draining.drain_node(node_id=node.pk, actor="t")
    client = APIClient()
    client.force_authenticate(viewer)
    assert client.post(f"/api/nodes/{node.pk}/undrain/").status_code == 403
    assert Node.objects.get(pk=node.pk).status == "draining"


def test_status_and_series(api):
    make_node("n1", slots=4)
    make_node("t1", pool="training", slots=1)
    job = make_job("j", rollout_gpus=4, training_gpus=1, batch_size=16, group_size=4)
    planner.plan_job(job_id=job.pk, signal="step_start")
    telemetry.ingest(
        principal=job_principal(job),
        message=TelemetryBatch(
            epoch=1,
            records=[
                step(
                    job="j",
                    step=1,
                    makespan_s=10.0,
                    predicted_makespan_s=9.0,
                    generated_tokens_total=900,
                    train_tokens=100,
                    reward_mean=0.2,
                    time_s=100.0,
                    mode="colocated",
                    n_colocated=4,
                ).to_json(),
                train(
                    job="j",
                    step=1,
                    duration_s=4.0,
                    return_latency_s=0.5,
                    return_deadline_s=30.0,
                    weight_version=1,
                    time_s=104.0,
                ).to_json(),
                step(
                    job="j",
                    step=2,
                    makespan_s=8.0,
                    predicted_makespan_s=8.5,
                    generated_tokens_total=1500,
                    train_tokens=500,
                    reward_mean=0.4,
                    time_s=120.0,
                    borrowed_gpu_s=12.0,
                ).to_json(),
            ],
        ),
    )
    st = api.get(f"/api/jobs/{job.pk}/status/").json()
    assert st["job"]["name"] == "j" and st["latest_decision"]["candidates"] and st["override_summary"] == ""
    assert st["latest_decision"]["label"] == st["job"]["configuration"]
    series = api.get(f"/api/jobs/{job.pk}/series/").json()
    s1, s2 = series["steps"]
    assert (s1["throughput_tok_s"], s2["throughput_tok_s"]) == (
        100.0,
        100.0,
    )  # 1000/10 s (first: its makespan), 2000/20 s
    assert s2["borrowed_gpu_s"] == 12.0 and s1["confidence"] is not None
    assert series["train"][0]["return_latency_s"] == 0.5
    assert api.get("/api/jobs/999/series/").status_code == 404
    assert api.get("/api/jobs/x/status/").json()["field"] == "id"


def test_prune_keeps_the_per_step_history():
    from controlplane.models import Job

    job = Job.objects.create(name="j")
    history = [step(job="j", step=i, makespan_s=1.0).to_json() for i in range(5)] + [train(job="j", step=1).to_json()]
    noise = [turn(job="j", step=1, turn=i).to_json() for i in range(50)]
    telemetry.ingest(principal=job_principal(job), message=TelemetryBatch(epoch=1, records=history + noise))
    removed = telemetry.prune(keep=10)
    assert removed == 40
    assert TelemetrySample.objects.filter(job=job, kind="step").count() == 5
    assert TelemetrySample.objects.filter(job=job, kind="train").count() == 1
    assert TelemetrySample.objects.filter(job=job, kind="turn").count() == 10


def test_override_exact_needs_a_pd_and_clearing_the_pd_clears_exact(api):
    make_node("n1")
    make_node("t1", pool="training", slots=1)
    job = make_job("j", rollout_gpus=3, training_gpus=1)  # room for the 1 + 3 workers forced below
    r = api.patch(f"/api/jobs/{job.pk}/overrides/", {"force_exact": True}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "force_exact"
    r = api.patch(
        f"/api/jobs/{job.pk}/overrides/",
        {"force_n_prefill": 1, "force_n_decode": 3, "force_exact": True},
        format="json",
    )
    assert r.status_code == 200 and r.json()["force_exact"] is True
    r = api.patch(f"/api/jobs/{job.pk}/overrides/", {"force_n_prefill": None, "force_n_decode": None}, format="json")
    assert r.json()["force_exact"] is False
    ev = Event.objects.filter(kind="override.set").first()
    assert ev.data["before"]["force_exact"] is True and ev.actor == "op"
    assert Override.objects.get(job=job).force_n_prefill is None


def test_simulations_validate_and_run():
    with pytest.raises(Exception) as bad:
        simulations.request_run(scenario="../../etc/passwd", seed=None, policies=[])
    assert getattr(bad.value, "field", None) == "scenario"
    with pytest.raises(Exception) as bad:
        simulations.request_run(scenario="ablation-qwen3-8b-4gpu", seed=None, policies=["nope"])
    assert getattr(bad.value, "field", None) == "policies"
    run = SimulationRun.objects.create(scenario="ablation-qwen3-8b-4gpu", seed=0, policies=["fixed", "A+B+C"])
    done = simulations.run(run_id=run.pk)
    assert done.status == "succeeded", done.error
    res = done.result
    from controlplane.sim.cli import compare, compare_json
    from controlplane.sim.scenario import get_scenario

    sc = get_scenario("ablation-qwen3-8b-4gpu")
    assert {k: v for k, v in res.items() if k != "series"} == compare_json(
        sc, compare(sc, ["fixed", "A+B+C"])
    )  # the CLI's JSON
    assert (
        res["series"]["A+B+C"]["steps"] and res["series"]["A+B+C"]["timeline"] and res["series"]["A+B+C"]["throughput"]
    )


def test_simulation_api(api):
    r = api.post("/api/simulations/", {"scenario": "nope"}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "scenario"
    assert not SimulationRun.objects.exists()
    assert any(s["name"] == "paper-qwen3-8b-seg1" for s in api.get("/api/scenarios/").json())
    r = api.post(
        "/api/simulations/", {"scenario": "ablation-qwen3-8b-4gpu", "seed": 3, "policies": ["fixed"]}, format="json"
    )
    assert r.status_code == 201 and r.json()["status"] == "pending" and r.json()["seed"] == 3
    assert api.get(f"/api/simulations/{r.json()['id']}/").json()["scenario"] == "ablation-qwen3-8b-4gpu"


def test_admin_lists_every_pearl_model(django_user_model):
    from django.contrib import admin
    from django.test import Client

    from controlplane import models as m

    staff = django_user_model.objects.create_superuser("root", "r@example.com", "root-password-1")
    make_node("n1")
    c = Client()
    c.force_login(staff)
    registered = {model for model in admin.site._registry if model._meta.app_label == "controlplane"}
    assert registered == {
        m.Node,
        m.GPU,
        m.Job,
        m.Worker,
        m.TrainingLend,
        m.Decision,
        m.Transition,
        m.Event,
        m.AgentCredential,
        m.TelemetrySample,
        m.SimulationRun,
    }
    for model in registered:
        assert c.get(f"/admin/controlplane/{model._meta.model_name}/").status_code == 200
    assert c.get(f"/admin/controlplane/node/{Node.objects.get().pk}/change/").status_code == 200
