"""Run the simulator's paper evaluation and write the "## Simulator" section of BENCHMARKS.md.

    .venv/bin/python benchmarks/sim_report.py            # everything (~3-5 min on 2 cores)
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controlplane.sim.cli import compare  # noqa: E402
from controlplane.sim.cluster import RunResult, run_policy  # noqa: E402
from controlplane.sim.report import figures, render_html, summary_table  # noqa: E402
from controlplane.sim.scenario import ClusterSpec, Scenario, get_scenario  # noqa: E402
from controlplane.sim.traces import AvailabilityTrace  # noqa: E402

MODELS = ("qwen3-8b", "qwen3-30b-a3b")
SEGS = ("seg1", "seg2", "seg3")
HEADING = "## Simulator: PEARL vs ROLL, ROLL-Large, RLBoost+, oracle"

PREFACE = """
Reproduce: `.venv/bin/python benchmarks/sim_report.py` (writes this section and `benchmarks/out/sim_report.html`);
one scenario: `.venv/bin/python -m controlplane.sim compare --scenario paper-qwen3-8b-seg2 [--json] [--html out.html]`.
Virtual time, seed 0, 2 h per paper scenario. The simulator is a driver of core: the RL loop
(`core.loop.RolloutLoop`: steps, routing, Training Begin / return / update / Training Finished, staleness,
telemetry) and placement (`core.placement.place`) are the code the live control plane and rollout driver run;
`sim/world.py` simulates only engines, KV links, environments, GPUs coming and going and transition timings.
Policies are core's (`make_policy`), learning online from the loop's and engines' telemetry.
ROLL = `fixed` (4 rollout GPUs), ROLL-Large = `fixed-large` (14/10/12 GPUs), RLBoost+ = `rlboost+` (RLBoost's
Algorithm 1 adapted to asynchronous RL, `core.policies.RLBoostPolicy`), B-only = `elastic` (ungated borrowing of the
training GPUs for the whole idle window plus every preemptible GPU, colocated: PEARL's component B without A and C;
it was called RLBoost+ before), oracle = chooses by simulated outcome (`sim/oracle.py`: forks the simulation at
every step start, Training Finished and capacity change and runs each candidate to the end of the step).
"""

ANALYSIS = """
**Calibration.** One constant is fitted, and not to a headline: `engine_slowdown` = 3.0 (every simulated
iteration and prefill pass costs 3× core's roofline profile). With the roofline alone, growing a ROLL-style
colocated pool 16 → 24 → 32 GPUs (8 training GPUs, Qwen3-8B) shortens the rollout by 3.4% / 1.5%, because the
makespan sits on the slowest trajectory's critical path; the paper's Fig. 2a measures 10.3% / 8.9%; 3.0 gives
8.4% / 5.5%. The roofline reproduces single-engine TPOT anchors (pd_anchors §4.4), so the factor stands for
what an agentic RL serving stack adds on top (TP2 at 8–32K context, scheduler and tool-call overheads); the
what-if table shows the roofline results next to the calibrated ones. Workload (not fitted to any result):
SWE-like turns of ~1.1K observation and ~0.9K response tokens, 1.2 s median tool latency with a Pareto tail,
most trajectories running into the 32K cap; prefix caches hit unless evicted by KV pressure.

**Moved by the move of the loop and placement into core** (this regeneration against the previous one, same
seeds; `compare --json` of all 22 scenarios before and after): 19 of 22 scenarios' throughputs moved by less than
±1.1% (ROLL and ROLL-Large not at all: static pools take the same path). Three moved more than 2%: the oracle on
8B Seg3 (+2.5%, so PEARL/oracle 1.031 → 1.008), and the 30B 4-GPU ablation's A+B and A+B+C (−2.2%, +88.8% →
+84.6% over ROLL). What changed in the decisions' inputs, each now what the live control plane sees: (a) the
policy context counts only units placement can choose (a unit draining to idle is no longer in the budget; an
overlap worker being returned is neither borrowed nor borrowable) — before, the simulator and the live planner
counted differently; (b) new workers take the lowest free worker slot, as live (slot ids tie-break plans);
(c) the STEP record's configuration is the scheduler's latest target (the loop learns it from `Decided`);
(d) TURN records come when the environment step ends, since a live driver only knows the tool time then —
checked to change nothing: emitting them at generation time with the known tool latency gives identical results
on both moved scenarios; (e) an update is `train_step_s`, then a separate weight publication of
`weight_sync_s` (same total). We did not attribute the two larger moves to one of (a)–(c). The predictor MAPE
figures moved by up to 3.7 points (8B Seg1 11.9% → 15.6%): they score elapsed + (R/B)·prediction from the
last reconfiguring decision, so they move with every reconfiguration time; this metric is replaced by the
step-start forecast in the simulator-fidelity work.

