"""How much can any division of rollout units gain on a multi-job scenario (issue 35)? Two measurements:

    .venv/bin/python benchmarks/multi_ceiling.py ceiling controlplane/sim/scenarios/multi-2jobs.yaml [...]
    .venv/bin/python benchmarks/multi_ceiling.py curve controlplane/sim/scenarios/multi-2jobs.yaml --units 1,2,4,8,12

`ceiling`: the scenario run with every job at its maximum (`rollout_gpus`) from its arrival to the end, as if
the pool were unlimited, under `pearl` (the same batches, trainers and trace-free pool), its trained tokens
over the real scenario's GPU-hours, beside `static`'s cost efficiency. No sharing policy can train more than
that: it is an upper bound on `pearl / static` (capacity is in fact shared, so the true optimum is lower).

`curve`: each distinct job (model, workload, trainer) alone on a constant pool of n units, for the scenario's
duration: the simulated step time (the truth), the mean rollout makespan and trainer update, and the job's own
fitted predictor's makespan at n (what the arbiter's curve is built from, `sim.multi.MultiSimulation._curve`).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

from controlplane.core.policies import names
from controlplane.core.policies.base import best_makespan
from controlplane.sim.cluster import Simulation
from controlplane.sim.multi import job_scenario, run_multi
from controlplane.sim.scenario import Scenario, load_scenario_file
from controlplane.sim.traces import AvailabilityTrace


def ceiling(sc: Scenario) -> dict[str, Any]:
    static = run_multi(sc, "static")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("ceiling", "curve"))
    ap.add_argument("scenario_files", nargs="+")
    ap.add_argument("--units", default="1,2,4,8,12")
    a = ap.parse_args()
    for f in a.scenario_files:
        sc = load_scenario_file(f)
        if a.what == "ceiling":
            print(json.dumps(ceiling(sc)), flush=True)
        else:
            for row in curve(sc, [int(x) for x in a.units.split(",")]):
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
