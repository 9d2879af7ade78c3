"""How much can any division of rollout units gain on a multi-job scenario (issue 35)? Four measurements:

    .venv/bin/python benchmarks/multi_ceiling.py ceiling controlplane/sim/scenarios/multi-2jobs.yaml [...]
    .venv/bin/python benchmarks/multi_ceiling.py draws --seeds 101-104 --jobs 2,4,8 [--mixed-tp]
    .venv/bin/python benchmarks/multi_ceiling.py rows controlplane/sim/scenarios/multi-*.yaml
    .venv/bin/python benchmarks/multi_ceiling.py curve controlplane/sim/scenarios/multi-2jobs.yaml --units 1,2,4,8,12

`ceiling`: the scenario run with every job at its maximum (`rollout_gpus`) from its arrival to the end, as if
the pool were unlimited, under `pearl` (the same batches, trainers and trace-free pool), its trained tokens
over the real scenario's GPU-hours, beside `static`'s cost efficiency. No sharing policy can train more than
that: it is an upper bound on `pearl / static` (capacity is in fact shared, so the true optimum is lower).

`draws`: scenarios drawn, not tuned (`controlplane.sim.draws`), one per seed and job count: every sharing
policy side by side, the ceiling, and the ratios issue 35's targets are about, one JSON line per draw and the
medians (`--seeds 101-104 --jobs 2,4,8`; pick seeds never run before).

`rows`: the same figures for scenario files (BENCHMARKS.md's multi-job table).

`curve`: each distinct job (model, workload, trainer) alone on a constant pool of n units, for the scenario's
duration: the simulated step time (the truth), the mean rollout makespan and trainer update, and the job's own
fitted predictor's makespan at n (what the arbiter's curve is built from, `sim.multi.MultiSimulation._curve`).
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from typing import Any

from controlplane.core.policies import names
from controlplane.core.policies.base import best_makespan
from controlplane.core.sharing import SHARING_NAMES, Sharing
from controlplane.sim.cluster import Simulation
from controlplane.sim.draws import draw_jobs_scenario
from controlplane.sim.multi import MultiResult, compare_multi, job_scenario, run_multi
from controlplane.sim.scenario import Scenario, load_scenario_file, scenario_from_dict
from controlplane.sim.traces import AvailabilityTrace


def ceiling(sc: Scenario, static: MultiResult | None = None) -> dict[str, Any]:
    static = static or run_multi(sc, "static")
    most = sum(j.rollout_gpus for j in sc.jobs)
    unlimited = replace(
        sc,
        cluster=replace(sc.cluster, reserved_gpus=most, preemptible_gpus=0),
        trace=AvailabilityTrace((0.0,), (most,), name="unlimited"),
    )
    top = run_multi(unlimited, "pearl")
    ce = top.trained_tokens / static.gpu_hours
    return {
        "scenario": sc.name,
        "static_cost_efficiency": round(static.cost_efficiency, 1),
        "ceiling_cost_efficiency": round(ce, 1),
        "ceiling_over_static": round(ce / static.cost_efficiency, 3),
        "jobs": {
            n: {
                "static_steps": static.jobs[n].steps,
                "ceiling_steps": top.jobs[n].steps,
                "static_step_s": static.jobs[n].step_time_s,
                "ceiling_step_s": top.jobs[n].step_time_s,
            }
            for n in static.jobs
        },
    }


def curve(sc: Scenario, units: list[int]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[Any] = set()
    for i, spec in enumerate(sc.jobs):
        key = (spec.model, spec.workload, spec.training_gpus)
        if key in seen:
            continue
        seen.add(key)
        for n in units:
            js = job_scenario(sc, spec, i)
            gpus = n * js.cluster.tp
            js = replace(
                js,
                cluster=replace(js.cluster, reserved_gpus=gpus),
                trace=AvailabilityTrace((0.0,), (gpus,), name="constant"),
                duration_s=sc.duration_s,
            )
            sim = Simulation(js, names.PEARL)
            r = sim.run()
            trained = [s for s in sim.steps if s.train_end_s > 0]
            warm = js.engine.warmup_steps
            step = None
            if len(trained) - 1 > warm:
                step = (trained[-1].train_end_s - trained[warm].train_end_s) / (len(trained) - 1 - warm)
            fp = sim.policy.tracker.fitted()
            out.append(
                {
                    "job": spec.name,
                    "model": spec.model,
                    "units": n,
                    "steps": len(trained),
                    "step_s": None if step is None else round(step, 1),
                    "rollout_s": r.rollout_s_mean,
                    "train_s": r.train_s_mean,
                    "predicted_makespan_s": round(best_makespan(fp.workload, fp.coefficients, n), 1),
                    "own_borrowed_gpu_s": round(r.borrowed_gpu_s),
                }
            )
    return out


def row(sc: Scenario) -> dict[str, Any]:
    """One scenario: pearl's cost efficiency over each baseline's, the fairness figures and the ceiling."""
    res = compare_multi(sc, list(SHARING_NAMES))
    pearl, static = res.pop(Sharing.PEARL.value), res[Sharing.STATIC.value]
    summary = pearl.summary(static)
    vs = [j["vs_static"] for j in summary["jobs"].values() if j["vs_static"] is not None]
    top = ceiling(sc, static)
    return {
        "scenario": sc.name,
        "jobs": len(sc.jobs),
        **{
            f"pearl_over_{p}": round(pearl.cost_efficiency / r.cost_efficiency, 3) if r.cost_efficiency else None
            for p, r in res.items()
        },
        "pearl_over_static_prorated": round(pearl.cost_efficiency_prorated / static.cost_efficiency_prorated, 3)
        if static.cost_efficiency_prorated
        else None,
        "ceiling_over_static": top["ceiling_over_static"],
        "jain": summary["jain"],
        "lowest_job_vs_static": min(vs) if vs else None,
        "misses": summary["misses"],
    }


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("ceiling", "curve", "draws", "rows"))
    ap.add_argument("scenario_files", nargs="*")
    ap.add_argument("--units", default="1,2,4,8,12")
    ap.add_argument("--seeds", default="101-104", help="draws: a seed or a range lo-hi")
    ap.add_argument("--jobs", default="2,4,8", help="draws: job counts, each drawn for every seed")
    ap.add_argument("--mixed-tp", action="store_true", help="draws: each Qwen3-8B job at TP 1 or 2, drawn")
    a = ap.parse_args()
    if a.what == "rows":  # BENCHMARKS.md's multi-job table
        for f in a.scenario_files:
            print(json.dumps(row(load_scenario_file(f))), flush=True)
        return
    if a.what == "draws":
        drawn = []
        for n in [int(x) for x in a.jobs.split(",")]:
            for seed in _seeds(a.seeds):
                doc = draw_jobs_scenario(seed, n, mixed_tp=a.mixed_tp)
                drawn.append(row(scenario_from_dict(doc, source=f"draw {seed}")))
                print(json.dumps(drawn[-1]), flush=True)
        keys = [k for k in drawn[0] if k not in ("scenario", "jobs")]
        medians = {k: round(statistics.median(r[k] for r in drawn if r[k] is not None), 4) for k in keys}
        print(json.dumps({"draws": len(drawn), "median": medians}), flush=True)
        return
    for f in a.scenario_files:
        sc = load_scenario_file(f)
        if a.what == "ceiling":
            print(json.dumps(ceiling(sc)), flush=True)
        else:
            for point in curve(sc, [int(x) for x in a.units.split(",")]):
                print(json.dumps(point), flush=True)


if __name__ == "__main__":
    main()
