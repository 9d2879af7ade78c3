"""Run the simulator's paper evaluation and write the "## Simulator" section of BENCHMARKS.md.

    .venv/bin/python benchmarks/sim_report.py            # everything (~11 min on 2 cores)
    .venv/bin/python benchmarks/sim_report.py --no-write # print the section, leave BENCHMARKS.md alone

Outputs: the Markdown section (tables beside the paper's numbers) and an HTML report with plotly
charts inlined (benchmarks/out/sim_report.html; the folder is git-ignored).
"""

from __future__ import annotations

import argparse
import platform
import re
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controlplane.core.policies.names import (  # noqa: E402
    BEST_HOMOGENEOUS,
    ELASTIC,
    FIXED,
    FIXED_LARGE,
    ORACLE,
    PEARL,
    RLBOOST,
)
from controlplane.sim.cli import compare  # noqa: E402
from controlplane.sim.cluster import RunResult, run_policy, window_throughput  # noqa: E402
from controlplane.sim.report import figures, render_html, summary_table  # noqa: E402
from controlplane.sim.scenario import ClusterSpec, Scenario, get_scenario  # noqa: E402
from controlplane.sim.traces import AvailabilityTrace  # noqa: E402

MODELS = ("qwen3-8b", "qwen3-30b-a3b")
SEGS = ("seg1", "seg2", "seg3")
HEADING = "## Simulator: PEARL vs ROLL, ROLL-Large, RLBoost+, oracle"

PREFACE = f"""
Reproduce: `.venv/bin/python benchmarks/sim_report.py` (writes this section and `benchmarks/out/sim_report.html`);
one scenario: `.venv/bin/python -m controlplane.sim compare --scenario paper-qwen3-8b-seg2 [--json] [--html out.html]`.
Virtual time, seed 0, 2 h per paper scenario. The simulator is a driver of core: the RL loop
(`core.loop.RolloutLoop`: steps, routing, Training Begin / return / update / Training Finished, staleness,
telemetry) and placement (`core.placement.place`) are the code the live control plane and rollout driver run;
`sim/world.py` simulates only engines, KV links, environments, GPUs coming and going and transition timings.
Policies are core's (`make_policy`), learning online from the loop's and engines' telemetry.
ROLL = `{FIXED}` (4 rollout GPUs), ROLL-Large = `{FIXED_LARGE}` (14/10/12 GPUs), RLBoost+ = `{RLBOOST}` (RLBoost's
Algorithms 1 and 2 adapted to asynchronous agentic RL: `core.policies.RLBoostPolicy` and the loop's `jsq` dispatch),
B-only = `{ELASTIC}` (adaptive borrowing of the training GPUs for nearly the whole idle window plus every preemptible
GPU, colocated: PEARL's component B without A and C), oracle = chooses by simulated outcome (`sim/oracle.py`: forks
the simulation at every step start, Training Finished and capacity change and runs each candidate to the end of
the step).
"""

ANALYSIS = """
**What agrees with the paper.** Three of the four §1 input statistics are in band (prefill token share 96.6% vs
96.68%; prefill time share 17.0% vs 26.48%, band 16.5–36.5%; decode 251 tok/s/GPU vs ~400, band 200–800). PEARL is
≥ 0.98 × max(RLBoost+, ROLL-Large) on all six paper scenarios (0.989–1.007) and all six varied ones (0.993–1.009),
between 0.9 × oracle and the oracle on the common steps everywhere (0.964–0.988; varied 0.963–0.986), with zero
return-deadline misses and zero lost tokens on every run. PEARL/ROLL is within ±25% of the paper on four of six
scenarios (MoE above dense, as in the paper). Intra-scale borrowing (B) is the big lever, as in Fig. 7: +38% / +64%
at 4 rollout GPUs (paper +94% / +118%), shrinking with the pool; forced disaggregation at 4 GPUs costs (−7.8% /
−1.0%; paper −20.6% / −30.9%). RLBoost+ and B-only are within 1.4% of each other: with staleness 1 both borrow the
training GPUs for nearly the whole idle window, which is where the throughput is.

**What does not, and why.**
1. *PEARL vs RLBoost+ is ≈ 0 (−0.0% … +1.6%), not +5.9 … +36.3%.* What PEARL has beyond a well-borrowing baseline is
   worth about nothing at this operating point (`coloc` equals PEARL, B-only is within 0.3 points). C, the gate: the
   window always pays (T_toggle ≈ 9 s against 250–300 s rollouts). A, the PD decision: at constant resources the
   best split is −0.3% / −0.8% / −2.7% against colocation at batch 32 / 64 / 96 (paper +9.7% … −6.1%), and removing
   prefix reuse or the tool-call tail moves it by a point at most (−2.3% … +1.0%). In core's roofline (calibrated to
   single-engine TPOT anchors, core/PROFILES.md) the decode concentration a split costs cancels the prefill it
   removes; the paper's +9.7% needs more interference than an additive roofline gives, and the one aggregated anchor
   (vLLM, Qwen3-30B-A3B-FP8 on H200) fits the additive model, so no unsourced term is added. With twice the
   interference (the what-if columns) disaggregation wins at every batch (the opposite of the paper's trend), and
   PEARL's decision tracks the replay's best: in Table 2 a split within one worker of the paper's in 5 of 6 rows, at
   most 0.9% from the replay's best elsewhere. At the calibrated point Table 2's selection matches the paper's in 0 of 6
   rows (PEARL and the replay mostly select colocation) and the crossover has the paper's sign only at batch 96.
2. *Fig. 2a's DP scaling is 4.3% / 2.0% (paper 10.3% / 8.9%).* The slowest trajectory's tool calls, which no GPU
   count shortens, set the makespan (in one step at 16 GPUs, 161 s of the slowest trajectory's 261 s were tool
   calls); without the tail the same pools shorten by 10.7% / 4.9%. The paper's rollout is far more GPU-bound
   (4.5–5.7× its training step; ours 250 s against 219 s). We keep the sourced tail and report the gap.
3. *PEARL/ROLL is below the band on both Seg2 scenarios* (1.53× against ≥ 1.63×; 1.75× against ≥ 1.82×): Seg2 has
   the fewest preemptible GPUs, and with a tool-bound rollout extra GPUs buy less (reason 2). With twice the
   interference both are in band (1.95×, 2.22×).
4. *The predictor*: 11.9–13.4% MAPE for the running mode and 12.1–18.1% for the other at constant resources
   (targets 15% / 25%: met); 20.6% over every configuration of the Table 2 replay (median 14.1%); on the paper
   scenarios nothing runs at constant resources, so only the elastic figure (10.2–13.4%) is shown. On the 8-GPU
   Qwen3-30B-A3B pool no split is feasible (prefill cannot keep up, or decode KV does not fit).
5. *Ablation A at 8–16 GPUs is +0.0%* (paper +8–15%): PEARL runs colocation there, as ROLL does (reason 1).
6. *Sensitivity*: PEARL vs RLBoost+ is −0.3% … +1.8% across batch 32–128 and length 8K–32K (paper +5.3 … +63.7% and
   +9.8 … +26.5%), for reason 1.
7. *Cost*: `compare` of a paper scenario with the five non-oracle policies takes 8.5–9.3 s (target 15 s); the
   forking oracle brings it to 20–24 s.
"""


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


