"""The job page's Pause and Resume (issue 34): an operator pauses a running job and resumes it from the
browser alone, each behind its confirmation; the status pill, the buttons and the timeline follow."""

from __future__ import annotations

import pytest

from tests.e2e import helpers
from tests.e2e.helpers import off_loop, shot

pytestmark = pytest.mark.e2e


def _status(job_id: int) -> str:
    from controlplane.models import Job

    return Job.objects.get(pk=job_id).status


def test_pause_and_resume_from_the_job_page(control_plane_server, page):
    cp = control_plane_server
    off_loop(helpers.operator_user, "ops", "ops-password-123")
    from controlplane.models import Job
    from tests.support.cluster import make_job, make_node

    off_loop(make_node, "n1", slots=2)
    job = off_loop(make_job, "pausable", rollout_gpus=2)
    off_loop(lambda: Job.objects.filter(pk=job.pk).update(status="running", step=4))
    helpers.login(page, cp.base_url, "ops", "ops-password-123", path=f"/jobs/{job.pk}/")
    page.wait_for_selector("#conn[data-state=live]")
    assert page.is_hidden("#resume") and page.is_visible("#pause")

    page.click("#pause")
    page.wait_for_selector("dialog#confirm[open]")
    assert "Pause pausable?" in page.inner_text("#confirm-text")
    page.click("#confirm-ok")
    page.wait_for_selector("#job-status[data-status=paused]")
    assert page.is_hidden("#pause") and page.is_visible("#resume")
    assert "Paused at step 4: its rollout workers are released" in page.inner_text("#failure")
    assert off_loop(_status, job.pk) == "paused"
    shot(page, "job-paused")

    page.click("#resume")
    page.wait_for_selector("dialog#confirm[open]")
    assert "Resume pausable at step 4?" in page.inner_text("#confirm-text")
    page.click("#confirm-ok")
    page.wait_for_selector("#job-status[data-status=running]")
    assert page.is_hidden("#resume") and page.is_visible("#pause") and page.is_hidden("#failure")
    assert off_loop(_status, job.pk) == "running"
    page.wait_for_function("document.querySelector('#events').innerText.includes('resumed by ops')")
    assert page.js_errors == []
