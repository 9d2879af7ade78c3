"""Several jobs in the simulator (issue 35): the jobs: form, the one-job form, compare --json, a short run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from controlplane.core.sharing import SHARING_NAMES
from controlplane.sim.cli import main
from controlplane.sim.cluster import Simulation
from controlplane.sim.draws import draw_jobs_scenario
from controlplane.sim.multi import MultiSimulation, run_multi
from controlplane.sim.scenario import ScenarioError, get_scenario, scenario_from_dict

WL = {"batch_size": 8, "group_size": 4, "max_length": 8192, "turns_mean": 6.0, "turns_max": 10}
TWO: dict[str, Any] = {
    "name": "two-small",
    "cluster": {"reserved_gpus": 4, "preemptible_gpus": 8, "hardware": "H800", "tp": 2},
    "trace": {"points": [[0, 8], [300, 12], [500, 6]]},
    "duration_s": 900,
    "seed": 1,
    "jobs": [
        {"name": "a", "model": "qwen3-8b", "training_gpus": 4, "workload": WL, "rollout_gpus": 8},
        {
            "name": "b",
            "model": "qwen3-30b-a3b",
            "training_gpus": 4,
            "workload": WL,
            "arrival_s": 120,
            "priority": 1,
            "weight": 2,
            "min_rollout_gpus": 2,
            "rollout_gpus": 8,
        },
    ],
}


def test_jobs_are_parsed_with_their_fields():
    sc = scenario_from_dict(dict(TWO))
    assert [j.name for j in sc.jobs] == ["a", "b"]
    b = sc.jobs[1]
    assert (b.model, b.training_gpus, b.arrival_s, b.priority, b.weight) == ("qwen3-30b-a3b", 4, 120, 1, 2)
    assert (b.min_rollout_gpus, b.rollout_gpus, b.workload.batch_size) == (2, 8, 8)
    assert sc.policies == SHARING_NAMES


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"jobs": []}, "non-empty list"),
        ({"jobs": [{"model": "qwen3-8b"}]}, "with a name"),
        ({"jobs": [{"name": "a", "color": 1}]}, "unknown keys"),
        ({"jobs": [{"name": "a", "weight": 0}]}, "weight"),
        ({"jobs": [{"name": "a", "min_rollout_gpus": 8, "rollout_gpus": 4}]}, "min_rollout_gpus"),
        ({"jobs": [{"name": "a"}, {"name": "a"}]}, "unique"),
        ({"policies": ["fixed"]}, "multi-job policies"),
        ({"jobs": [{"name": "a", "max_staleness": -1}]}, "job a: max_staleness"),
        ({"jobs": [{"name": "a", "max_staleness": True}]}, "job a: max_staleness"),
        ({"max_staleness": 65}, "max_staleness must be an integer from 0 to 64"),
    ],
)
def test_bad_jobs_are_named(change, needle):
    with pytest.raises(ScenarioError, match=needle):
        scenario_from_dict({**TWO, **change})


def test_the_one_job_form_stays_valid():
    sc = get_scenario("paper-qwen3-8b-seg1")
    assert sc.jobs == () and "fixed" in sc.policies
    assert Simulation(sc, "pearl").loop.cfg.max_staleness == 1
    on_policy = scenario_from_dict({"name": "sync", "max_staleness": 0})
    assert Simulation(on_policy, "pearl").loop.cfg.max_staleness == 0


def test_shipped_multi_job_scenarios_load():
    for name, n in (("multi-2jobs", 2), ("multi-4jobs", 4), ("multi-8jobs", 8)):
        sc = get_scenario(name)
        assert len(sc.jobs) == n
        assert {j.model for j in sc.jobs} == {"qwen3-8b", "qwen3-30b-a3b"}
        assert len({j.arrival_s for j in sc.jobs}) == n  # staggered
        assert max(sc.trace.gpus) > min(sc.trace.gpus)  # a preemptible trace


def test_a_drawn_scenario_is_the_seeds_and_the_shipped_draws_are_its():
    """The random multi-job scenarios come from `draws` (re-drawn, the same file), within its ranges."""
    assert draw_jobs_scenario(7, 8) == draw_jobs_scenario(7, 8) != draw_jobs_scenario(8, 8)
    for seed, n in ((11, 4), (12, 3)):
        doc = draw_jobs_scenario(seed, n)
        assert scenario_from_dict(doc) == get_scenario(doc["name"])
    docs = [draw_jobs_scenario(seed, n) for seed in range(40) for n in (2, 8)]
    jobs = [j for d in docs for j in d["jobs"]]
    assert {j["model"] for j in jobs} == {"qwen3-8b", "qwen3-30b-a3b"}
    assert {j["workload"]["max_length"] for j in jobs} == {8192, 16384, 32768}
    assert any(j.get("steps") for j in jobs) and any(j.get("min_rollout_gpus") for j in jobs)
    for d in docs:  # every guarantee fits in the reserved pool; the first job arrives at 0
        assert sum(j.get("min_rollout_gpus", 0) for j in d["jobs"]) <= d["cluster"]["reserved_gpus"]
        assert d["jobs"][0]["arrival_s"] == 0.0
        scenario_from_dict(d)
    assert {len({j["arrival_s"] for j in d["jobs"]}) > 1 for d in docs if len(d["jobs"]) == 8} == {True, False}
    with pytest.raises(ValueError, match="n_jobs"):
        draw_jobs_scenario(1, 0)
    # mixed TPs: each 8B job's TP drawn on a stream of its own, the rest the same seed's draw
    mixed = [draw_jobs_scenario(seed, 8, mixed_tp=True) for seed in range(10)]
    for seed, m in enumerate(mixed):
        assert [{k: v for k, v in j.items() if k != "tp"} for j in m["jobs"]] == draw_jobs_scenario(seed, 8)["jobs"]
        assert all(j.get("tp", 2) == 2 for j in m["jobs"] if j["model"] == "qwen3-30b-a3b")
        scenario_from_dict(m)
    assert {j.get("tp") for m in mixed for j in m["jobs"] if j["model"] == "qwen3-8b"} == {1, 2}


def test_an_on_policy_job_waits_for_each_update_and_an_off_policy_one_does_not():
    """`max_staleness` as a live job's: 0 starts each rollout only once the previous update is done."""
    doc = dict(TWO)
    doc["jobs"] = [dict(TWO["jobs"][0], max_staleness=0), dict(TWO["jobs"][1], max_staleness=1)]
    sc = scenario_from_dict(doc)
    sim = MultiSimulation(sc, "pearl")
    sim.run()
    on, off = (r.sim.steps for r in sim.runs)
    assert len(on) >= 3 and len(off) >= 3
    assert all(nxt.start_s >= prev.train_end_s > 0 for prev, nxt in itertools.pairwise(on) if prev.train_end_s > 0)
    assert any(0 < nxt.start_s < prev.train_end_s for prev, nxt in itertools.pairwise(off))


