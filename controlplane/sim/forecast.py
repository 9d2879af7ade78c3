"""Honest predictor figures: the step-start forecast at constant resources, per mode.

`predictor_mape` of a run (cluster.RunResult) is the *elastic* figure: elapsed time plus (R/B)·the
prediction of the last configuration-changing decision, so much of a late "prediction" is elapsed
time already known. This module scores what the decision engine actually relies on: the makespan
forecast at the start of a step, for a step that then runs with constant resources (no borrowing,
no trace change, no transition in flight), separately for

* **own mode**: the forecast of the configuration that ran, against its simulated makespan;
* **other mode**: the forecast (made at the same moment, from the same fitted profile) of the best
  configuration of the mode *not* running, against the makespan of the very same batch run in that
  configuration (a paired run pinned to it by an exact override; every run draws the same batches
  from (seed, step)).

    forecast_accuracy(get_scenario("ablation-qwen3-30b-a3b-8gpu"))
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from controlplane.core.policies import names
from controlplane.core.state import Configuration, Mode
from controlplane.sim.cluster import RunResult, Simulation
from controlplane.sim.scenario import Scenario


def _pin_overrides(label: str) -> dict[str, Any]:
    cfg = Configuration.parse(label)
    if cfg.prefill_hardware:  # a typed configuration of a mixed pool: run exactly it
        return {"borrowing": False, "force_configuration": label}
    if cfg.mode is Mode.COLOCATED:
        return {"borrowing": False, "force_mode": "colocated"}
    return {"borrowing": False, "force_ratio": [cfg.n_prefill, cfg.n_decode], "exact_ratio": True}


def _run(scenario: Scenario, name: str, overrides: dict[str, Any], seed: int | None, base: str) -> RunResult:
    sc = replace(scenario, variants={**scenario.variants, name: {"base": base, "overrides": overrides}})
    return Simulation(sc, name, seed=seed).run()


def _mape(pairs: list[tuple[float, float]]) -> float | None:
    errs = [abs(p - a) / a for p, a in pairs if a > 0 and p > 0]
    return round(100.0 * sum(errs) / len(errs), 3) if errs else None


def forecast_accuracy(scenario: Scenario, *, seed: int | None = None, policy: str = names.PEARL) -> dict[str, Any]:
    """Own-mode and other-mode MAPE of the step-start forecast on `scenario` with borrowing off.

    Returns {"own": {mode: mape}, "other": {mode: mape}, "n_own": {...}, "n_other": {...},
    "pairs": [...]} where the mode is the one *forecast* (for "other": the mode not running)."""
    warm = scenario.engine.warmup_steps
    base = _run(scenario, "_forecast_own", {"borrowing": False}, seed, policy)
    steps = [s for s in base.step_stats[warm:] if s.stable and s.predicted_at_start_s and s.end_s > 0]
    own: dict[str, list[tuple[float, float]]] = {"colocated": [], "disaggregated": []}
    for s in steps:
        if s.mode in own:
            own[s.mode].append((float(s.predicted_at_start_s or 0.0), s.makespan_s))
    other: dict[str, list[tuple[float, float]]] = {"colocated": [], "disaggregated": []}
    pairs: list[dict[str, Any]] = []
    pinned: dict[str, dict[int, float]] = {}
    for s in steps:
        if not s.other_label or s.predicted_other_s is None:
            continue
        if s.other_label not in pinned:
            r = _run(scenario, f"_forecast_pin_{s.other_label}", _pin_overrides(s.other_label), seed, policy)
            pinned[s.other_label] = {
                x.step: x.makespan_s
                for x in r.step_stats
                if x.end_s > 0 and x.stable and x.config_label == s.other_label
            }
        actual = pinned[s.other_label].get(s.step)
        if actual is None:
            continue
        mode = str(Configuration.parse(s.other_label).mode)
        other[mode].append((s.predicted_other_s, actual))
        pairs.append(
            {
                "step": s.step,
                "running": s.config_label,
                "forecast": s.other_label,
                "predicted_s": round(s.predicted_other_s, 2),
                "actual_s": round(actual, 2),
            }
        )
    return {
        "scenario": scenario.name,
        "own": {m: _mape(v) for m, v in own.items()},
        "other": {m: _mape(v) for m, v in other.items()},
        "n_own": {m: len(v) for m, v in own.items()},
        "n_other": {m: len(v) for m, v in other.items()},
        "elastic_mape": base.predictor_mape,
        "pairs": pairs,
    }


__all__ = ["forecast_accuracy"]
