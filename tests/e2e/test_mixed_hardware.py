"""A person looks at a job on a mixed pool (issue 23): the job page lists each worker with the node and chip type
it runs on, and the cluster map shows each node's and each worker's hardware."""

from __future__ import annotations

import pytest

from tests.e2e import helpers
from tests.e2e.helpers import off_loop
from tests.support.cluster import make_job, make_node, run_transition

pytestmark = pytest.mark.e2e


def _mixed_job():
    from controlplane.services import planner

    make_node("res-h20", slots=2, hardware="H20")
    make_node("spot-a100", pool="elastic", slots=2, hardware="A100")
    make_node("train-h800", pool="training", slots=2, hardware="H800")
    job = make_job(
        "mixed",
        model="qwen3-8b",
        engine="emulated",
        hardware="h800",
        hardware_types=["H800", "H20"],
        tp=2,
        batch_size=32,
        group_size=8,
        rollout_gpus=4,
        training_gpus=2,
    )
    run_transition(planner.plan_job(job_id=job.pk, signal="step_start"))
    return job.pk


def test_job_page_and_cluster_map_show_each_workers_hardware(control_plane_server, page, django_user_model):
    django_user_model.objects.create_user(username="alice", password="alice-password-1")
    job_id = off_loop(_mixed_job)
    helpers.login(page, control_plane_server.base_url, "alice", "alice-password-1", path=f"/jobs/{job_id}/")
    page.wait_for_selector("#workers tbody tr", timeout=60000)  # the page loads plotly: slow on a busy machine
    rows = page.eval_on_selector_all(
        "#workers tbody tr", "els => els.map(e => [e.cells[3].textContent, e.dataset.hardware])"
    )
    assert dict(rows)["res-h20"] == "H20" and dict(rows)["train-h800"] == "H800"
    assert "spot-a100" not in dict(rows)  # not an accepted type
    summary = page.text_content("#workers-summary") or ""
    assert "on H20" in summary and "on H800" in summary
    spec = page.inner_text("[data-card=spec]")
    assert "train h800, rollout H800+H20" in spec
    assert page.js_errors == []

    page.goto(control_plane_server.base_url + "/")
    page.wait_for_selector("[data-node=res-h20]", timeout=60000)
    assert page.get_attribute("[data-node=res-h20]", "data-hardware") == "H20"
    assert page.get_attribute("[data-node=spot-a100]", "data-hardware") == "A100"
    tip = page.get_attribute("[data-node=res-h20] .gpu[data-gpu='0']", "title") or ""
    assert "mixed/w" in tip and "on H20" in tip, tip
    helpers.shot(page, "dashboard-mixed-hardware")
    assert page.js_errors == []
