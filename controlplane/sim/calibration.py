"""The simulator's inputs against the paper's *motivation* measurements (never its results).

PEARL §1 measures, before any of its own mechanisms: (i) under colocation with chunked prefill and
prefix caching (Qwen3-30B-A3B, SWE-bench, 8 TP2 workers) prefill handles 96.68% of the tokens in
26.48% of the time, and decode runs at about 400 tok/s/GPU between prefill insertions; (ii) Fig. 2a
(Qwen3-8B, SWE-bench, 8 training GPUs, a DP-scaled rollout pool, TP and batch fixed): 16 → 24 → 32
rollout GPUs shorten the rollout by 10.3% and then 8.9% (of the 16-GPU time). This module runs the
simulator at those settings with a scenario's workload and engine model and reports the same
statistics, so the calibration table in BENCHMARKS.md can be regenerated:

    python -m controlplane.sim calibrate [--scenario paper-qwen3-8b-seg1] [--json]

Fig. 5, Fig. 7 and Table 2 are what the simulator is *tested* against; nothing here looks at them.

Token share definition: the paper does not say whether prompt tokens served from the prefix cache
count as "handled by prefill". We report both: `prefill_token_share` counts every prompt token that
goes through a prefill pass (computed + cache hits, SGLang's #new-token + #cached-token), and
`computed_prefill_token_share` only the computed ones.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from controlplane.core.policies import names
from controlplane.sim.cluster import RunResult, Simulation
from controlplane.sim.scenario import ClusterSpec, Scenario, get_scenario
from controlplane.sim.traces import AvailabilityTrace

# The SWE-like workload, each input from a measured or configured source (docs/research/calibration_sources.md; the
# calibration table in benchmarks/BENCHMARKS.md, Simulator section, lists them with the resulting statistics):
CALIBRATED_WORKLOAD: dict[str, float] = {
    # r per turn is set against §1's prefill token share (96.68%): with the 32K cap and ~0.7K observations per
    # turn, 550 tokens gives 96.6% (every prompt token through prefill). Sources that bracket it: Kimi's
    # Tool&Agent trace (Mooncake FAST'25 Table 2) 182 output tokens per 8.6K input (97.9%), SWE-bench Pro's
    # visible output ~110/230 tokens per call without hidden reasoning; Qwen3's thinking-mode replies are longer.
    # (900, the earlier value, gave 94.7% and a 12.9% prefill time share, below §1's band.)
    "response_tokens_mean": 550.0,
    "observation_tokens_mean": 700.0,  # SWE-bench Pro ~0.7-1.0K tokens per step; SWE-Gym ~0.9K all content per turn
    "env_latency_median_s": 0.5,  # SWE-bench Pro: median tool time per step ~0.5 s
    "env_latency_sigma": 1.0,
    "env_tail_prob": 0.035,  # SWE-bench Pro: calls over 10 s are 2.4-3.7% of steps
    "env_tail_scale_s": 10.0,
    "env_tail_alpha": 0.6,
    "env_latency_cap_s": 60.0,  # SkyRL mini-SWE RL recipe: 60 s per command
    # Set against §1's prefill time share: the fraction of a trajectory's cached context a turn may reuse.
    # Physically: scaffolds that rewrite old observations (SWE-agent LastNObservations breaks prompt caching)
    # or re-render earlier replies (Qwen3's chat template strips <think>). Resulting hit rate ~47%
    # (Mooncake Tool&Agent trace: 59%; Concur: near zero while thrashing).
    "prefix_reuse": 0.5,
}

PAPER = {
    "prefill_token_share": 0.9668,
    "prefill_time_share": 0.2648,
    "decode_tok_s_per_gpu": 400.0,
    "dp_16_to_24": 0.103,
    "dp_24_to_32": 0.089,
}
TARGETS = {  # issue 11: the bands the simulator's inputs must reproduce
    "prefill_token_share": (0.917, 1.0),
    "prefill_time_share": (0.165, 0.365),
    "decode_tok_s_per_gpu": (200.0, 800.0),
    "dp_16_to_24": (0.073, 0.133),
    "dp_24_to_32": (0.059, 0.119),
}


def _constant(sc: Scenario, *, model: str, gpus: int, training_gpus: int, duration_s: float) -> Scenario:
    cl = ClusterSpec(
        training_gpus=training_gpus,
        reserved_gpus=gpus,
        preemptible_gpus=0,
        hardware=sc.cluster.hardware,
        tp=sc.cluster.tp,
    )
    return replace(
        sc,
        name=f"calibration-{model}-{gpus}gpu",
        model=model,
        cluster=cl,
        trace=AvailabilityTrace((0.0,), (gpus,), name=f"constant-{gpus}"),
        duration_s=duration_s,
        policies=(names.FIXED,),
        variants={},
        policy_options={},
    )


def engine_stats(result_sim: Simulation) -> dict[str, float]:
    """Sum of every worker's engine counters (see `core.batching.IterationScheduler.stats`)."""
    out: dict[str, float] = {}
    for slot in result_sim.world.slots.values():
        for k, v in slot.worker.stats.items():
            out[k] = out.get(k, 0) + v
    return out