def within(value: float, lo: float, hi: float, tol: float = 0.25) -> str:
    """'yes' if value is in [lo, hi] widened by ±tol relative."""
    return "yes" if lo * (1 - tol) <= value <= hi * (1 + tol) else "no"


cpu_timings: dict[str, float] = {}


def _mape_cell(r: RunResult) -> str:
    st = r.predictor_mape_start or {}
    parts = [f"{m[0].upper()} {v:.1f}" for m, v in st.items() if v is not None]
    return (", ".join(parts) or "–") + f" / {r.predictor_mape:.1f}" if r.predictor_mape is not None else "–"


def paper_section(md: list[str], html_sections: list, timings: dict[str, float]) -> dict[str, dict[str, RunResult]]:
    all_res: dict[str, dict[str, RunResult]] = {}
    md.append("### End-to-end (paper Fig. 5): throughput = (rollout-generated + training tokens) / step time\n")
    md.append(
        "MAPE % = step-start forecast at constant resources per mode (C colocated, D disaggregated; steps with no "
        "transition or borrow change in flight) / the elastic figure (elapsed + (R/B)·prediction of the last "
        "reconfiguring decision). Steps P/R = PEARL / ROLL training steps in 2 h.\n"
    )
    md.append(
        "| scenario | ROLL tok/s | ROLL-Large | RLBoost+ | B-only | PEARL | oracle | PEARL/ROLL (paper) "
        "| PEARL vs RLBoost+ (paper) | PEARL/oracle | steps P/R | misses | lost | MAPE % | compare wall (CPU) s |"
    )
    md.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in MODELS:
        for seg in SEGS:
            name = f"paper-{model}-{seg}"
            sc = get_scenario(name)
            t0, c0 = time.perf_counter(), time.process_time()
            res = compare(sc, record_timeline=True)
            wall = time.perf_counter() - t0
            timings[name] = wall
            cpu_timings[name] = time.process_time() - c0
            all_res[name] = res
            th = {p: r.throughput_tok_s for p, r in res.items()}
            roll_lo, roll_hi = sc.paper["pearl_over_roll"]
            vs_rb = sc.paper["pearl_over_rlboost"]
            r_roll = th[PEARL] / th[FIXED]
            r_rb = th[PEARL] / th[RLBOOST] - 1
            p = res[PEARL]
            md.append(
                f"| {name} | {th[FIXED]:,.0f} | {th[FIXED_LARGE]:,.0f} | {th[RLBOOST]:,.0f} | {th[ELASTIC]:,.0f} "
                f"| {th[PEARL]:,.0f} | {th[ORACLE]:,.0f} | **{r_roll:.2f}×** ({roll_lo}–{roll_hi}×) "
                f"| **{pct(r_rb)}** ({pct(vs_rb)}) | {th[PEARL] / th[ORACLE]:.3f} | {p.steps}/{res[FIXED].steps} "
                f"| {p.return_deadline_misses} | {p.lost_tokens} | {_mape_cell(p)} "
                f"| {wall:.1f} ({cpu_timings[name]:.1f}) |"
            )
            body = f"<p>{sc.description}</p>" + summary_table(res)
            html_sections.append((name, body, figures(sc, res)))
    md.append("")
    return all_res


def paired_ratio(a: RunResult, b: RunResult, warm: int) -> float:
    """a's throughput over b's on the training steps both completed (the same batches: the window of
    each run's own figure ends at its last trained step, so one extra step can move it by a step's
    share; the bound is checked on the common steps)."""
    return paired_steps_ratio(a.step_stats, b.step_stats, warm)


def paired_steps_ratio(a: list[Any], b: list[Any], warm: int) -> float:
    """`paired_ratio` over two runs' step figures (`StepStats`), as a worker process hands them back."""
    ta = [s for s in a if s.train_end_s > 0]
    tb = [s for s in b if s.train_end_s > 0]
    last = min(len(ta), len(tb)) - 1
    return window_throughput(ta, warm, last) / window_throughput(tb, warm, last)


def _checks_row(name: str, res: dict[str, RunResult], roll: tuple[float, float] | None) -> str:
    th = {p: r.throughput_tok_s for p, r in res.items()}
    p = res[PEARL]
    base = max(th.get(RLBOOST, 0.0), th.get(FIXED_LARGE, 0.0))
    cells = [name]
    if roll is not None:
        cells.append(within(th[PEARL] / th[FIXED], *roll))
    cells += [f"{th[PEARL] / base:.3f} {'yes' if th[PEARL] >= 0.98 * base else 'no'}"]
    if ORACLE in th:
        po = paired_ratio(p, res[ORACLE], get_scenario(name).engine.warmup_steps)
        cells.append(f"{th[PEARL] / th[ORACLE]:.3f} / {po:.3f} {'yes' if 0.9 <= po <= 1.0 else 'no'}")
    cells.append("yes" if p.return_deadline_misses == 0 and p.lost_tokens == 0 else "no")
    return "| " + " | ".join(cells) + " |"


def ratio_checks(md: list[str], all_res: dict[str, dict[str, RunResult]]) -> None:
    md.append(
        "Targets (issue 11): PEARL/ROLL within ±25% of the paper's; PEARL ≥ 0.98 × max(RLBoost+, ROLL-Large); "
        "0.9 × oracle ≤ PEARL ≤ oracle; zero misses and zero lost tokens for PEARL. PEARL/oracle is given as each "
        "run's own figure / on the training steps both completed (same batches), and checked on the latter: "
        "each run's window ends at its last trained step, so a run that fits one more step in 2 h can gain or "
        "lose a fraction of a percent from where its window ends.\n"
    )
    md.append(
        "| scenario | PEARL/ROLL within ±25% | PEARL / max(RLBoost+, ROLL-Large) ≥ 0.98 | 0.9 ≤ PEARL/oracle ≤ 1 "
        "(own / same steps) | PEARL misses/lost = 0 |"
    )
    md.append("|---|---|---|---|---|")
    for name, res in all_res.items():
        sc = get_scenario(name)
        md.append(_checks_row(name, res, tuple(sc.paper["pearl_over_roll"])))
    md.append("")


