"""The cluster page shows how jobs share the rollout GPUs (issue 35): the stacked chart of each job's share grows
live with each division of the arbiter, and each GPU on the map carries the colour of the job that holds it; a
job's page shows its share and why it lends its idle training GPUs to no other job."""

from __future__ import annotations

import pytest

from controlplane.services import arbitration, workers
from tests.e2e import helpers
from tests.e2e.helpers import off_loop
from tests.support.cluster import make_job, make_node

pytestmark = pytest.mark.e2e


def test_the_share_chart_and_the_map_name_each_jobs_gpus(control_plane_server, page, django_user_model):
    django_user_model.objects.create_user(username="sharer", password="sharer-password-1")
    make_node("res-s", slots=4)
    make_node("train-s", pool="training", slots=1)
    make_job("a", rollout_gpus=4, training_gpus=1)
    arbitration.rebalance(reason="job a arrived")
    helpers.login(page, control_plane_server.base_url, "sharer", "sharer-password-1")
    page.wait_for_selector("#conn[data-state=live]", timeout=15000)
    # the snapshot's one division: one trace (job a), drawn by the local plotly
    page.wait_for_function("document.getElementById('chart-shares').data?.length === 1", timeout=10000)
    assert page.evaluate("document.getElementById('chart-shares').data[0].name") == "a"

    # b arrives: the division comes as a delta, the chart stacks two jobs, the point says why
    off_loop(make_job, "b", rollout_gpus=4)
    off_loop(arbitration.rebalance, reason="job b arrived")
    page.wait_for_function("document.getElementById('chart-shares').data?.length === 2", timeout=10000)
    ys = page.evaluate("document.getElementById('chart-shares').data.map(t => t.y[t.y.length - 1])")
    assert ys == [2, 2]
    why = page.evaluate("document.getElementById('chart-shares').data[1].text.slice(-1)[0]")
    assert why == "job b arrived: a 4→2, b 0→2"

    # a worker of b on res-s GPU 3: the cell names its job (the bar in b's colour)
    from controlplane.models import Job, Node

    b = Job.objects.get(name="b")
    off_loop(
        workers.start_worker,
        job_id=b.pk,
        node_id=Node.objects.get(name="res-s").pk,
        gpu_indexes=[3],
        role="colocated",
        activity="active",
    )
    page.wait_for_selector("[data-node=res-s] .gpu[data-gpu='3'][data-job=b]", timeout=10000)
    assert page.locator("[data-node=res-s] .gpu[data-job=a]").count() == 0

    # job a's page: its share, and why its idle training GPU goes to no other job yet
    a = Job.objects.get(name="a")
    page.goto(f"{control_plane_server.base_url}/jobs/{a.pk}/")
    page.wait_for_selector("[data-card=share]", timeout=60000)
    share = page.inner_text("[data-card=share] .v")
    assert "allotted 2 of ≤ 4 rollout GPUs" in share, share
    assert "lends no training GPU: its next Training Begin cannot be predicted yet" in share, share
    assert page.js_errors == []
