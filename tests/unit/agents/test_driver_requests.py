"""What the rollout driver asks of engine workers is within the data plane's bounds: a request over them
is refused (400) however often it is resent, which held a step open for good."""

from __future__ import annotations

from agents import dataplane as dp
from agents.driver import Episode, RolloutDriver
from controlplane.core import driver_link as dl


def test_a_turn_wanting_more_than_the_data_plane_allows_asks_for_the_bound():
    job = dl.JobView(
        name="j",
        environment="swe-like",
        model="qwen3-8b",
        engine="emulated",
        batch_size=4,
        group_size=2,
        max_staleness=1,
        max_trajectory_tokens=65536,
        return_deadline_s=30.0,
    )
    driver = RolloutDriver(job, link=None, token="t")  # type: ignore[arg-type]
    ep = Episode("s1-t0", 1, 0, env=None)  # type: ignore[arg-type]
    # as the worker parses it: a value over the bounds would be refused (400)
    body = dp.DATA_PLANE.parse(dp.DATA_PLANE.dump(driver._sampling(ep, 40_000)), dp.SamplingParams, "sampling")
    assert body.max_tokens == dp.MAX_NEW_TOKENS
    assert driver._sampling(ep, 0).max_tokens == 1