def varied_section(md: list[str]) -> None:
    """Scenarios outside the shipped set: other seeds, rotated traces, other batch and group sizes."""
    md.append("### Varied scenarios (not in the paper): seeds, trace rotations, batch and group sizes\n")
    md.append(
        "| scenario | variation | PEARL tok/s | RLBoost+ | ROLL-Large | oracle "
        "| PEARL / max(RLBoost+, ROLL-Large) ≥ 0.98 "
        "| 0.9 ≤ PEARL/oracle ≤ 1 (own / same steps) | misses/lost = 0 |"
    )
    md.append("|---|---|---|---|---|---|---|---|---|")
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("paper-qwen3-8b-seg1", "seed 7", {"seed": 7}),
        ("paper-qwen3-30b-a3b-seg2", "seed 11", {"seed": 11}),
        ("paper-qwen3-8b-seg2", "trace rotated by 1 h", {"rotate": 3600.0}),
        ("paper-qwen3-30b-a3b-seg3", "trace rotated by 40 min", {"rotate": 2400.0}),
        ("paper-qwen3-8b-seg1", "batch 32, group 8", {"batch": 32, "group": 8}),
        ("paper-qwen3-30b-a3b-seg1", "batch 96, group 8", {"batch": 96, "group": 8}),
    ]
    for name, label, var in cases:
        sc = get_scenario(name)
        if "seed" in var:
            sc = sc.with_seed(var["seed"])
        if "rotate" in var:
            sc = replace(sc, trace=_rotate(sc.trace, var["rotate"], sc.duration_s))
        if "batch" in var:
            sc = replace(sc, workload=replace(sc.workload, batch_size=var["batch"], group_size=var["group"]))
        res = compare(sc, [PEARL, RLBOOST, FIXED_LARGE, ORACLE])
        th = {p: r.throughput_tok_s for p, r in res.items()}
        row = _checks_row(name, res, None)
        cells = row.strip("|").split("|")
        md.append(
            f"| {name} | {label} | {th[PEARL]:,.0f} | {th[RLBOOST]:,.0f} | {th[FIXED_LARGE]:,.0f} "
            f"| {th[ORACLE]:,.0f} |" + "|".join(cells[1:]) + "|"
        )
    md.append("")


def _rotate(trace: AvailabilityTrace, shift: float, duration: float) -> AvailabilityTrace:
    """The trace started `shift` seconds later, wrapping around at `duration`."""
    pts = [((t - shift) % duration, g) for t, g in zip(trace.times, trace.gpus) if t < duration]
    pts.append((0.0, trace.at(shift)))
    pts = sorted(dict(sorted(pts)).items())
    return AvailabilityTrace(tuple(float(t) for t, _ in pts), tuple(int(g) for _, g in pts), name=f"{trace.name}-rot")


def calibration_section(md: list[str]) -> None:
    from controlplane.sim.calibration import motivation

    m = motivation(get_scenario("paper-qwen3-8b-seg1"))
    st = m["stats"]
    md.append("### Calibration of inputs (paper §1 motivation, never Fig. 5 / Fig. 7 / Table 2)\n")
    md.append(
        "Measured by `python -m controlplane.sim calibrate` (`sim/calibration.py`) at the shipped workload and engine: "
        "the §1 split on 8 colocated TP2 workers (Qwen3-30B-A3B, batch 64, ROLL), Fig. 2a on fixed colocated pools of "
        "16/24/32 GPUs (Qwen3-8B, 8 training GPUs). Rollout s: "
        + ", ".join(f"{g} GPUs {t:.0f}" for g, t in m["rollout_s"].items())
        + ".\n"
    )
    md.append("| statistic | paper | sim | target band | in band | parameter that sets it | source |")
    md.append("|---|---|---|---|---|---|---|")
    rows = [
        (
            "prefill share of tokens (every prompt token through prefill, cache hits included)",
            "prefill_token_share",
            "96.68%",
            "response_tokens_mean 550 (set against this statistic), observation_tokens_mean 700, 32K cap",
            "r: Kimi Tool&Agent trace 182 output / 8.6K input (Mooncake FAST'25 Table 2), "
            "SWE-bench Pro ~110–230 visible "
            "tokens per call; observation ~0.7–1.0K tokens/step: SWE-bench Pro (nilenso report), SWE-Gym Table 8",
        ),
        (
            "prefill share of tokens (computed only, cache hits excluded)",
            "computed_prefill_token_share",
            "(undefined)",
            "prefix_reuse 0.5; caches flushed at each weight update",
            "SGLang update_weights flush; RLBoost flush_cache=True",
        ),
        (
            "prefill share of colocated GPU time",
            "prefill_time_share",
            "26.48%",
            "prefix_reuse 0.5 (set against this statistic)",
            "history rewriting: SWE-agent LastNObservations; Qwen3 template <think> stripping; "
            "hit rate vs Mooncake 59%",
        ),
        (
            "decode tok/s/GPU between prefill insertions",
            "decode_tok_s_per_gpu",
            "~400",
            "(emerges: decode concurrency from r, T_env and prefill); "
            "core roofline (t0, TP all-reduce, MoE reads/dispatch)",
            "core/PROFILES.md (pd_anchors §4.3–4.4 single-engine TPOT anchors)",
        ),
        ("Fig. 2a: rollout shortened 16→24 GPUs", "dp_16_to_24", "10.3%", "(emerges; no parameter set for it)", "—"),
        ("Fig. 2a: rollout shortened 24→32 GPUs", "dp_24_to_32", "8.9%", "(emerges; no parameter set for it)", "—"),
        (
            "prefix-cache hit rate",
            "cache_hit_rate",
            "(not reported)",
            "prefix_reuse, flush, KV pressure",
            "Mooncake Tool&Agent trace 59% (FAST'25 Table 2)",
        ),
    ]
    from controlplane.sim.calibration import TARGETS

    for label, key, pv, param, src in rows:
        v = st[key]
        band = TARGETS.get(key)
        is_pct = key != "decode_tok_s_per_gpu"
        fmt = (lambda x: f"{100 * x:.1f}%") if is_pct else (lambda x: f"{x:.0f}")
        band_s = f"{fmt(band[0])}–{fmt(band[1])}" if band else "–"
        ok = ("yes" if band[0] <= v <= band[1] else "no") if band else "–"
        md.append(f"| {label} | {pv} | {fmt(v)} | {band_s} | {ok} | {param} | {src} |")
    from controlplane.sim.calibration import dp_scaling

    base = get_scenario("paper-qwen3-8b-seg1")
    no_tail = dp_scaling(replace(base, workload=replace(base.workload, env_tail_prob=0.0)))
    md.append(
        f"\nWhat-if for Fig. 2a (not the calibrated point): without the tool-call tail (`env_tail_prob` 0, every other "
        f"input as shipped) the same pools shorten the rollout by {100 * no_tail['dp_16_to_24']:.1f}% and "
        f"{100 * no_tail['dp_24_to_32']:.1f}% (rollout s: "
        + ", ".join(f"{g} GPUs {t:.0f}" for g, t in no_tail["rollout_s"].items())
        + "): the slowest trajectory's tool calls, which no GPU count shortens, are what flattens the scaling."
    )
    md.append(
        "\nEnvironment latency (not a §1 statistic; source: SWE-bench Pro tool times, nilenso report, and SkyRL's "
        "RL recipe): log-normal body with median 0.5 s (σ 1.0), a Pareto tail (x_m 10 s, α 0.6) on 3.5% of steps "
        "(calls over 10 s: 2.4–3.7% of steps), capped at 60 s per command (SkyRL mini-SWE). `engine_slowdown` is 1.0 "
        "everywhere (the uniform 3.0 is gone).\n"
    )


