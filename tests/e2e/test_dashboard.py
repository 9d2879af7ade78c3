"""A person opens the dashboard: logs in, sees the cluster map, and sees it change live."""

from __future__ import annotations

import pytest

from controlplane.services import workers
from tests.e2e import helpers
from tests.e2e.helpers import off_loop
from tests.support.cluster import make_job, make_node

pytestmark = pytest.mark.e2e


def login(page, base_url: str, username: str, password: str) -> None:
    helpers.login(page, base_url, username, password)
    page.wait_for_selector("#conn[data-state=live]", timeout=15000)


def test_dashboard_shows_nodes_live_without_reload(control_plane_server, page, django_user_model, tmp_path):
    django_user_model.objects.create_user(username="alice", password="alice-password-1")
    make_node("node-b", slots=2)
    login(page, control_plane_server.base_url, "alice", "alice-password-1")
    page.wait_for_selector("[data-node=node-b]")
    assert page.locator("[data-node=node-b] .gpu").count() == 2
    assert "node-b registered" in page.inner_text("#events")  # history comes with the snapshot
    stamp_before = page.inner_text("#last-updated")
    assert stamp_before != "never"

    # A new node registers while the page is open: it appears without a reload, in stable name order.
    page.evaluate("window.__marker = 42")
    off_loop(make_node, "node-a", slots=3, pool="elastic")
    page.wait_for_selector("[data-node=node-a]", timeout=10000)
    names = page.eval_on_selector_all(".node", "els => els.map(e => e.dataset.node)")
    assert names == ["node-b", "node-a"]  # grouped by pool: reserved before elastic
    page.uncheck("#f-group")  # ungrouped: plain name order
    page.wait_for_function(
        "[...document.querySelectorAll('.node')].map(e => e.dataset.node).join() === 'node-a,node-b'"
    )
    assert page.evaluate("window.__marker") == 42  # same document: no reload happened

    # A worker starts on node-b GPU 1: that slot turns into an active colocated cell.
    from controlplane.models import Node

    job = off_loop(make_job, rollout_gpus=1)
    off_loop(
        workers.start_worker,
        job_id=job.pk,
        node_id=Node.objects.get(name="node-b").pk,
        gpu_indexes=[1],
        role="colocated",
        activity="active",
    )
    cell = page.locator("[data-node=node-b] .gpu[data-gpu='1']")
    cell.wait_for(state="attached")
    page.wait_for_function(
        "document.querySelector(\"[data-node=node-b] .gpu[data-gpu='1']\").dataset.role === 'colocated'", timeout=10000
    )
    assert cell.get_attribute("data-activity") == "active"
    page.wait_for_selector("#jobs tr[data-job=job1]", timeout=10000)
    helpers.shot(page, "dashboard-live")


def test_dashboard_requires_login(control_plane_server, page):
    page.goto(control_plane_server.base_url + "/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", "nobody")
    page.fill("input[name=password]", "wrong-password")
    page.click("button[type=submit]")
    assert page.locator(".error").is_visible()
