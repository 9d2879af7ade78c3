"""A person opens an agent job's page: the trajectory browser lists a step's trajectories, one opens as its
chat transcript with the tokens not trained on (mask 0) greyed; Staleness ignores asleep workers; Submitted
names the launcher for a job no user submitted."""

from __future__ import annotations

import pytest

from tests.e2e import helpers
from tests.e2e.helpers import off_loop, shot
from tests.support.cluster import make_job, make_node

pytestmark = pytest.mark.e2e


def _setup():
    from agents.driver.trajectories import summarize
    from controlplane.models import Job, Node, Worker
    from controlplane.services import workers
    from controlplane.services.trajectories import record_trajectories

    make_node("n1", slots=2)
    job = make_job(
        "calc-agent",
        rollout_gpus=2,
        environment="agent",
        agent={"agent_command": ["python", "a.py"], "tasks": [{"q": 1}]},
    )
    Job.objects.filter(pk=job.pk).update(weight_version=168, max_staleness=1)
    node = Node.objects.get(name="n1")
    w = workers.start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[0], role="colocated", activity="active")
    Worker.objects.filter(pk=w.pk).update(weight_version=168)
    workers.start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[1], role="colocated", activity="inactive")
    sample = {
        "tokens": [10, 11, 12, 13, 14],
        "mask": [0, 0, 1, 1, 0],
        "logprobs": [0, 0, -0.5, -0.25, 0],
        "weight_versions": [168],
        "workers": [1],
        "latency_s": [0.2],
    }
    record_trajectories(
        job_id=job.pk,
        step=3,
        trajectories=[
            summarize(
                "s3-t0",
                {
                    "samples": [sample],
                    "reward": 1.0,
                    "turns": 1,
                    "status": "done",
                    "messages": [{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}],
                },
            ),
            summarize(  # run again after a crash of its driver (issue 34's audit)
                "s3-t1",
                {"status": "failed", "reason": "the agent exited with status 1", "stderr": "boom", "rerun": True},
            ),
            summarize(  # its group's other member: finished, left out of the update (its group was dropped)
                "s3-t2",
                {
                    "samples": [sample],
                    "reward": 0.0,
                    "turns": 1,
                    "status": "done",
                    "trained": False,
                    "reason": "not trained: its group was dropped",
                },
            ),
        ],
    )
    # the step's STEP record: one member given up (its slot not trained), its group dropped
    from controlplane.core import telemetry as tm
    from controlplane.models import TelemetrySample

    rec = tm.step(job=job.name, step=3, batch_size=2, given_up=1, dropped_groups=1).to_json()
    TelemetrySample.objects.create(job=job, kind="step", record=rec)
    return job


def test_the_trajectory_browser_and_the_cards(control_plane_server, page):
    cp = control_plane_server
    off_loop(helpers.operator_user)
    job = off_loop(_setup)
    helpers.login(page, cp.base_url, "ops", "ops-password-123", path=f"/jobs/{job.pk}/")
    page.wait_for_selector("#trajectories tbody tr[data-name='s3-t0']", timeout=15000)
    assert page.locator("#trajectories tbody tr").count() == 3
    assert "step 3" in page.inner_text("#tr-step") and "1 given up, 1 groups dropped" in page.inner_text("#tr-step")
    assert "trained 0, untrained 1, rerun 1, resumed 0" in page.inner_text("#tr-step")  # the step's audit counts
    untrained = page.inner_text("#trajectories tbody tr[data-name='s3-t2']")
    assert "done (not trained)" in untrained and "its group was dropped" in untrained
    assert "not trained" not in page.inner_text("#trajectories tbody tr[data-name='s3-t0']")
    staleness = page.inner_text("[data-card=staleness] .v")
    assert "lag 0 / bound 1" in staleness and "over" not in staleness and "1 asleep" in staleness
    assert page.inner_text("[data-card=submitted] .v").startswith("test at")  # its job.created actor
    page.click("#trajectories tbody tr[data-name='s3-t0']")
    page.wait_for_selector("#transcript-chat .msg-assistant")
    assert "What is 2+3?" in page.inner_text("#transcript-chat")
    tokens = page.locator("#transcript-tokens .tok")
    assert tokens.count() == 5
    assert page.locator("#transcript-tokens .tok-masked").count() == 3
    sampled = page.locator("#transcript-tokens .tok-sampled")
    assert sampled.count() == 2 and "-0.5" in (sampled.first.get_attribute("title") or "")
    grey = page.eval_on_selector("#transcript-tokens .tok-masked", "e => getComputedStyle(e).color")
    assert grey == "rgb(136, 136, 136)"  # greyed: not trained on
    assert "v168" in page.inner_text("#transcript-turns")
    shot(page, "trajectory-browser")
    page.click("#trajectories tbody tr[data-name='s3-t1']")
    page.wait_for_selector("#transcript pre.stderr")
    assert "the agent exited with status 1" in page.inner_text("#transcript")
    page.select_option("#tr-status", "failed")
    page.wait_for_function("document.querySelectorAll('#trajectories tbody tr').length === 1")
    assert page.js_errors == []