def forecast_section(md: list[str]) -> None:
    from controlplane.sim.forecast import forecast_accuracy

    md.append("### Predictor: step-start forecast at constant resources, per mode\n")
    md.append(
        "PEARL with borrowing off on a fixed pool (no transition or borrow change in flight), steps after warm-up. "
        "Own mode = the forecast of the configuration that ran vs its makespan; other mode = the forecast, made at "
        "the same moment, of the best configuration of the mode not running vs the same batch's makespan in a run "
        "pinned to that configuration (`sim/forecast.py`). The elastic figure is the old metric, for contrast.\n"
    )
    md.append(
        "| scenario | own: colocated MAPE % (n) | own: disaggregated (n) | other: colocated (n) "
        "| other: disaggregated (n) "
        "| elastic MAPE % |"
    )
    md.append("|---|---|---|---|---|---|")
    models = ("qwen3-8b", "qwen3-30b-a3b")
    sixteen = [get_scenario(f"ablation-{m}-16gpu") for m in models]
    doubled = [  # 16 workers: the 16-GPU pool doubled (no such ablation in the paper)
        replace(sc, name=f"{m}-32gpu", cluster=replace(sc.cluster, reserved_gpus=32), trace=sc.trace.constant(32))
        for m, sc in zip(models, sixteen, strict=True)
    ]
    for sc in [get_scenario(f"ablation-{m}-8gpu") for m in models] + sixteen + doubled:
        r = forecast_accuracy(sc)

        def cell(kind: str, mode: str, r: dict[str, Any] = r) -> str:
            v, n = r[kind][mode], r[f"n_{kind}"][mode]
            return f"{v:.1f} ({n})" if v is not None else f"– ({n})"

        md.append(
            f"| {sc.name} | {cell('own', 'colocated')} | {cell('own', 'disaggregated')} | {cell('other', 'colocated')} "
            f"| {cell('other', 'disaggregated')} "
            f"| {'–' if r['elastic_mape'] is None else format(r['elastic_mape'], '.1f')} |"
        )
    md.append("")


def whatif_section(md: list[str]) -> None:
    """Which mechanism accounts for PEARL vs RLBoost+: PEARL with parts switched off (see the analysis)."""
    md.append("### What-if (not the PEARL result): PEARL vs RLBoost+ by mechanism\n")
    md.append(
        f"Throughput vs RLBoost+ on the same scenario: `{PEARL}` as shipped; `no-gate` = Eq. 7 off (borrow every idle "
        "window); `coloc` = PD adaptation off (mode forced colocated); `no-trial` = the untried-mode safeguard off; "
        f"B-only = `{ELASTIC}`.\n"
    )
    md.append(
        "The last column re-runs PEARL and RLBoost+ with twice the prefill-decode interference "
        "(`mixed_prefill_penalty` 2, a what-if with no source: a prefill chunk next to running decodes costs 2× "
        "its roofline time); PEARL/ROLL there in brackets.\n"
    )
    md.append("| scenario | PEARL | no-gate | coloc | no-trial | B-only | PEARL, interference ×2 (PEARL/ROLL) |")
    md.append("|---|---|---|---|---|---|---|")
    variants: dict[str, str | dict[str, Any]] = {
        "no-gate": {"base": PEARL, "gate": False},
        "coloc": {"base": PEARL, "overrides": {"force_mode": "colocated"}},
        "no-trial": {"base": PEARL, "options": {"mode_trial": False}},
    }
    for name in ("paper-qwen3-8b-seg2", "paper-qwen3-30b-a3b-seg2", "sens-batch-32"):
        sc = get_scenario(name)
        sc = replace(sc, variants={**sc.variants, **variants})
        res = compare(sc, [RLBOOST, PEARL, "no-gate", "coloc", "no-trial", ELASTIC])
        base = res[RLBOOST].throughput_tok_s
        hot = compare(replace(sc, engine=replace(sc.engine, mixed_prefill_penalty=2.0)), [RLBOOST, PEARL, FIXED])
        th = {k: r.throughput_tok_s for k, r in hot.items()}
        md.append(
            f"| {name} | "
            + " | ".join(
                pct(res[v].throughput_tok_s / base - 1) for v in (PEARL, "no-gate", "coloc", "no-trial", ELASTIC)
            )
            + f" | {pct(th[PEARL] / th[RLBOOST] - 1)} ({th[PEARL] / th[FIXED]:.2f}×) |"
        )
    md.append("")


def ablation_section(md: list[str]) -> None:
    md.append(
        "### Ablation (paper Fig. 7): 16 training GPUs, fixed rollout GPUs, normalised to ROLL on the same GPUs\n"
    )
    md.append(
        "A = optimal PD ratio only (borrowing off; at 4 GPUs disaggregation forced, as in the paper), "
        "B = ungated borrowing, C = the Eq. 7 gate.\n"
    )
    md.append("| model | rollout GPUs | A sim (paper) | A+B sim (paper) | A+B+C sim (paper) | PEARL config at step 3 |")
    md.append("|---|---|---|---|---|---|")
    for model in MODELS:
        for g in (4, 8, 12, 16):
            sc = get_scenario(f"ablation-{model}-{g}gpu")
            res = compare(sc)
            base = res[FIXED].throughput_tok_s
            cells = []
            for v in ("A", "A+B", "A+B+C"):
                paper = sc.paper[v]
                ps = pct(paper) if isinstance(paper, float) else f"{pct(paper[0])}..{pct(paper[1])}"
                cells.append(f"{pct(res[v].throughput_tok_s / base - 1)} ({ps})")
            cfg = next((s.config_label for s in res["A+B+C"].step_stats if s.step == 3), "")
            md.append(f"| {model} | {g} | " + " | ".join(cells) + f" | {cfg} |")
    md.append("")


def sensitivity_section(md: list[str]) -> None:
    md.append(
        "### Workload sensitivity (paper §7): Qwen3-8B, 16 training + 8 dedicated rollout GPUs, PEARL vs RLBoost+\n"
    )
    md.append("| sweep | value | RLBoost+ tok/s | PEARL tok/s | PEARL vs RLBoost+ | B-only tok/s | paper range |")
    md.append("|---|---|---|---|---|---|---|")
    for b in (32, 64, 96, 128):
        sc = get_scenario(f"sens-batch-{b}")
        res = compare(sc)
        md.append(
            f"| batch | {b} | {res[RLBOOST].throughput_tok_s:,.0f} | {res[PEARL].throughput_tok_s:,.0f} "
            f"| {pct(res[PEARL].throughput_tok_s / res[RLBOOST].throughput_tok_s - 1)} "
            f"| {res[ELASTIC].throughput_tok_s:,.0f} | +5.3..+63.7% |"
        )
    for k in (8, 16, 24, 32):
        sc = get_scenario(f"sens-maxlen-{k}k")
        res = compare(sc)
        md.append(
            f"| max length | {k}K | {res[RLBOOST].throughput_tok_s:,.0f} | {res[PEARL].throughput_tok_s:,.0f} "
            f"| {pct(res[PEARL].throughput_tok_s / res[RLBOOST].throughput_tok_s - 1)} "
            f"| {res[ELASTIC].throughput_tok_s:,.0f} | +9.8..+26.5% |"
        )
    md.append("")


