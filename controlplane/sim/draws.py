"""Multi-job scenarios drawn, not tuned (issue 35: its targets hold "on scenarios you have not tuned to").

`draw_jobs_scenario(seed, n_jobs)` draws each job's model, trainer, batch, GRPO group, maximum length, rollout
cap, arrival and end from fixed ranges, on a cluster that grows with the number of jobs: per job, the paper's §7
rollout pool (4 reserved + a Bamboo segment of up to 12 preemptible GPUs, `PAPER_SEGMENTS`). The ranges are the
multi-job digest's recommended evaluation (docs/research: Qwen3-8B and Qwen3-30B-A3B, maximum tokens 8K-32K,
arrivals all at once or staggered) and the shipped scenarios' (trainers of 8 or 16 GPUs as in §7, batches
32-128 as in the §7 sensitivity study); the workload's per-turn inputs are `CALIBRATED_WORKLOAD`'s. Every job
has weight 1 (the `static` reference is an equal split, so a weighted job's share is not its fair split).
A draw is whatever the seed gives: `benchmarks/multi_ceiling.py draws` runs seeds never looked at before.
With `mixed_tp`, each Qwen3-8B job's TP is drawn too (1 or 2; Qwen3-30B-A3B stays at the paper's 2) from a
stream of its own, so the rest of the draw is the same seed's without it (the two compare pairwise).
"""

from __future__ import annotations

import random
from typing import Any

from controlplane.sim.calibration import CALIBRATED_WORKLOAD
from controlplane.sim.traces import PAPER_SEGMENTS

MODELS = ("qwen3-8b", "qwen3-30b-a3b")
SEGMENTS = ("seg1", "seg2", "seg3")
DURATION_S = 3600
LATEST_ARRIVAL_S = DURATION_S // 2  # staggered arrivals come in the first half of the run


def draw_jobs_scenario(seed: int, n_jobs: int, *, mixed_tp: bool = False) -> dict[str, Any]:
    """A `jobs:` scenario document (as a scenario file holds it) drawn from `seed`."""
    if n_jobs < 1:
        raise ValueError("n_jobs must be >= 1")
    rng = random.Random(seed)
    tp_rng = random.Random(f"{seed}-tp")
    seg = rng.choice(SEGMENTS)
    pool = PAPER_SEGMENTS[seg]  # one job's rollout pool, times the number of jobs
    reserved, preemptible = pool.reserved_gpus * n_jobs, pool.max_preemptible * n_jobs
    staggered = rng.random() < 0.5
    jobs: list[dict[str, Any]] = []
    for i in range(n_jobs):
        job: dict[str, Any] = {
            "name": f"j{i}",
            "model": rng.choice(MODELS),
            "training_gpus": rng.choice((8, 16)),
            "workload": {
                "batch_size": rng.choice((32, 64, 128)),
                "group_size": rng.choice((8, 16)),
                "max_length": rng.choice((8192, 16384, 32768)),
                **CALIBRATED_WORKLOAD,
            },
            "arrival_s": round(rng.uniform(0, LATEST_ARRIVAL_S), 1) if staggered and i else 0.0,
            "rollout_gpus": rng.choice((16, 24, 32)),
        }
        if rng.random() < 0.25:  # a guarantee at a higher priority (the reserved pool holds every one: 4 each)
            job |= {"priority": 1, "min_rollout_gpus": 4}
        if rng.random() < 0.25:  # it ends early: its units go back to the others
            job["steps"] = rng.choice((4, 8))
        if mixed_tp and job["model"] == "qwen3-8b":
            job["tp"] = tp_rng.choice((1, 2))
        jobs.append(job)
    models = sorted({j["model"] for j in jobs})
    tps = f" at TP {', '.join(str(t) for t in sorted({j.get('tp', pool.tp) for j in jobs}))}" if mixed_tp else ""
    return {
        "name": f"multi-random-{'mixedtp-' if mixed_tp else ''}{n_jobs}jobs-s{seed}",
        "description": f"Random draw (seed {seed}, controlplane/sim/draws.py): {n_jobs} jobs of {', '.join(models)}"
        f"{tps}; "
        f"trainers, batches, groups, maximum lengths, caps, guarantees, ends and "
        f"{f'staggered arrivals in [0, {LATEST_ARRIVAL_S}] s' if staggered else 'arrivals at 0 s'} drawn, not tuned; "
        f"{reserved} reserved + <={preemptible} preemptible H800 (Bamboo {seg} x{n_jobs})",
        "cluster": {"reserved_gpus": reserved, "preemptible_gpus": preemptible, "hardware": "H800", "tp": pool.tp},
        "trace": {"file": f"bamboo-{seg}.csv", "scale": n_jobs},
        "duration_s": DURATION_S,
        "seed": seed,
        "jobs": jobs,
    }


__all__ = ["draw_jobs_scenario"]
