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


def test_the_return_deadline_is_real_seconds_whatever_an_emulated_job_runs_at():
    """The return is the control plane's and the agents' work, in real seconds: an emulated job running ten
    times real time (its loop clock in model seconds) gets ten times as many loop seconds for it. Its deadline
    was read in model seconds, 3 real seconds for a 30 s deadline, which a loaded CI machine missed (3.6 s)."""
    for engine, factor, deadline in (("emulated", 0.1, 300.0), ("emulated", 1.0, 30.0), ("torch", 0.1, 30.0)):
        job = dl.JobView(
            name="j",
            environment="math",
            model="qwen3-8b",
            engine=engine,
            batch_size=4,
            group_size=2,
            max_staleness=1,
            max_trajectory_tokens=4096,
            return_deadline_s=30.0,
        )
        driver = RolloutDriver(job, link=None, token="t", time_factor=factor)  # type: ignore[arg-type]
        assert driver.loop.cfg.return_deadline_s == deadline, (engine, factor)