def _replay_scenario(model: str, workers: int, variants: dict) -> Scenario:
    base = get_scenario("paper-qwen3-8b-seg1" if model == "qwen3-8b" else "paper-qwen3-30b-a3b-seg1")
    g = 2 * workers
    return replace(
        base,
        name=f"replay-{workers}w",
        cluster=ClusterSpec(training_gpus=16, reserved_gpus=g, preemptible_gpus=0),
        trace=AvailabilityTrace((0.0,), (g,)),
        duration_s=2700.0,
        policies=tuple(variants),
        variants=variants,
    )


def replay_every_configuration(
    model: str,
    n: int,
    *,
    batch: int | None = None,
    penalty: float = 1.0,
    points: list[tuple[str, float, float]] | None = None,
) -> tuple[str, dict[str, float]]:
    """n workers held constant, borrowing off: PEARL's configuration at step 3, and every configuration
    (nC and each split) replayed on the same batches, as its mean makespan over steps 1-4. `points`
    collects each configuration's step-start forecasts (steps ≥ 2) against its makespans."""
    variants: dict = {
        "pearl-fixed-budget": {"base": PEARL, "overrides": {"borrowing": False}},
        f"{n}C": {"base": PEARL, "overrides": {"borrowing": False, "force_mode": "colocated"}},
    }
    for p in range(1, n):
        variants[f"{p}P{n - p}D"] = {"base": PEARL, "overrides": {"borrowing": False, "force_ratio": [p, n - p]}}
    sc = _replay_scenario(model, n, variants)
    sc = replace(
        sc,
        workload=replace(sc.workload, batch_size=batch or sc.workload.batch_size),
        engine=replace(sc.engine, mixed_prefill_penalty=penalty),
    )
    selected = next((s.config_label for s in run_policy(sc, "pearl-fixed-budget").step_stats if s.step == 3), "?")
    means: dict[str, float] = {}
    for v in variants:
        if v == "pearl-fixed-budget":
            continue
        stats = run_policy(sc, v).step_stats
        ms = [s.makespan_s for s in stats if 1 <= s.step <= 4]
        if ms:
            means[v] = statistics.mean(ms)
        if points is not None:
            points.extend(
                (v, s.predicted_at_start_s, s.makespan_s) for s in stats if s.step >= 2 and s.predicted_at_start_s
            )
    return selected, means


def table2_section(md: list[str], pred_points: list[tuple[str, float, float]]) -> None:
    """Constant-resource replay of every configuration (paper Table 2) vs what PEARL selects."""
    md.append("### PD-ratio selection (paper Table 2): Qwen3-8B, constant resources, every configuration replayed\n")
    md.append(
        "Empirical best = lowest mean simulated makespan over steps 1-4 (same batches for every configuration); "
        "selected = PEARL's decision (borrowing off, resources held constant) at step 3. What-if columns: the same "
        "replay with twice the prefill-decode interference (`mixed_prefill_penalty` 2, no source; not the "
        "calibrated model), which PEARL's tracker measures from the engines' prefill records.\n"
    )
    md.append(
        "| dedicated GPUs | overlap | workers | selected (sim) | empirical best (sim) | gap | paper selected / best "
        "| interference ×2: selected / best, gap |"
    )
    md.append("|---|---|---|---|---|---|---|---|")
    paper = {
        (10, False): "2P3D / 2P3D",
        (10, True): "4P9D / 5P8D",
        (12, False): "3P3D / 3P3D",
        (12, True): "4P10D / 4P10D",
        (16, False): "3P5D / 3P5D",
        (16, True): "4P12D / 4P12D",
    }

    def replay(n: int, penalty: float, points: list[tuple[str, float, float]] | None) -> tuple[str, str, float]:
        selected, means = replay_every_configuration("qwen3-8b", n, penalty=penalty, points=points)
        best = min(means, key=means.__getitem__)
        return selected, best, means.get(selected, float("nan")) / means[best] - 1

    for ded in (10, 12, 16):
        for overlap in (False, True):
            n = ded // 2 + (8 if overlap else 0)
            selected, best, gap = replay(n, 1.0, pred_points)
            hot_sel, hot_best, hot_gap = replay(n, 2.0, None)
            md.append(
                f"| {ded} | {'yes' if overlap else 'no'} | {n} | {selected} | {best} | {pct(gap)} "
                f"| {paper[(ded, overlap)]} | {hot_sel} / {hot_best}, {pct(hot_gap)} |"
            )
    errs = [abs(p - a) / a for _, p, a in pred_points]
    if errs:
        md.append(
            f"\nPredictor on these constant-resource replays (steps ≥ 2, {len(errs)} steps over every configuration): "
            f"MAPE {100 * statistics.mean(errs):.1f}%, median {100 * statistics.median(errs):.1f}%."
        )
    md.append("")


def crossover_section(md: list[str]) -> None:
    """Paper §1: Qwen3-30B-A3B on 16 GPUs (8 TP2 workers): best disaggregation vs colocation by batch size."""
    md.append("### Mode crossover (paper §1): Qwen3-30B-A3B, 16 GPUs = 8 workers, constant resources\n")
    md.append(
        "What-if column: the same replay with twice the prefill-decode interference (`mixed_prefill_penalty` 2, "
        "no source; not the calibrated model).\n"
    )
    md.append("PEARL = its configuration at step 3 with borrowing off (resources held constant), as in Table 2.\n")
    md.append(
        "| batch | 8C makespan s | best split | its makespan s | best disaggregated vs colocation | PEARL | paper "
        "| interference ×2: best split, vs colocation | interference ×2: PEARL |"
    )
    md.append("|---|---|---|---|---|---|---|---|---|")
    paper = {32: "+9.7%", 64: "(5P3D best split at BS64)", 96: "−6.1%"}

    def replay(b: int, penalty: float) -> tuple[dict[str, float], str, str]:
        selected, means = replay_every_configuration("qwen3-30b-a3b", 8, batch=b, penalty=penalty)
        dis = {k: v for k, v in means.items() if k != "8C"}
        return means, min(dis, key=dis.__getitem__), selected

    for b in (32, 64, 96):
        means, best, sel = replay(b, 1.0)
        hot, hot_best, hot_sel = replay(b, 2.0)
        md.append(
            f"| {b} | {means['8C']:.0f} | {best} | {means[best]:.0f} | {pct(means['8C'] / means[best] - 1)} | {sel} "
            f"| {paper[b]} | {hot_best} {pct(hot['8C'] / hot[hot_best] - 1)} | {hot_sel} |"
        )
    md.append("")