def split_from_stats(st: dict[str, float], tp: int) -> dict[str, float]:
    """The §1 statistics from summed engine counters."""
    prompt = st["prefill_tokens"] + st["cached_tokens"]
    dec = st["decode_tokens"]
    busy = st["prefill_s"] + st["decode_s"]
    return {
        "prefill_token_share": prompt / (prompt + dec) if prompt + dec else 0.0,
        "computed_prefill_token_share": st["prefill_tokens"] / (st["prefill_tokens"] + dec)
        if st["prefill_tokens"] + dec
        else 0.0,
        "prefill_time_share": st["prefill_s"] / busy if busy else 0.0,
        "decode_tok_s_per_gpu": st["pure_decode_tokens"] / st["pure_decode_s"] / tp if st["pure_decode_s"] else 0.0,
        "cache_hit_rate": st["cached_tokens"] / prompt if prompt else 0.0,
    }


def token_time_split(
    base: Scenario,
    *,
    workers: int = 8,
    batch_size: int = 64,
    duration_s: float = 7200.0,
    model: str = "qwen3-30b-a3b",
    seed: int | None = None,
) -> dict[str, float]:
    """PEARL §1's PD-interference measurement: `workers` colocated TP workers (ROLL), fixed pool."""
    tp = base.cluster.tp
    sc = _constant(
        base, model=model, gpus=workers * tp, training_gpus=base.cluster.training_gpus, duration_s=duration_s
    )
    sc = replace(sc, workload=replace(sc.workload, batch_size=batch_size))
    sim = Simulation(sc, names.FIXED, seed=seed)
    sim.run()
    return split_from_stats(engine_stats(sim), tp)


def dp_scaling(
    base: Scenario,
    *,
    gpus: tuple[int, ...] = (16, 24, 32),
    training_gpus: int = 8,
    duration_s: float = 7200.0,
    model: str = "qwen3-8b",
    seed: int | None = None,
) -> dict[str, Any]:
    """Fig. 2a: mean rollout makespan of a fixed colocated DP pool of each size (TP, batch fixed);
    the reductions are normalised to the first pool's time, as the paper's are."""
    warm = base.engine.warmup_steps
    times: dict[int, float] = {}
    for g in gpus:
        sc = _constant(base, model=model, gpus=g, training_gpus=training_gpus, duration_s=duration_s)
        r: RunResult = Simulation(sc, names.FIXED, seed=seed).run()
        body = [s.makespan_s for s in r.step_stats[warm:]] or [s.makespan_s for s in r.step_stats]
        times[g] = sum(body) / len(body)
    t0 = times[gpus[0]]
    red = {f"dp_{a}_to_{b}": (times[a] - times[b]) / t0 for a, b in itertools.pairwise(gpus)}
    return {"rollout_s": times, **red}


def motivation(base: Scenario | None = None, *, seed: int | None = None) -> dict[str, Any]:
    """Every §1 statistic the calibration table reports, at the scenario's workload and engine model."""
    base = base or get_scenario("paper-qwen3-8b-seg1")
    split = token_time_split(base, seed=seed)
    dp = dp_scaling(base, seed=seed)
    stats = {**split, **{k: v for k, v in dp.items() if k.startswith("dp_")}}
    return {
        "scenario": base.name,
        "stats": stats,
        "rollout_s": dp["rollout_s"],
        "paper": PAPER,
        "within": {k: lo <= stats[k] <= hi for k, (lo, hi) in TARGETS.items()},
    }


__all__ = ["PAPER", "TARGETS", "dp_scaling", "engine_stats", "motivation", "split_from_stats", "token_time_split"]
