"""The SWE-like environment draws, at its place in a rollout batch, the trajectory the simulator draws there
(`controlplane.core.workload.draw_batch` with the job's B, G and seed), so live and simulated runs of one job
compare like with like."""

from __future__ import annotations

import asyncio

from agents.envs import make_env
from controlplane.core.workload import WorkloadSpec, draw_batch


def test_at_its_place_in_the_batch_it_is_the_simulators_trajectory():
    sim = draw_batch(WorkloadSpec(batch_size=32, group_size=16, max_length=32768), seed=7, step=5)
    for group, member in [(0, 0), (0, 15), (1, 3)]:
        env = make_env("swe-like", task=99, member=member, seed=7, group_size=16, step=5, group=group, batch_size=32)
        assert env.turns == sim[group * 16 + member].turns  # type: ignore[attr-defined]
        first = asyncio.run(env.reset())
        assert len(first.observation) == sim[group * 16 + member].turns[0].new_prompt_tokens


def test_another_step_or_seed_is_another_trajectory():
    def turns(**kw):
        return make_env("swe-like", task=1, member=2, group_size=16, group=0, batch_size=32, **kw).turns  # type: ignore[attr-defined]

    assert turns(seed=7, step=5) != turns(seed=7, step=6)
    assert turns(seed=7, step=5) != turns(seed=8, step=5)


def test_without_a_place_it_draws_a_group_of_its_own_by_task():
    a = make_env("swe-like", task=11, member=1, seed=0, group_size=16)
    spec = WorkloadSpec(batch_size=16, group_size=16, max_length=32768)
    assert a.turns == draw_batch(spec, seed=0, step=11)[1].turns  # type: ignore[attr-defined]