# Mixed pools (issue 23): the closed forms over several chip types. Pool snapshots of TP2 workers: the paper's
# elastic pool all H800, the same all H20, and Bamboo-like mixes (whatever chips are free) of H800 / H20 / A100.
HETERO_POOLS: tuple[tuple[str, dict[str, int]], ...] = (
    ("all H800 (8)", {"H800": 8}),
    ("all H20 (8)", {"H20": 8}),
    ("mixed 4 H800 + 4 H20", {"H800": 4, "H20": 4}),
    ("mixed 2 H800 + 6 H20", {"H800": 2, "H20": 6}),
    ("mixed 6 H800 + 2 H20", {"H800": 6, "H20": 2}),
    ("mixed 4 H800 + 2 H20 + 2 A100", {"H800": 4, "H20": 2, "A100": 2}),
    ("mixed 3 H800 + 3 H20 + 4 A100", {"H800": 3, "H20": 3, "A100": 4}),
)


def hetero_rows(model: str, pool: dict[str, int], kv_cost: float = 1.0) -> dict[str, Any]:
    """PEARL's choice on one mixed pool (closed forms, the SWE-bench prior at BS64), beside the
    homogeneous-minded spread (RLBoost+ / B-only: every worker colocated) and the best single type.
    `kv_cost` scales every KV link's time (0: free hand-off, 2: twice as slow)."""
    from controlplane.core.decision import best_homogeneous, decide_mixed
    from controlplane.core.predictor import predict_colocated_balanced, predict_colocated_spread, swe_bench_workload
    from controlplane.core.profiles import get_profile, link_bytes_per_s

    w = swe_bench_workload(64)
    scale = float("inf") if kv_cost == 0 else 1.0 / kv_cost
    co = {}
    for h in pool:
        c = get_profile(h, model).coefficients(
            new_tokens=w.new_prompt_tokens, prefix=w.prefix_tokens, mean_context=w.mean_context
        )
        co[h] = replace(c, bandwidth=c.bandwidth * scale)
    d = decide_mixed(w, co, pool, lambda a, b: link_bytes_per_s(a, b) * scale)
    homo = best_homogeneous(list(d.candidates))
    pools = [(co[h], k) for h, k in pool.items()]
    spread, balanced = predict_colocated_spread(w, pools), predict_colocated_balanced(w, pools)
    chosen = next(c for c in d.candidates if c.configuration == d.configuration)
    return {
        "pearl": d.label,
        "pearl_s": d.predicted_makespan_s,
        "parts": (chosen.prefill_s, chosen.kv_transfer_s, chosen.decode_s),
        "spread_s": spread.makespan_s if spread.feasible else float("nan"),
        "balanced_s": balanced.makespan_s if balanced.feasible else float("nan"),
        "homo": homo.label if homo else "-",
        "homo_s": homo.makespan_s if homo else float("nan"),
        "reason": d.reason,
    }


def hetero_section(md: list[str]) -> None:
    md.append("### Mixed pools (issue 23): the decision over H800 / H20 / A100, closed forms only\n")
    md.append(
        "Predicted rollout makespan of one BS64 SWE-bench step (the prior: Eq. 1–3 over each chip's roofline, "
        "`core.decision.decide_mixed`; closed forms only, the simulated runs follow below). RLBoost+ / B-only = "
        "every worker colocated (homogeneous-minded): 'balanced' "
        "gives each chip type the share of the batch that makes all types finish together (what RLBoost+'s "
        "join-the-shortest-queue dispatch and the sticky router's rate-weighted homing tend to; "
        "`predict_colocated_balanced`, PEARL's price of a mixed colocated pool), 'even' spreads it evenly (a "
        "router homing by count alone, the slowest type sets the makespan; `predict_colocated_spread`); "
        "best-homogeneous = the best candidate on one chip type; the oracle over "
        "closed forms is PEARL's choice by construction, so it is not a separate column. Parts = prefill, KV "
        "transfer, decode path (s); the step also carries 50 s of tool time.\n"
    )
    md.append(
        "| model | pool | PEARL | s | parts P / KV / D | RLBoost+ balanced s | even s | best homogeneous | s "
        "| PEARL vs balanced | KV free | KV ×2 |"
    )
    md.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for model in MODELS:
        for name, pool in HETERO_POOLS:
            r = hetero_rows(model, pool)
            free, slow = hetero_rows(model, pool, 0.0), hetero_rows(model, pool, 2.0)
            p, kv, dd = r["parts"]
            gain = r["balanced_s"] / r["pearl_s"] - 1.0
            md.append(
                f"| {model} | {name} | {r['pearl']} | {r['pearl_s']:.1f} | {p:.1f} / {kv:.2f} / {dd:.1f} "
                f"| {r['balanced_s']:.1f} | {r['spread_s']:.1f} | {r['homo']} | {r['homo_s']:.1f} | {gain:+.1%} "
                f"| {free['pearl']} {free['pearl_s']:.1f} | {slow['pearl']} {slow['pearl_s']:.1f} |"
            )
    md.append("")
    hetero_sim_section(md)
    hetero_forecast_section(md)


# (a) all H800 (the paper's seg1 scenario), (b) all-H20 rollout pool, (c) the mixed H800 / H20 / A100 elastic pool
HETERO_KINDS: tuple[tuple[str, str], ...] = (
    ("a", "paper-{m}-seg1"),
    ("b", "hetero-{m}-seg1-h20"),
    ("c", "hetero-{m}-seg1-mixed"),
)
HETERO_SCENARIOS: tuple[str, ...] = tuple(k.format(m=m) for m in MODELS for _, k in HETERO_KINDS)
HETERO_POLICIES: tuple[str, ...] = (PEARL, RLBOOST, ELASTIC, BEST_HOMOGENEOUS, ORACLE)
KV_WHATIF_POLICIES: tuple[str, ...] = (PEARL, RLBOOST, BEST_HOMOGENEOUS)


def _is_mixed(name: str) -> bool:
    return get_scenario(name).cluster.mixed


def _run_job(job: tuple[str, str, float]) -> tuple[tuple[str, str, float], dict[str, Any]]:
    """One simulated run (a worker process of the hetero section): its summary, the configurations it ran at
    step starts, the ones it placed at any signal, and the decision reason of its most placed one."""
    from controlplane.sim.cluster import Simulation

    name, policy, kv = job
    sc = get_scenario(name)
    if kv != 1.0:
        sc = replace(sc, engine=replace(sc.engine, kv_transfer_scale=kv))
    t0 = time.process_time()
    sim = Simulation(sc, policy)
    placed: dict[str, int] = {}
    reasons: dict[str, str] = {}
    on_event = sim.policy.on_event

    def tally(ctx: Any) -> Any:
        a = on_event(ctx)
        label = a.target.label() if a.target.total > 0 else ""
        if label and (ctx.current is None or ctx.current.label() != label):
            placed[label] = placed.get(label, 0) + 1
            reasons.setdefault(label, a.decision.reason)
        return a

    sim.policy.on_event = tally  # type: ignore[method-assign]
    r = sim.run()
    configs: dict[str, int] = {}
    for st in r.step_stats[sc.engine.warmup_steps :]:
        configs[st.config_label] = configs.get(st.config_label, 0) + 1
    return job, {
        "thr": r.throughput_tok_s,
        "misses": r.return_deadline_misses,
        "lost": r.lost_tokens,
        "borrow": r.borrowed_gpu_s,
        "rollout": r.rollout_s_mean,
        "configs": configs,
        "placed": placed,
        "reasons": reasons,
        "cpu": time.process_time() - t0,
        "mape": r.predictor_mape_start,
        "steps": r.step_stats,
    }