**What agrees with the paper.** PEARL/ROLL is in the paper's direction and within ±25% on all six scenarios
(2.12–2.27× for Qwen3-8B vs 2.17–2.37×; 2.30–2.49× for Qwen3-30B-A3B vs 2.43–2.79×, MoE higher than dense as in
the paper). ROLL-Large is below PEARL everywhere (paper: all six, 8B Seg1 close). PEARL is within 4% of the oracle
on every paper scenario, with zero return-deadline misses and zero lost tokens (conservation is checked, not
assumed: engine-side and trajectory-side token counts are kept separately). Intra-scale borrowing (B) is the
big lever as in the paper: +76% / +85% at 4 rollout GPUs (paper +94% / +118%), +11–17% for 8B at 8–16 GPUs
(paper +16–27%); forced disaggregation at 4 GPUs costs −28% / −22% (paper −21% / −31%). With the tracker's
online makespan correction (core, per mode: observed / predicted) the predictor's MAPE after warm-up is 8–16% on
the paper scenarios.

**What does not, and why.**
1. *PEARL vs RLBoost+ is ≈ 0 (−1.0% … +1.0%), not +5.8–36.3%.* Everything PEARL has beyond RLBoost+ here is
   the PD decision (component A), and in this simulator A is worth nothing: the constant-resource replay of
   every configuration (Table 2 section) finds colocation the empirical best at every size, so the ablation's A
   is 0% at 8–16 GPUs (paper +8–15%). Chunked prefill interferes with decode by only a few percent: the
   prefill share of GPU time is 17% for ROLL and 3% for RLBoost+ at 4–15 workers (paper's motivation: 26.5%),
   because prefix caches keep per-turn prefill to the new ~1.1K tokens. Making prefill heavier (70% prefix
   reuse: 90% of tokens / 23% of ROLL's time are prefill, near the paper's 96.7% / 26.5%) still left PEARL
   −1.5% vs RLBoost+ on 8B Seg2 (measured before the tracker fixes below). The mode-crossover replay
   (Qwen3-30B-A3B, 8 workers) has the paper's trend but not its level: best disaggregation vs colocation goes
   −3.0% → −10.5% from batch 32 to 96 (paper +9.7% → −6.1%), about 12 points lower throughout. A colocated
   chunk iteration here costs decode + prefill-chunk time (weights read twice, if anything over-charging
   colocation), so the paper's PD gain needs an interference or hand-off effect this iteration-level model does
   not produce; which one cannot be told from the paper.
2. *The disaggregated closed form is optimistic here, and nothing corrects it while disaggregation is not run.*
   With 4 dedicated workers at Training Begin (8-GPU ablation, batch-64 / 32K sensitivity point) PEARL picks
   1P3D, which the replay finds slower than 4C, and ends −10.0% behind RLBoost+ there (−13.0% at batch 128).
   The per-mode correction learns only from STEP records, whose mode is the configuration at the end of the
   step (colocated, once the training GPUs are borrowed), so the disaggregated scale stays at the pooled value.
   Fixed in core since the first report: the tracker's K_seq (prompt + S·(ΔL + r) ≈ 50K tokens) is now capped
   at the job's max trajectory length, which removed the batch-96 loss (−18.8% → +0.1%).
3. *The oracle is not a hard upper bound.* It knows future availability and reconfigures for free, but ranks
   configurations with the same predictor and no hysteresis, so it follows the predictor into the
   disaggregated splits of point 2: on 8B Seg1 / Seg3 it is 2.0% / 0.8% below PEARL (PEARL/oracle 1.020 /
   1.008); on the other four PEARL is 0.3–3.8% below it. (Before the K_seq cap those splits were "infeasible"
   and the oracle stayed colocated.)
4. *Predictor MAPE on constant-resource replays: mean 16.8%, median 8.2% (steps ≥ 2, 142 steps).* The first
   corrected step is step 3 (the correction starts once the workload fit has left the prior, after two steps),
   so step 2 carries the raw closed form's error: it runs high (e.g. 8C: 616 s predicted vs 486 s simulated)
   because S·r over-states the slowest trajectory's decode work when long trajectories are length-capped, Eq. 1
   keeps the decode batch at B/N for the whole step although it drains to the stragglers, and T_env is the
   slowest trajectory's sum. Mid-step decisions are scored by elapsed + (R/B)·prediction, Eq. 7's own fluid view.
5. *Table 2:* the simulator's empirical best and PEARL's selection agree on all six cases, but both are
   colocated where the paper's are disaggregated (3P5D, 4P12D, …), for the reason in 1.
6. *Sensitivity:* PEARL's advantage over RLBoost+ does not grow with batch or length here (reasons 1–2).

`compare` of one paper scenario with all five policies needs 8–10 s of CPU on this machine (wall time is
longer while other engineers' jobs share the 2 cores; see the timing line above); the largest single cost is core's tracker refit (a Huber IRLS over up to
2,048 engine samples on every policy event, ~35% of a profiled run).
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
    md.append("MAPE % = step-start forecast at constant resources per mode (C colocated, D disaggregated; steps with no "
              "transition or borrow change in flight) / the elastic figure (elapsed + (R/B)·prediction of the last "
              "reconfiguring decision). Steps P/R = PEARL / ROLL training steps in 2 h.\n")
    md.append("| scenario | ROLL tok/s | ROLL-Large | RLBoost+ | B-only | PEARL | oracle | PEARL/ROLL (paper) "
              "| PEARL vs RLBoost+ (paper) | PEARL/oracle | steps P/R | misses | lost | MAPE % | compare wall (CPU) s |")
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
            r_roll = th["pearl"] / th["fixed"]
            r_rb = th["pearl"] / th["rlboost+"] - 1
            p = res["pearl"]
            md.append(
                f"| {name} | {th['fixed']:,.0f} | {th['fixed-large']:,.0f} | {th['rlboost+']:,.0f} | {th['elastic']:,.0f} "
                f"| {th['pearl']:,.0f} | {th['oracle']:,.0f} | **{r_roll:.2f}×** ({roll_lo}–{roll_hi}×) "
                f"| **{pct(r_rb)}** ({pct(vs_rb)}) | {th['pearl'] / th['oracle']:.3f} | {p.steps}/{res['fixed'].steps} "
                f"| {p.return_deadline_misses} | {p.lost_tokens} | {_mape_cell(p)} | {wall:.1f} ({cpu_timings[name]:.1f}) |")
            body = f"<p>{sc.description}</p>" + summary_table(res)
            html_sections.append((name, body, figures(sc, res)))
    md.append("")
    return all_res


def _checks_row(name: str, res: dict[str, RunResult], roll: tuple[float, float] | None) -> str:
    th = {p: r.throughput_tok_s for p, r in res.items()}
    p = res["pearl"]
    base = max(th.get("rlboost+", 0.0), th.get("fixed-large", 0.0))
    cells = [name]
    if roll is not None:
        cells.append(within(th["pearl"] / th["fixed"], *roll))
    cells += [f"{th['pearl'] / base:.3f} {'yes' if th['pearl'] >= 0.98 * base else 'no'}"]
    if "oracle" in th:
        cells.append(f"{th['pearl'] / th['oracle']:.3f} {'yes' if 0.9 * th['oracle'] <= th['pearl'] <= th['oracle'] else 'no'}")
    cells.append("yes" if p.return_deadline_misses == 0 and p.lost_tokens == 0 else "no")
    return "| " + " | ".join(cells) + " |"


def ratio_checks(md: list[str], all_res: dict[str, dict[str, RunResult]]) -> None:
    md.append("Targets (issue 11): PEARL/ROLL within ±25% of the paper's; PEARL ≥ 0.98 × max(RLBoost+, ROLL-Large); "
              "0.9 × oracle ≤ PEARL ≤ oracle; zero misses and zero lost tokens for PEARL.\n")
    md.append("| scenario | PEARL/ROLL within ±25% | PEARL / max(RLBoost+, ROLL-Large) ≥ 0.98 | 0.9 ≤ PEARL/oracle ≤ 1 "
              "| PEARL misses/lost = 0 |")
    md.append("|---|---|---|---|---|")
    for name, res in all_res.items():
        sc = get_scenario(name)
        md.append(_checks_row(name, res, tuple(sc.paper["pearl_over_roll"])))
    md.append("")


def varied_section(md: list[str]) -> None:
    """Scenarios outside the shipped set: other seeds, rotated traces, other batch and group sizes."""
    md.append("### Varied scenarios (not in the paper): seeds, trace rotations, batch and group sizes\n")
    md.append("| scenario | variation | PEARL tok/s | RLBoost+ | ROLL-Large | oracle | PEARL / max(RLBoost+, ROLL-Large) ≥ 0.98 "
              "| 0.9 ≤ PEARL/oracle ≤ 1 | misses/lost = 0 |")
    md.append("|---|---|---|---|---|---|---|---|---|")
    cases = [("paper-qwen3-8b-seg1", "seed 7", {"seed": 7}),
             ("paper-qwen3-30b-a3b-seg2", "seed 11", {"seed": 11}),
             ("paper-qwen3-8b-seg2", "trace rotated by 1 h", {"rotate": 3600.0}),
             ("paper-qwen3-30b-a3b-seg3", "trace rotated by 40 min", {"rotate": 2400.0}),
             ("paper-qwen3-8b-seg1", "batch 32, group 8", {"batch": 32, "group": 8}),
             ("paper-qwen3-30b-a3b-seg1", "batch 96, group 8", {"batch": 96, "group": 8})]
    for name, label, var in cases:
        sc = get_scenario(name)
        if "seed" in var:
            sc = sc.with_seed(var["seed"])
        if "rotate" in var:
            sc = replace(sc, trace=_rotate(sc.trace, var["rotate"], sc.duration_s))
        if "batch" in var:
            sc = replace(sc, workload=replace(sc.workload, batch_size=var["batch"], group_size=var["group"]))
        res = compare(sc, ["pearl", "rlboost+", "fixed-large", "oracle"])
        th = {p: r.throughput_tok_s for p, r in res.items()}
        row = _checks_row(name, res, None)
        cells = row.strip("|").split("|")
        md.append(f"| {name} | {label} | {th['pearl']:,.0f} | {th['rlboost+']:,.0f} | {th['fixed-large']:,.0f} "
                  f"| {th['oracle']:,.0f} |" + "|".join(cells[1:]) + "|")
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
    st, paper = m["stats"], m["paper"]
    md.append("### Calibration of inputs (paper §1 motivation, never Fig. 5 / Fig. 7 / Table 2)\n")
    md.append("Measured by `python -m controlplane.sim calibrate` (`sim/calibration.py`) at the shipped workload and engine: "
              "the §1 split on 8 colocated TP2 workers (Qwen3-30B-A3B, batch 64, ROLL), Fig. 2a on fixed colocated pools of "
              f"16/24/32 GPUs (Qwen3-8B, 8 training GPUs). Rollout s: "
              + ", ".join(f"{g} GPUs {t:.0f}" for g, t in m["rollout_s"].items()) + ".\n")
    md.append("| statistic | paper | sim | target band | in band | parameter that sets it | source |")
    md.append("|---|---|---|---|---|---|---|")
    rows = [
        ("prefill share of tokens (every prompt token through prefill, cache hits included)", "prefill_token_share",
         "96.68%", "response_tokens_mean 900, observation_tokens_mean 700, 32K cap",
         "observation ~0.7–1.0K tokens/step: SWE-bench Pro (nilenso report), SWE-Gym Table 8; r: see decode rate"),
        ("prefill share of tokens (computed only, cache hits excluded)", "computed_prefill_token_share", "(undefined)",
         "prefix_reuse 0.5; caches flushed at each weight update", "SGLang update_weights flush; RLBoost flush_cache=True"),
        ("prefill share of colocated GPU time", "prefill_time_share", "26.48%",
         "prefix_reuse 0.5 (set against this statistic)",
         "history rewriting: SWE-agent LastNObservations; Qwen3 template <think> stripping; hit rate vs Mooncake 59%"),
        ("decode tok/s/GPU between prefill insertions", "decode_tok_s_per_gpu", "~400",
         "response_tokens_mean 900 (decode concurrency); core roofline (t0, TP all-reduce, MoE reads/dispatch)",
         "core/PROFILES.md (pd_anchors §4.3–4.4 single-engine TPOT anchors)"),
        ("Fig. 2a: rollout shortened 16→24 GPUs", "dp_16_to_24", "10.3%", "(emerges; no parameter set for it)", "—"),
        ("Fig. 2a: rollout shortened 24→32 GPUs", "dp_24_to_32", "8.9%", "(emerges; no parameter set for it)", "—"),
        ("prefix-cache hit rate", "cache_hit_rate", "(not reported)", "prefix_reuse, flush, KV pressure",
         "Mooncake Tool&Agent trace 59% (FAST'25 Table 2)"),
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
    md.append("\nEnvironment latency (not a §1 statistic; source: SWE-bench Pro tool times, nilenso report, and SkyRL's "
              "RL recipe): log-normal body with median 0.5 s (σ 1.0), a Pareto tail (x_m 10 s, α 0.6) on 3.5% of steps "
              "(calls over 10 s: 2.4–3.7% of steps), capped at 60 s per command (SkyRL mini-SWE). `engine_slowdown` is 1.0 "
              "everywhere (the uniform 3.0 is gone).\n")


def forecast_section(md: list[str]) -> None:
    from controlplane.sim.forecast import forecast_accuracy

    md.append("### Predictor: step-start forecast at constant resources, per mode\n")
    md.append("PEARL with borrowing off on a fixed pool (no transition or borrow change in flight), steps after warm-up. "
              "Own mode = the forecast of the configuration that ran vs its makespan; other mode = the forecast, made at "
              "the same moment, of the best configuration of the mode not running vs the same batch's makespan in a run "
              "pinned to that configuration (`sim/forecast.py`). The elastic figure is the old metric, for contrast.\n")
    md.append("| scenario | own: colocated MAPE % (n) | own: disaggregated (n) | other: colocated (n) | other: disaggregated (n) "
              "| elastic MAPE % |")
    md.append("|---|---|---|---|---|---|")
    for name in ("ablation-qwen3-8b-8gpu", "ablation-qwen3-30b-a3b-8gpu", "ablation-qwen3-8b-16gpu",
                 "ablation-qwen3-30b-a3b-16gpu"):
        r = forecast_accuracy(get_scenario(name))

        def cell(kind: str, mode: str) -> str:
            v, n = r[kind][mode], r[f"n_{kind}"][mode]
            return f"{v:.1f} ({n})" if v is not None else f"– ({n})"

        md.append(f"| {name} | {cell('own', 'colocated')} | {cell('own', 'disaggregated')} | {cell('other', 'colocated')} "
                  f"| {cell('other', 'disaggregated')} | {r['elastic_mape']} |")
    md.append("")


def whatif_section(md: list[str]) -> None:
    """Which mechanism accounts for PEARL vs RLBoost+: PEARL with parts switched off (see the analysis)."""
    md.append("### What-if (not the PEARL result): PEARL vs RLBoost+ by mechanism\n")
    md.append("Throughput vs RLBoost+ on the same scenario: `pearl` as shipped; `no-gate` = Eq. 7 off (borrow every idle "
              "window); `coloc` = PD adaptation off (mode forced colocated); `no-trial` = the untried-mode safeguard off; "
              "B-only = `elastic`.\n")
    md.append("| scenario | PEARL | no-gate | coloc | no-trial | B-only |")
    md.append("|---|---|---|---|---|---|")
    variants = {"no-gate": {"base": "pearl", "gate": False},
                "coloc": {"base": "pearl", "overrides": {"force_mode": "colocated"}},
                "no-trial": {"base": "pearl", "options": {"mode_trial": False}}}
    for name in ("paper-qwen3-8b-seg2", "paper-qwen3-30b-a3b-seg2", "sens-batch-32"):
        sc = get_scenario(name)
        sc = replace(sc, variants={**sc.variants, **variants})
        res = compare(sc, ["rlboost+", "pearl", "no-gate", "coloc", "no-trial", "elastic"])
        base = res["rlboost+"].throughput_tok_s
        md.append(f"| {name} | " + " | ".join(pct(res[v].throughput_tok_s / base - 1)
                                             for v in ("pearl", "no-gate", "coloc", "no-trial", "elastic")) + " |")
    md.append("")


def ablation_section(md: list[str]) -> None:
    md.append("### Ablation (paper Fig. 7): 16 training GPUs, fixed rollout GPUs, normalised to ROLL on the same GPUs\n")
    md.append("A = optimal PD ratio only (borrowing off; at 4 GPUs disaggregation forced, as in the paper), "
              "B = ungated borrowing, C = the Eq. 7 gate.\n")
    md.append("| model | rollout GPUs | A sim (paper) | A+B sim (paper) | A+B+C sim (paper) | PEARL config at step 3 |")
    md.append("|---|---|---|---|---|---|")
    for model in MODELS:
        for g in (4, 8, 12, 16):
            sc = get_scenario(f"ablation-{model}-{g}gpu")
            res = compare(sc)
            base = res["fixed"].throughput_tok_s
            cells = []
            for v in ("A", "A+B", "A+B+C"):
                paper = sc.paper[v]
                ps = pct(paper) if isinstance(paper, float) else f"{pct(paper[0])}..{pct(paper[1])}"
                cells.append(f"{pct(res[v].throughput_tok_s / base - 1)} ({ps})")
            cfg = next((s.config_label for s in res["A+B+C"].step_stats if s.step == 3), "")
            md.append(f"| {model} | {g} | " + " | ".join(cells) + f" | {cfg} |")
    md.append("")


def sensitivity_section(md: list[str]) -> None:
    md.append("### Workload sensitivity (paper §7): Qwen3-8B, 16 training + 8 dedicated rollout GPUs, PEARL vs RLBoost+\n")
    md.append("| sweep | value | RLBoost+ tok/s | PEARL tok/s | PEARL vs RLBoost+ | B-only tok/s | paper range |")
    md.append("|---|---|---|---|---|---|---|")
    for b in (32, 64, 96, 128):
        sc = get_scenario(f"sens-batch-{b}")
        res = compare(sc)
        md.append(f"| batch | {b} | {res['rlboost+'].throughput_tok_s:,.0f} | {res['pearl'].throughput_tok_s:,.0f} "
                  f"| {pct(res['pearl'].throughput_tok_s / res['rlboost+'].throughput_tok_s - 1)} "
                  f"| {res['elastic'].throughput_tok_s:,.0f} | +5.3..+63.7% |")
    for k in (8, 16, 24, 32):
        sc = get_scenario(f"sens-maxlen-{k}k")
        res = compare(sc)
        md.append(f"| max length | {k}K | {res['rlboost+'].throughput_tok_s:,.0f} | {res['pearl'].throughput_tok_s:,.0f} "
                  f"| {pct(res['pearl'].throughput_tok_s / res['rlboost+'].throughput_tok_s - 1)} "
                  f"| {res['elastic'].throughput_tok_s:,.0f} | +9.8..+26.5% |")
    md.append("")


def _replay_scenario(model: str, workers: int, variants: dict) -> Scenario:
    base = get_scenario("paper-qwen3-8b-seg1" if model == "qwen3-8b" else "paper-qwen3-30b-a3b-seg1")
    g = 2 * workers
    return replace(base, name=f"replay-{workers}w", cluster=ClusterSpec(training_gpus=16, reserved_gpus=g, preemptible_gpus=0),
                   trace=AvailabilityTrace((0.0,), (g,)), duration_s=2700.0, policies=tuple(variants), variants=variants)


def table2_section(md: list[str], pred_points: list[tuple[str, float, float]]) -> None:
    """Constant-resource replay of every configuration (paper Table 2) vs what PEARL selects."""
    md.append("### PD-ratio selection (paper Table 2): Qwen3-8B, constant resources, every configuration replayed\n")
    md.append("Empirical best = lowest mean simulated makespan over steps 1-4 (same batches for every configuration); "
              "selected = PEARL's decision (borrowing off, resources held constant) at step 3.\n")
    md.append("| dedicated GPUs | overlap | workers | selected (sim) | empirical best (sim) | gap | paper selected / best |")
    md.append("|---|---|---|---|---|---|---|")
    paper = {(10, False): "2P3D / 2P3D", (10, True): "4P9D / 5P8D", (12, False): "3P3D / 3P3D",
             (12, True): "4P10D / 4P10D", (16, False): "3P5D / 3P5D", (16, True): "4P12D / 4P12D"}
    for ded in (10, 12, 16):
        for overlap in (False, True):
            n = ded // 2 + (8 if overlap else 0)
            variants: dict = {"pearl-fixed-budget": {"base": "pearl", "overrides": {"borrowing": False}},
                              f"{n}C": {"base": "pearl", "overrides": {"borrowing": False, "force_mode": "colocated"}}}
            for p in range(1, n):
                variants[f"{p}P{n - p}D"] = {"base": "pearl", "overrides": {"borrowing": False, "force_ratio": [p, n - p]}}
            sc = _replay_scenario("qwen3-8b", n, variants)
            sel_run = run_policy(sc, "pearl-fixed-budget")
            selected = next((s.config_label for s in sel_run.step_stats if s.step == 3), "?")
            means: dict[str, float] = {}
            for v in variants:
                if v == "pearl-fixed-budget":
                    continue
                r = run_policy(sc, v)
                ms = [s.makespan_s for s in r.step_stats if 1 <= s.step <= 4]
                if ms:
                    means[v] = statistics.mean(ms)
                for s in r.step_stats:
                    if s.step >= 2 and s.predicted_at_start_s:
                        pred_points.append((v, s.predicted_at_start_s, s.makespan_s))
            best = min(means, key=means.get)
            gap = means.get(selected, float("nan")) / means[best] - 1
            md.append(f"| {ded} | {'yes' if overlap else 'no'} | {n} | {selected} | {best} | {pct(gap)} | {paper[(ded, overlap)]} |")
    errs = [abs(p - a) / a for _, p, a in pred_points]
    if errs:
        md.append(f"\nPredictor on these constant-resource replays (steps ≥ 2, {len(errs)} steps over every configuration): "
                  f"MAPE {100 * statistics.mean(errs):.1f}%, median {100 * statistics.median(errs):.1f}%.")
    md.append("")


def crossover_section(md: list[str]) -> None:
    """Paper §1: Qwen3-30B-A3B on 16 GPUs (8 TP2 workers): best disaggregation vs colocation by batch size."""
    md.append("### Mode crossover (paper §1): Qwen3-30B-A3B, 16 GPUs = 8 workers, constant resources\n")
    md.append("| batch | 8C makespan s | best split | its makespan s | best disaggregated vs colocation | paper |")
    md.append("|---|---|---|---|---|---|")
    paper = {32: "+9.7%", 64: "(5P3D best split at BS64)", 96: "−6.1%"}
    for b in (32, 64, 96):
        variants: dict = {"8C": {"base": "pearl", "overrides": {"borrowing": False, "force_mode": "colocated"}}}
        for p in range(1, 8):
            variants[f"{p}P{8 - p}D"] = {"base": "pearl", "overrides": {"borrowing": False, "force_ratio": [p, 8 - p]}}
        sc = _replay_scenario("qwen3-30b-a3b", 8, variants)
        sc = replace(sc, workload=replace(sc.workload, batch_size=b))
        means = {}
        for v in variants:
            ms = [s.makespan_s for s in run_policy(sc, v).step_stats if 1 <= s.step <= 4]
            if ms:
                means[v] = statistics.mean(ms)
        dis = {k: v for k, v in means.items() if k != "8C"}
        best = min(dis, key=dis.get)
        md.append(f"| {b} | {means['8C']:.0f} | {best} | {dis[best]:.0f} | {pct(means['8C'] / dis[best] - 1)} | {paper[b]} |")
    md.append("")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of: calibration,forecast,varied,whatif,ablation,sensitivity,"
                                                 "table2,crossover")
    ap.add_argument("--from-saved", action="store_true",
                    help="write benchmarks/out/sim_section.md (the last run) with the current analysis text")
    args = ap.parse_args()
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
    load = __import__("os").getloadavg()[0]
    md.append("`compare` per paper scenario (6 policies incl. the forking oracle, 2 h virtual), wall (process CPU) s: "
              + ", ".join(f"{k.replace('paper-', '')} {v:.1f} ({cpu_timings[k]:.1f})" for k, v in timings.items())
              + f"; whole report {time.perf_counter() - t_all:.0f} s on {platform.machine()} "
              f"({__import__('os').cpu_count()} cores shared with other jobs; 1-min load average at the end {load:.1f}).\n")
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
    new = pattern.sub(lambda m: m.group(1) + "\n" + preface + body.strip() + "\n\n" + ANALYSIS.strip() + "\n\n",
                      text, count=1)
    path.write_text(new)


if __name__ == "__main__":
    raise SystemExit(main())
