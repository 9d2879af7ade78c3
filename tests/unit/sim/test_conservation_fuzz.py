"""Property test: under arbitrary preemption traces nothing is lost, duplicated or generated twice."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.sim.cluster import Simulation
from controlplane.sim.scenario import scenario_from_dict

from .conftest import SMALL
from .test_sim_core import _check_conservation

levels = st.lists(st.sampled_from([4, 6, 8, 10, 12]), min_size=1, max_size=8)
gaps = st.lists(st.floats(min_value=5.0, max_value=200.0), min_size=8, max_size=8)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    levels=levels,
    gaps=gaps,
    seed=st.integers(0, 1000),
    policy=st.sampled_from(["pearl", "elastic", "oracle"]),
    end=st.floats(min_value=120.0, max_value=700.0),
)
def test_conservation_under_random_traces(levels, gaps, seed, policy, end):
    t, points = 0.0, []
    for g, dt in zip(levels, gaps):
        points.append([round(t, 1), g])
        t += dt
    sc = scenario_from_dict(dict(SMALL, name="fuzz", trace={"points": points}, duration_s=end, seed=seed))
    sim = Simulation(sc, policy)
    sim.run()
    _check_conservation(sim)