def hetero_runs(jobs: list[tuple[str, str, float]], procs: int = 1) -> dict[tuple[str, str, float], dict[str, Any]]:
    if procs <= 1:
        return dict(_run_job(j) for j in jobs)
    from multiprocessing import get_context

    with get_context("fork").Pool(procs) as pool:
        return dict(pool.map(_run_job, jobs, chunksize=1))


def _top(counts: dict[str, int], k: int = 3) -> str:
    return ", ".join(f"`{c}` ×{n}" for c, n in sorted(counts.items(), key=lambda x: -x[1])[:k])


def hetero_sim_section(md: list[str], procs: int = 1) -> None:
    """Issue 23, simulated: (a) all H800, (b) the all-H20 rollout pool and (c) the mixed H800/H20/A100 elastic pool,
    each beside the 16-GPU H800 trainer, both models; PEARL, RLBoost+, B-only, best-homogeneous and the forking
    oracle, same seed and trace; what-ifs with the KV hand-off free and twice as slow on (b) and (c)."""
    jobs = [(n, p, 1.0) for n in HETERO_SCENARIOS for p in HETERO_POLICIES if p != BEST_HOMOGENEOUS or _is_mixed(n)]
    whatif = [n for n in HETERO_SCENARIOS if _is_mixed(n)]
    jobs += [(n, p, kv) for n in whatif for p in KV_WHATIF_POLICIES for kv in (0.0, 2.0)]
    t0 = time.perf_counter()
    res = hetero_runs(jobs, procs)
    wall = time.perf_counter() - t0
    cpu = sum(r["cpu"] for r in res.values())
    md.append(
        "Simulated (issue 23): the paper's seg1 cluster (Bamboo seg1 trace, 4 reserved + <=12 preemptible rollout "
        "GPUs, 16 H800 training GPUs whose borrowed overlap workers run on H800). (a) `paper-*-seg1`: all H800. "
        "(b) `hetero-*-seg1-h20`: reserved and elastic GPUs all H20. (c) `hetero-*-seg1-mixed`: reserved H800, the "
        "k-th elastic TP2 group H20, H800, A100 in turn (the rotation is our choice; Bamboo records no chip types). "
        "Every unit's engine is timed by its own chip's roofline profile, KV crosses the link joining the two chips. "
        "Best-homogeneous = PEARL confined to one chip type (the others left idle; on (a) it is PEARL); oracle = the "
        "forking oracle over typed candidates. Throughput tok/s as in the paper section; misses / lost = the most "
        "return-deadline misses and lost tokens of any policy's run. PEARL / oracle is each run's own figure / on "
        "the training steps both completed (the same batches), checked on the latter: each run's window ends at "
        "its last trained step, so an oracle that fits one more (slow, small) step into 2 h can show a lower "
        "figure of its own while every one of its steps trained earlier.\n"
    )
    md.append(
        "| scenario | RLBoost+ | B-only | best-homog. | PEARL | oracle | PEARL / best baseline "
        "| PEARL / oracle (own / same steps) ≤ 1 | misses | lost | PEARL's step-start configurations (after warm-up) "
        "| PEARL CPU s | oracle CPU s |"
    )
    md.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in HETERO_SCENARIOS:
        runs = {p: res[(n, p, 1.0)] for p in HETERO_POLICIES if (n, p, 1.0) in res}
        th = {p: r["thr"] for p, r in runs.items()}
        homo = th.get(BEST_HOMOGENEOUS)
        best = max(th[RLBOOST], th[ELASTIC], homo or 0.0)
        pr = runs[PEARL]
        po = paired_steps_ratio(pr["steps"], runs[ORACLE]["steps"], get_scenario(n).engine.warmup_steps)
        md.append(
            f"| {n} | {th[RLBOOST]:,.0f} | {th[ELASTIC]:,.0f} | {f'{homo:,.0f}' if homo else '= PEARL'} "
            f"| {th[PEARL]:,.0f} | {th[ORACLE]:,.0f} | {th[PEARL] / best:.3f} "
            f"| {th[PEARL] / th[ORACLE]:.3f} / {po:.3f} {'yes' if po <= 1.0 else 'no'} "
            f"| {max(r['misses'] for r in runs.values())} | {max(r['lost'] for r in runs.values())} "
            f"| {_top(pr['configs'])} | {pr['cpu']:.0f} | {runs[ORACLE]['cpu']:.0f} |"
        )
    md.append("")
    md.append(
        "What PEARL placed (every signal: step starts, Training Begin / Finished, capacity changes), the three most "
        "frequent configurations, and the decision engine's reason the first time it placed the most frequent one:\n"
    )
    md.append("| scenario | PEARL placed | why (first decision placing the most frequent) |")
    md.append("|---|---|---|")
    for n in HETERO_SCENARIOS:
        pr = res[(n, PEARL, 1.0)]
        top = max(pr["placed"].items(), key=lambda x: x[1])[0] if pr["placed"] else ""
        why = pr["reasons"].get(top, "").replace("|", "/")
        md.append(f"| {n} | {_top(pr['placed'])} | {why} |")
    md.append("")
    md.append(
        "What-if (not the sourced model): every KV hand-off free (×0) or twice as slow (×2), in the world; the "
        "policies' predictors see it only through the tracker's bandwidth fit.\n"
    )
    md.append("| scenario | KV | RLBoost+ | best-homog. | PEARL | PEARL / best baseline | PEARL placed |")
    md.append("|---|---|---|---|---|---|---|")
    for n in whatif:
        for kv in (0.0, 1.0, 2.0):
            th = {p: res[(n, p, kv)]["thr"] for p in KV_WHATIF_POLICIES}
            md.append(
                f"| {n} | ×{kv:g} | {th[RLBOOST]:,.0f} | {th[BEST_HOMOGENEOUS]:,.0f} | {th[PEARL]:,.0f} "
                f"| {th[PEARL] / max(th[RLBOOST], th[BEST_HOMOGENEOUS]):.3f} | {_top(res[(n, PEARL, kv)]['placed'])} |"
            )
    md.append("")
    load = __import__("os").getloadavg()
    md.append(
        f"All {len(jobs)} runs: {wall:.0f} s wall, {cpu:.0f} s process CPU, in {procs} process(es) on "
        f"{platform.machine()} ({__import__('os').cpu_count()} cores shared with other jobs; load average at the end "
        f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}).\n"
    )