def test_a_two_job_run_shares_the_pool():
    sc = scenario_from_dict(dict(TWO))
    r = run_multi(sc, "pearl")
    assert set(r.jobs) == {"a", "b"}
    assert all(j.steps >= 1 for j in r.jobs.values())
    assert all(j.misses == 0 and j.lost_tokens == 0 for j in r.jobs.values())
    assert r.trained_tokens > 0 and r.cost_efficiency > 0
    # b's arrival is explained, and b (priority 1, 2 GPUs guaranteed) got units
    arrived = [e for e in r.explanations if "job b arrived" in e]
    assert arrived and "b 0→" in arrived[0] and "b 0→0" not in arrived[0]


def test_jobs_of_different_tps_are_divided_in_gpus_and_each_runs_whole_workers_of_its_own():
    """As live (`core.arbiter.division_unit`): a TP1 job beside a TP2 job is divided in single GPUs; each job's
    world runs workers of its own TP, the TP2 job's allotment rounded down to whole workers."""
    doc = dict(TWO)
    doc["jobs"] = [dict(TWO["jobs"][0], tp=1), TWO["jobs"][1]]
    sim = MultiSimulation(scenario_from_dict(doc), "pearl")
    r = sim.run()
    assert sim.unit == 1 and [run.tp for run in sim.runs] == [1, 2]
    assert all(j.steps >= 1 and j.misses == 0 and j.lost_tokens == 0 for j in r.jobs.values())
    b = sim.by_name["b"]
    assert b.units == sim.allot.total("b") // 2 and b.units >= 1  # b's GPUs, in its TP2 workers
    with pytest.raises(ScenarioError, match="multiples of tp=2"):
        scenario_from_dict({**TWO, "jobs": [dict(TWO["jobs"][0], tp=2, training_gpus=3)]})
    shipped = get_scenario("multi-2jobs-mixed-tp")
    assert [j.tp for j in shipped.jobs] == [1, 0] and shipped.cluster.tp == 2


