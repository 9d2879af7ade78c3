"""The job's policy's dispatch rule reaches the live driver's loop, as the simulator sets it: RLBoost+ routes
by join-shortest-queue with delayed dispatch at the throughput-plateau batch, the others stick to a
trajectory's home (before, every live job routed sticky and JSQ ran only in the simulator). RLBoost+ is not in
the job catalog (a simulator baseline), so its job is made by changing a submitted one's policy."""

from __future__ import annotations

import asyncio

import pytest

from agents.driver import RolloutDriver
from agents.driver.link import ControlLink
from controlplane.core import driver_link as dl
from controlplane.core.profiles import dispatch_cap, get_profile
from controlplane.core.wire import parse_dataclass, to_json
from controlplane.models import Job
from controlplane.selectors.driver import job_view
from tests.support.cluster import make_node

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("policy", "dispatch"), [("rlboost+", "jsq"), ("pearl", "sticky"), ("elastic", "sticky")])
def test_the_driver_loop_routes_by_the_jobs_policy(api, policy, dispatch):
    make_node("n1", slots=4, hardware="H800")
    make_node("t1", pool="training", slots=4, hardware="H800")
    body = {
        "name": f"d-{policy.strip('+')}",
        "model": "qwen3-8b",
        "hardware": "H800",
        "engine": "emulated",
        "environment": "swe-like",
        "policy": "elastic" if policy == "rlboost+" else policy,
        "tp": 2,
        "rollout_gpus": 2,
        "training_gpus": 2,
        "batch_size": 16,
        "group_size": 8,
    }
    r = api.post("/api/jobs/", body, format="json")
    assert r.status_code == 201, r.content
    Job.objects.filter(pk=r.json()["id"]).update(policy=policy)
    view = job_view(Job.objects.get(pk=r.json()["id"]))
    cap = dispatch_cap(dispatch, get_profile("H800", "qwen3-8b", 2), view.max_trajectory_tokens)
    assert (view.dispatch, view.dispatch_cap) == (dispatch, cap)
    assert (cap > 1) == (dispatch == "jsq")
    wire = parse_dataclass(dl.JobView, to_json(view), "job")  # the welcome's round trip

    async def driver_config() -> tuple[str, int]:
        link = ControlLink("http://127.0.0.1:1", "j", "t", http=None)  # type: ignore[arg-type]
        cfg = RolloutDriver(wire, link=link, token="t").loop.cfg
        return cfg.dispatch, cfg.dispatch_cap

    assert asyncio.run(driver_config()) == (dispatch, cap)