# constant mixed pools for the predictor's figures: 4 H800 reserved (2 workers) + 8 elastic GPUs (4 workers) of these
HETERO_FORECAST_POOLS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("qwen3-8b", ("H20",)),
    ("qwen3-30b-a3b", ("H20",)),
    ("qwen3-8b", ("A100",)),
    ("qwen3-30b-a3b", ("A100",)),
    ("qwen3-8b", ("H20", "A100")),
)
HETERO_FORECAST_CHIPS: tuple[str, ...] = ("H20", "A100")


def hetero_forecast_section(md: list[str]) -> None:
    """The step-start forecast on constant mixed pools (borrowing off), per chip mix: the running mode's MAPE and
    the other mode's (a paired run pinned to the forecast typed configuration, `sim.forecast`)."""
    from controlplane.sim.forecast import forecast_accuracy

    md.append(
        "Predictor on constant mixed pools (issue 23): 2 H800 workers (4 reserved GPUs) + 4 workers of the elastic "
        "chip(s) (8 GPUs, constant trace; two chips: alternating), borrowing off, 2 h, PEARL; step-start forecast "
        "MAPE (steps after warm-up, constant resources) of the mode running and of the best configuration of the "
        "other mode, scored against the same batches run pinned to it (`sim/forecast.py`). Targets: <= 15% running, "
        "<= 25% not running.\n"
    )
    md.append(FORECAST_HEADER)
    for model, chips in HETERO_FORECAST_POOLS:
        base = get_scenario(f"hetero-{model}-seg1-mixed")
        cl = replace(base.cluster, reserved_gpus=4, preemptible_gpus=8, elastic_hardware=chips)
        sc = replace(base, name=f"const-{model}-{'+'.join(chips)}", cluster=cl, trace=base.trace.constant(12))
        md.append(_forecast_row(model, f"2 H800 + 4 {'/'.join(chips)}", forecast_accuracy(sc)))
    md.append("")
    md.append(
        "Per chip type: the same measure on a constant pool of one elastic chip type alone (6 workers, 12 GPUs), "
        "each chip's own engine and tracker.\n"
    )
    md.append(FORECAST_HEADER)
    for model, chip in [(m, c) for m in MODELS for c in HETERO_FORECAST_CHIPS]:
        base = get_scenario(f"hetero-{model}-seg1-mixed")
        cl = replace(base.cluster, hardware=chip, reserved_gpus=12, preemptible_gpus=0, elastic_hardware=())
        sc = replace(base, name=f"const-{model}-{chip}", cluster=cl, trace=base.trace.constant(12))
        md.append(_forecast_row(model, f"6 {chip}", forecast_accuracy(sc)))
    md.append("")


FORECAST_HEADER = (
    "| model | pool | running (steps) | MAPE running | other mode forecast (steps) | MAPE other |\n"
    "|---|---|---|---|---|---|"
)


def _forecast_row(model: str, pool: str, r: dict[str, Any]) -> str:
    """One row of a forecast table from `sim.forecast.forecast_accuracy`: the mode that ran most and the other."""
    running = max(r["n_own"], key=lambda m: r["n_own"][m])
    other = "colocated" if running == "disaggregated" else "disaggregated"
    ran: dict[str, int] = {}
    fc: dict[str, int] = {}
    for p in r["pairs"]:
        ran[p["running"]] = ran.get(p["running"], 0) + 1
        fc[p["forecast"]] = fc.get(p["forecast"], 0) + 1

    def pct_or_dash(v: float | None) -> str:
        return "—" if v is None else f"{v:.1f}%"

    return (
        f"| {model} | {pool} | {_top(ran, 2) or running} ({r['n_own'][running]}) "
        f"| {pct_or_dash(r['own'][running])} | {_top(fc, 2) or '—'} ({r['n_other'][other]}) "
        f"| {pct_or_dash(r['other'][other])} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument(
        "--skip",
        default="",
        help="comma list of: calibration,forecast,varied,whatif,ablation,sensitivity,table2,crossover,hetero",
    )
    ap.add_argument(
        "--from-saved",
        action="store_true",
        help="write benchmarks/out/sim_section.md (the last run) with the current analysis text",
    )
    ap.add_argument(
        "--only-hetero",
        action="store_true",
        help="only the mixed-pool section: print it, save benchmarks/out/hetero_section.md (BENCHMARKS.md untouched)",
    )
    args = ap.parse_args()
    if args.only_hetero:
        only: list[str] = []
        hetero_section(only)
        text = "\n".join(only)
        (ROOT / "benchmarks" / "out").mkdir(parents=True, exist_ok=True)
        (ROOT / "benchmarks" / "out" / "hetero_section.md").write_text(text)
        print(text)
        return 0
    if args.from_saved:
        write_section((ROOT / "benchmarks" / "out" / "sim_section.md").read_text())
        return 0
    skip = set(filter(None, args.skip.split(",")))
    t_all = time.perf_counter()
    md: list[str] = []
    html_sections: list = []
    timings: dict[str, float] = {}
    if "calibration" not in skip:
        calibration_section(md)
    all_res = paper_section(md, html_sections, timings)
    ratio_checks(md, all_res)
    if "varied" not in skip:
        varied_section(md)
    if "forecast" not in skip:
        forecast_section(md)
    if "whatif" not in skip:
        whatif_section(md)
    if "ablation" not in skip:
        ablation_section(md)
    if "sensitivity" not in skip:
        sensitivity_section(md)
    pred_points: list[tuple[str, float, float]] = []
    if "table2" not in skip:
        table2_section(md, pred_points)
    if "crossover" not in skip:
        crossover_section(md)
    if "hetero" not in skip:
        hetero_section(md)
    load = __import__("os").getloadavg()[0]
    md.append(
        "`compare` per paper scenario (6 policies incl. the forking oracle, 2 h virtual), wall (process CPU) s: "
        + ", ".join(f"{k.replace('paper-', '')} {v:.1f} ({cpu_timings[k]:.1f})" for k, v in timings.items())
        + f"; whole report {time.perf_counter() - t_all:.0f} s on {platform.machine()} "
        f"({__import__('os').cpu_count()} cores shared with other jobs; 1-min load average at the end {load:.1f}).\n"
    )
    section = "\n".join(md)
    out = ROOT / "benchmarks" / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "sim_section.md").write_text(section)
    (out / "sim_report.html").write_text(render_html("PEARL simulator: paper evaluation", html_sections))
    print(section)
    if not args.no_write:
        write_section(section)
    return 0


def write_section(body: str) -> None:
    """Replace only the body of our section in BENCHMARKS.md (between our heading and the next '## ')."""
    path = ROOT / "benchmarks" / "BENCHMARKS.md"
    text = path.read_text()
    preface = PREFACE.strip() + "\n\n"
    pattern = re.compile(r"(^" + re.escape(HEADING) + r"\n)(.*?)(?=^## |\Z)", re.S | re.M)
    if not pattern.search(text):
        raise SystemExit(f"section heading not found in {path}: {HEADING!r}")
    new = pattern.sub(
        lambda m: m.group(1) + "\n" + preface + body.strip() + "\n\n" + ANALYSIS.strip() + "\n\n", text, count=1
    )
    path.write_text(new)


if __name__ == "__main__":
    raise SystemExit(main())
