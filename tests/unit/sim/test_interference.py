"""PEARL measures the PD interference from engine telemetry (component A): where prefill next to
running decodes costs more than the roofline's additive model, the colocated closed form pays for it
and a disaggregated split, which has none, is found. A what-if engine (`mixed_prefill_penalty`), never
a shipped scenario."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from controlplane.sim.cluster import run_policy
from controlplane.sim.scenario import ClusterSpec, get_scenario
from controlplane.sim.traces import AvailabilityTrace


def _replay(penalty: float):
    """Qwen3-30B-A3B, 8 TP2 workers held constant (the paper's §1 crossover pool), batch 32."""
    variants: dict[str, str | dict[str, Any]] = {
        "pearl-fixed": {"base": "pearl", "overrides": {"borrowing": False}},
        "8C": {"base": "pearl", "overrides": {"borrowing": False, "force_mode": "colocated"}},
    }
    base = get_scenario("paper-qwen3-30b-a3b-seg1")
    sc = replace(
        base,
        name="interference",
        cluster=ClusterSpec(training_gpus=16, reserved_gpus=16, preemptible_gpus=0),
        trace=AvailabilityTrace((0.0,), (16,)),
        duration_s=1800.0,
        policies=tuple(variants),
        variants=variants,
        workload=replace(base.workload, batch_size=32),
        engine=replace(base.engine, mixed_prefill_penalty=penalty),
    )
    return run_policy(sc, "pearl-fixed"), run_policy(sc, "8C")


def test_pearl_finds_disaggregation_when_prefill_interference_is_real():
    pearl, coloc = _replay(2.0)
    later = [s for s in pearl.step_stats if s.step >= 3]
    assert later and all(s.mode == "disaggregated" for s in later), [s.config_label for s in pearl.step_stats]
    steps = {s.step: s.makespan_s for s in coloc.step_stats}
    paired = [(s.makespan_s, steps[s.step]) for s in later if s.step in steps]
    assert statistics.median(p / c for p, c in paired) < 0.99  # and it is faster there, same batches
    assert pearl.lost_tokens == 0


def test_at_the_roofline_interference_pearl_stays_colocated():
    pearl, _ = _replay(1.0)
    assert all(s.mode == "colocated" for s in pearl.step_stats), [s.config_label for s in pearl.step_stats]
