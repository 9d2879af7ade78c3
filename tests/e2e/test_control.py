"""A new user launches, watches and steers a job from the browser alone: the launch form (with field
errors), the job page (decision, override, charts), the cluster map changing as an agent joins and as
transitions run, a drain with its confirmation, and the live socket lost and regained."""

from __future__ import annotations

import sys

import pytest

from tests.e2e import helpers
from tests.e2e.helpers import Agent, off_loop, shot
from tests.support.environment import child_env
from tests.support.processes import start_process, wait_port

pytestmark = pytest.mark.e2e


def cell_roles(page, node: str) -> list[str]:
    return page.eval_on_selector_all(
        f"[data-node={node}] .gpu", "els => els.map(e => e.dataset.role + '/' + e.dataset.activity)"
    )


def wait_roles(page, node: str, js_condition: str, timeout: int = 30000) -> None:
    """Wait until the roles of `node`'s GPU cells (a JS array `r` of 'role/activity') satisfy the condition."""
    page.wait_for_function(
        f"(() => {{ const r = [...document.querySelectorAll('[data-node={node}] .gpu')]"
        f".map(e => e.dataset.role + '/' + e.dataset.activity); return {js_condition}; }})()",
        timeout=timeout,
    )


def test_launch_watch_steer_drain_and_reconnect(control_plane_server, celery_worker_process, page, tmp_path):
    cp = control_plane_server
    off_loop(helpers.operator_user, "ops", "ops-password-123")
    agents = [
        Agent(cp.ws_url, "res-a", pool="reserved", slots=4),
        Agent(cp.ws_url, "train-a", pool="training", slots=2),
    ]
    try:
        helpers.login(page, cp.base_url, "ops", "ops-password-123")
        page.wait_for_selector("#conn[data-state=live]")
        page.wait_for_selector("[data-node=res-a]")
        assert cell_roles(page, "res-a") == ["none/idle"] * 4

        # An agent joins while the page is open: its node appears (no reload).
        page.evaluate("window.__marker = 1")
        agents.append(Agent(cp.ws_url, "res-b", pool="reserved", slots=2))
        page.wait_for_selector("[data-node=res-b]")
        assert page.evaluate("window.__marker") == 1

        # The launch form: a bad submission gets its errors beside the fields and creates nothing.
        page.click("#launch-link")
        page.wait_for_selector("form#launch")
        page.fill("#id_name", "Bad Name!")
        page.fill("#id_batch_size", "60")
        page.click("form#launch button[type=submit]")
        page.wait_for_function("document.getElementById('err_name').textContent.length > 0")
        assert "lowercase" in page.inner_text("#err_name")
        assert page.inner_text("#err_rollout_gpus")  # required and missing
        assert page.locator(".field.invalid").count() >= 2
        shot(page, "launch-form-errors")
        from controlplane.models import Job

        assert not Job.objects.exists()

        page.fill("#id_name", "grpo-web")
        page.fill("#id_batch_size", "16")
        page.fill("#id_group_size", "4")
        page.fill("#id_rollout_gpus", "4")
        page.fill("#id_training_gpus", "2")
        page.click("form#launch button[type=submit]")
        page.wait_for_url("**/jobs/*/")
        page.wait_for_selector("#conn[data-state=live]")
        # The planner (a real Celery worker) decides and the transition runs: the decision table appears live.
        page.wait_for_selector("#candidates tr.chosen", timeout=30000)
        assert page.inner_text("#decision-reason")
        # the measured PD interference the colocated candidates carry (1.00 before any mixed prefill is seen)
        assert "× prefill alone" in page.inner_text("#decision-interference")
        page.wait_for_function(
            "document.querySelector('[data-transition]')"
            " && document.querySelector('[data-transition]').dataset.status === 'succeeded'",
            timeout=30000,
        )
        page.wait_for_function("window.Plotly && document.querySelector('#chart-makespan .main-svg') !== null")
        shot(page, "job-page-first-decision")

        # Force a 1:1 P:D ratio (scaled to the 4 dedicated + 2 borrowed workers): confirmation, then the
        # override, the decision's reason and the new configuration show.
        page.check("input[name=mode][value=disaggregated]")
        page.fill("#ov-p", "1")
        page.fill("#ov-d", "1")
        page.check("input[name=pd_kind][value=ratio]")
        page.click("#ov-apply")
        page.wait_for_selector("dialog#confirm[open]")
        assert "P:D ratio 1:1 scaled to the budget" in page.inner_text("#confirm-text")
        page.click("#confirm-ok")
        page.wait_for_function("document.getElementById('override-summary').textContent.includes('ratio 1:1')")
        page.wait_for_function(
            "(document.getElementById('decision-reason') || {}).textContent"
            "?.includes('forced ratio 1:1 gives 3P3D on 6 workers')",
            timeout=30000,
        )
        page.wait_for_function(
            "document.querySelector('[data-card=config] .v').textContent.startsWith('3P3D')", timeout=30000
        )
        page.wait_for_selector("#candidates tr.chosen[data-label='3P3D']", timeout=30000)
        assert "ops" in page.inner_text("#audit")  # who changed what
        shot(page, "job-page-override-ratio")

        # The cluster map shows the new roles once the transition ran.
        page.click("text=← cluster")
        page.wait_for_selector("#conn[data-state=live]")
        wait_roles(page, "res-a", "r.includes('prefill/active') && r.includes('decode/active')")
        assert "ratio 1:1" in page.inner_text("#jobs tr[data-job=grpo-web]")
        wait_roles(
            page,
            "train-a",
            "r.some(x => x.endsWith('/active'))"
            " && document.querySelectorAll('[data-node=train-a] .gpu[data-borrowed]').length === 2",
        )
        shot(page, "cluster-after-override")

        # Drain a node, with the confirmation; then return it to service.
        page.click("[data-node=res-b] button[data-action=drain]")
        page.wait_for_selector("dialog#confirm[open]")
        assert "Drain res-b" in page.inner_text("#confirm-text")
        page.click("#confirm-ok")
        page.wait_for_selector("[data-node=res-b] [data-status=draining]")
        page.click("[data-node=res-b] button[data-action=undrain]")
        page.click("#confirm-ok")
        page.wait_for_selector("[data-node=res-b] [data-status=ready]")

        # Lose the server: the page says the data is stale; a change made meanwhile shows after reconnect.
        daphne = cp.procs[0]
        daphne.kill()  # the server is gone at once (a graceful stop waits for the agents' sockets)
        daphne.wait(timeout=10)
        page.wait_for_selector("body.stale #stale-banner", state="visible")
        assert page.get_attribute("#conn", "data-state") == "reconnecting"
        shot(page, "cluster-stale")
        from controlplane.models import Node
        from controlplane.services.draining import drain_node

        off_loop(drain_node, node_id=Node.objects.get(name="res-b").pk, actor="ops")
        port = int(cp.base_url.rsplit(":", 1)[1])
        cp.procs.append(
            start_process(
                [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "pearl_site.asgi:application"],
                child_env(),
                tmp_path / "daphne-2.log",
            )
        )
        wait_port(port, proc=cp.procs[-1])
        page.wait_for_selector("#conn[data-state=live]", timeout=20000)
        page.wait_for_selector("[data-node=res-b] [data-status=draining]")  # resynchronised from the new snapshot
        assert not page.evaluate("document.body.classList.contains('stale')")
        assert page.js_errors == []
        shot(page, "cluster-resynced")
    finally:
        for a in agents:
            a.close()