def test_compare_json_keys(tmp_path: Path, capsys):
    p = tmp_path / "two.yaml"
    p.write_text(yaml.safe_dump(TWO))
    assert main(["compare", "--scenario-file", str(p), "--policies", "static,pearl", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["scenario"] == "two-small" and data["jobs"] == ["a", "b"]
    assert set(data["policies"]) == {"static", "pearl"}
    for row in data["policies"].values():
        assert {"cost_efficiency", "cost_efficiency_prorated", "jain", "jobs", "misses"} <= set(row)
        assert set(row["jobs"]) == {"a", "b"}
        for j in row["jobs"].values():
            assert {"throughput", "steps", "slowdown", "misses"} <= set(j)
    assert data["policies"]["static"]["jain"] == 1.0


def test_an_unknown_sharing_policy_is_a_clear_error(tmp_path: Path, capsys):
    p = tmp_path / "two.yaml"
    p.write_text(yaml.safe_dump(TWO))
    assert main(["compare", "--scenario-file", str(p), "--policies", "fixed", "--json"]) == 2
    assert "fixed" in capsys.readouterr().err


def test_a_job_that_ends_gives_its_units_back():
    jobs = [dict(TWO["jobs"][0], steps=2), TWO["jobs"][1]]
    sc = scenario_from_dict({**TWO, "jobs": jobs})
    r = run_multi(sc, "pearl")
    assert r.jobs["a"].steps == 2
    ended = [e for e in r.explanations if "job a ended" in e]
    assert ended and "a " in ended[0] and "→0" in ended[0]
    assert all(j.misses == 0 and j.lost_tokens == 0 for j in r.jobs.values())
    # prorating: a job that stopped after its last update has nothing in flight to count; one still running
    # at the end counts its unfinished step at its own measured rate (more than its whole steps, never less)
    assert r.jobs["a"].prorated_tokens == r.jobs["a"].trained_tokens
    b = r.jobs["b"]
    assert b.trained_tokens > 0 and b.prorated_tokens > b.trained_tokens
    assert r.cost_efficiency_prorated > r.cost_efficiency


def test_a_lent_training_unit_is_hidden_from_its_owner_but_keeps_its_slot_id():
    from controlplane.sim.cluster import Simulation
    from controlplane.sim.multi import job_scenario

    sc = scenario_from_dict(dict(TWO))
    sim = Simulation(job_scenario(sc, sc.jobs[0], 0), "pearl")
    sim.world.add_training_units(2)
    ovl = [s for s in sim.world.slots.values() if s.pool == "overlap"]
    ovl[0].lent = True
    inv = sim.world.inventory(False)
    assert {u.key for u in inv.units} == {ovl[1].sid}
    assert ovl[0].wid in inv.taken_slots  # a new dedicated worker may not take the lent unit's slot id


def test_a_jobs_curve_is_one_fit_never_a_memo_mixed_with_a_newer_one():
    from controlplane.core.policies.base import best_makespan
    from controlplane.sim.multi import MultiSimulation

    ms = MultiSimulation(scenario_from_dict(dict(TWO)), "pearl")
    ms.run()
    run = ms.by_name["a"]
    early = ms._curve(run)
    first = [early(n) for n in (1, 2, 3)]  # memoised
    trained = [s for s in run.sim.steps if s.train_end_s > 0]
    trained[-1].train_end_s += 500.0  # the next update's time is known: the curve's floor moved
    later = ms._curve(run)
    fp = run.sim.policy.tracker.fitted()
    train_s = trained[-1].train_end_s - trained[-1].train_start_s
    now = [later(n) for n in range(1, 7)]
    assert now == [max(best_makespan(fp.workload, fp.coefficients, n), train_s) for n in range(1, 7)]
    assert now != first + now[3:]  # the memo of the earlier curve was not reused
    assert all(a >= b for a, b in itertools.pairwise(now))  # one fit: more units never predict a longer step