def test_api_docs_and_charts_render_with_the_network_blocked(control_plane_server, page):
    cp = control_plane_server
    off_loop(helpers.operator_user, "ops", "ops-password-123")
    from tests.support.cluster import make_job, make_node

    off_loop(make_node, "n1", slots=2)
    off_loop(make_node, "t1", pool="training", slots=1)
    job = off_loop(make_job, "offline", rollout_gpus=2, training_gpus=1)
    outside: list[str] = []

    def only_local(route):
        if route.request.url.startswith(cp.base_url) or route.request.url.startswith(cp.ws_url):
            return route.continue_()
        outside.append(route.request.url)
        return route.abort()

    page.route("**/*", only_local)
    helpers.login(page, cp.base_url, "ops", "ops-password-123")
    page.wait_for_selector("#conn[data-state=live]")
    page.goto(cp.base_url + "/api/docs/")
    page.wait_for_selector(".swagger-ui .opblock", timeout=20000)
    assert page.locator(".swagger-ui .opblock").count() > 10
    shot(page, "api-docs-offline")
    page.goto(f"{cp.base_url}/jobs/{job.pk}/")
    page.wait_for_function("window.Plotly && document.querySelectorAll('.main-svg').length >= 5")
    assert outside == []  # nothing was even asked of the internet
    assert page.js_errors == []


def test_viewer_sees_no_controls_and_heatmap_view(control_plane_server, page, django_user_model):
    cp = control_plane_server
    django_user_model.objects.create_user(username="viewer", password="viewer-password-1")
    from tests.support.cluster import make_node

    for i in range(3):
        off_loop(make_node, f"n{i}", slots=8)
    helpers.login(page, cp.base_url, "viewer", "viewer-password-1")
    page.wait_for_selector("[data-node=n0]")
    assert page.locator("button[data-action]").count() == 0  # reads only: no node actions offered
    assert page.locator("#launch-link").count() == 0
    page.select_option("#f-mode", "heatmap")
    page.wait_for_selector("#heatmap-wrap:not([hidden])")
    box = page.locator("#heatmap").bounding_box()
    assert box and box["height"] > 10
    page.mouse.move(box["x"] + 3, box["y"] + 20)  # first block, below the pool heading
    page.wait_for_selector("#tip", state="visible")
    assert "n0 GPU 0" in page.inner_text("#tip")
    shot(page, "cluster-heatmap")
    # The API refuses the viewer's writes too (the page only mirrors the rule).
    res = page.evaluate("""async () => (await fetch('/api/nodes/1/drain/', {method: 'POST', headers: {'X-CSRFToken':
        document.cookie.match(/csrftoken=([^;]+)/)[1]}})).status""")
    assert res == 403


def test_simulator_page_compares_policies_side_by_side(control_plane_server, celery_worker_process, page):
    cp = control_plane_server
    off_loop(helpers.operator_user, "ops", "ops-password-123")
    helpers.login(page, cp.base_url, "ops", "ops-password-123")
    page.wait_for_selector("#conn[data-state=live]")
    page.click("text=Simulator")
    page.wait_for_selector("#conn[data-state=live]")
    page.select_option("#sim-scenario", "ablation-qwen3-8b-4gpu")
    for policy in ("A", "A+B"):  # keep ROLL (fixed) and the full PEARL (A+B+C)
        page.uncheck(f"input[name=policy][value='{policy}']")
    page.click("#sim-form button[type=submit]")
    page.wait_for_selector("#runs tr[data-run]")
    page.wait_for_selector("#runs tr[data-status=succeeded]", timeout=90000)  # a real Celery worker ran it
    page.wait_for_selector("#sim-summary tr[data-policy='A+B+C']")
    assert page.locator("#sim-summary tr[data-policy]").count() == 2
    assert "×" in page.inner_text("#sim-summary tr[data-policy='A+B+C']")  # throughput against ROLL
    page.wait_for_function(
        "document.querySelectorAll('#sim-throughput .main-svg, #sim-timeline .main-svg').length >= 2"
    )
    assert page.locator("#sim-decisions tbody tr").count() > 0  # the configuration each step ran with
    shot(page, "simulator")
    assert page.js_errors == []
