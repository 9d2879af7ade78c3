"""Regenerates the shipped scenario and trace files: `python -m controlplane.sim.generate_data` (seeded)."""

from pathlib import Path
from typing import Any

import yaml

from controlplane.core.policies import REGISTRY, names
from controlplane.sim.calibration import CALIBRATED_WORKLOAD
from controlplane.sim.draws import draw_jobs_scenario
from controlplane.sim.traces import PAPER_SEGMENTS, generate_bamboo_like

D = Path(__file__).resolve().parent
# No engine fudge: the engine is core's roofline profile as is (its per-component terms — per-iteration
# t0, TP all-reduce latency, MoE expert reads and dispatch — are sourced in core/PROFILES.md); the uniform
# engine_slowdown 3.0 of earlier versions is gone (issue 11). Prefix caches are flushed at every weight
# update (EngineSpec.flush_cache_on_weight_update, default true: SGLang update_weights, RLBoost flush_cache).
ENGINE: dict = {}
seeds = {"seg1": 20261, "seg2": 20262, "seg3": 20263}
for seg, spec in PAPER_SEGMENTS.items():
    tr = generate_bamboo_like(spec, seed=seeds[seg])
    (D / "traces" / f"bamboo-{seg}.csv").write_text(tr.to_csv())
    print(seg, tr.mean(7200), tr.n_changes(7200))
paper: dict[str, dict[str, Any]] = {
    "qwen3-8b": {"vs_roll": [2.17, 2.37], "vs_rlboost": {"seg1": 0.059, "seg2": 0.269, "seg3": 0.106}},
    "qwen3-30b-a3b": {"vs_roll": [2.43, 2.79], "vs_rlboost": {"seg1": 0.074, "seg2": 0.363, "seg3": 0.190}},
}
large = {"seg1": 14, "seg2": 10, "seg3": 12}
short = {"qwen3-8b": "qwen3-8b", "qwen3-30b-a3b": "qwen3-30b-a3b"}
for model in ("qwen3-8b", "qwen3-30b-a3b"):
    for seg in ("seg1", "seg2", "seg3"):
        name = f"paper-{model}-{seg}"
        doc: dict[str, Any] = {
            "name": name,
            "description": f"PEARL §7: {model}, SWE-bench-like, 32 H800 (16 train, 4 reserved, <=12 preemptible), "
            f"Bamboo {seg}",
            "model": model,
            "cluster": {"training_gpus": 16, "reserved_gpus": 4, "preemptible_gpus": 12, "hardware": "H800", "tp": 2},
            "workload": {"batch_size": 64, "group_size": 16, "max_length": 32768, **CALIBRATED_WORKLOAD},
            "trace": {"file": f"bamboo-{seg}.csv"},
            **({"engine": ENGINE} if ENGINE else {}),
            "duration_s": 7200,
            "seed": 0,
            "fixed_large_gpus": large[seg],
            # RLBoost+ (RLBoost's Algorithms 1 and 2, simulator only); elastic = ungated seeding for
            # the whole idle window on every preemptible GPU (PEARL's component B without A and C), an ablation
            "policies": [n for n, c in REGISTRY.items() if not c.mixed_pools_only],
            "paper": {
                "pearl_over_roll": paper[model]["vs_roll"],
                "pearl_over_rlboost": paper[model]["vs_rlboost"][seg],
                "segment": seg,
            },
        }
        (D / "scenarios" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        if seg == "seg1":
            # issue 23 (b): the same cluster with an all-H20 rollout pool beside the H800 trainer
            het: dict[str, Any] = {k: v for k, v in doc.items() if k != "paper"}
            het["name"] = f"hetero-{model}-seg1-h20"
            het["description"] = (
                f"Issue 23 (b): {model}, the paper's seg1 cluster with an all-H20 rollout pool (4 reserved, <=12 "
                "preemptible) beside a 16-GPU H800 trainer (overlap workers borrowed from it run on H800); H20 "
                "specs in core/PROFILES.md"
            )
            het["cluster"] = {**doc["cluster"], "hardware": "H20", "training_hardware": "H800"}
            het["policies"] = list(REGISTRY)
            (D / "scenarios" / f"{het['name']}.yaml").write_text(yaml.safe_dump(het, sort_keys=False))
            # issue 23 (c): H800 reserved and trainer, a mixed elastic pool (H20, H800, A100 in turn)
            mix: dict[str, Any] = {**het, "name": f"hetero-{model}-seg1-mixed"}
            mix["description"] = (
                f"Issue 23 (c): {model}, the paper's seg1 cluster (16 H800 training, 4 H800 reserved rollout, <=12 "
                "preemptible) with a mixed elastic pool: the k-th elastic TP2 group is H20, H800, A100 in turn "
                "(Bamboo records no chip types; the rotation is our choice, not sourced); chip specs in "
                "core/PROFILES.md"
            )
            mix["cluster"] = {
                **doc["cluster"],
                "training_hardware": "H800",
                "elastic_hardware": ["H20", "H800", "A100"],
            }
            (D / "scenarios" / f"{mix['name']}.yaml").write_text(yaml.safe_dump(mix, sort_keys=False))
# ablation: fixed 4..16 dedicated rollout GPUs, A / A+B / A+B+C vs ROLL on the same GPUs
abl_paper: dict[str, dict[int | str, Any]] = {
    "qwen3-8b": {4: (-0.206, 0.936, 0.923), "8-16": ((0.128, 0.153), (0.162, 0.265), (0.179, 0.265))},
    "qwen3-30b-a3b": {4: (-0.309, 1.183, 1.295), "8-16": ((0.078, 0.089), (0.094, 0.262), (0.092, 0.275))},
}
for model in ("qwen3-8b", "qwen3-30b-a3b"):
    for g in (4, 8, 12, 16):
        name = f"ablation-{model}-{g}gpu"
        a: dict[str, Any] = {"base": names.PEARL, "overrides": {"borrowing": False}}
        if g == 4:
            a["overrides"]["force_mode"] = "disaggregated"
        ab: dict[str, Any] = {"base": names.PEARL, "gate": False}
        if g == 4:
            ab["overrides"] = {"force_mode": "disaggregated"}
        abc: dict[str, Any] = {"base": names.PEARL}
        if g == 4:
            abc["overrides"] = {"force_mode": "disaggregated"}
        doc = {
            "name": name,
            "description": f"PEARL Fig. 7 ablation: {model}, 16 training GPUs, fixed {g} rollout GPUs; "
            "A = PD ratio only, B = ungated borrowing, C = gate",
            "model": model,
            "cluster": {"training_gpus": 16, "reserved_gpus": g, "preemptible_gpus": 0, "hardware": "H800", "tp": 2},
            "workload": {"batch_size": 64, "group_size": 16, "max_length": 32768, **CALIBRATED_WORKLOAD},
            "trace": {"constant_gpus": g},
            **({"engine": ENGINE} if ENGINE else {}),
            "duration_s": 7200,
            "policies": [names.FIXED, "A", "A+B", "A+B+C"],
            "variants": {"A": a, "A+B": ab, "A+B+C": abc},
            "paper": {
                "A": abl_paper[model][4][0] if g == 4 else list(abl_paper[model]["8-16"][0]),
                "A+B": abl_paper[model][4][1] if g == 4 else list(abl_paper[model]["8-16"][1]),
                "A+B+C": abl_paper[model][4][2] if g == 4 else list(abl_paper[model]["8-16"][2]),
            },
        }
        (D / "scenarios" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
for b in (32, 64, 96, 128):
    name = f"sens-batch-{b}"
    doc = {
        "name": name,
        "description": f"PEARL §7 sensitivity: Qwen3-8B, 16 training + 8 dedicated rollout GPUs, batch {b}, 32K",
        "model": "qwen3-8b",
        "cluster": {"training_gpus": 16, "reserved_gpus": 8, "preemptible_gpus": 0, "hardware": "H800", "tp": 2},
        "workload": {"batch_size": b, "group_size": 16, "max_length": 32768, **CALIBRATED_WORKLOAD},
        "trace": {"constant_gpus": 8},
        **({"engine": ENGINE} if ENGINE else {}),
        "duration_s": 7200,
        "policies": [names.PEARL, names.RLBOOST, names.ELASTIC],
        "paper": {"pearl_over_rlboost_range": [0.053, 0.637]},
    }
    (D / "scenarios" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
for L in (8192, 16384, 24576, 32768):
    name = f"sens-maxlen-{L // 1024}k"
    doc = {
        "name": name,
        "description": "PEARL §7 sensitivity: Qwen3-8B, 16 training + 8 dedicated rollout GPUs, batch 64, "
        f"max length {L // 1024}K",
        "model": "qwen3-8b",
        "cluster": {"training_gpus": 16, "reserved_gpus": 8, "preemptible_gpus": 0, "hardware": "H800", "tp": 2},
        "workload": {"batch_size": 64, "group_size": 16, "max_length": L, **CALIBRATED_WORKLOAD},
        "trace": {"constant_gpus": 8},
        **({"engine": ENGINE} if ENGINE else {}),
        "duration_s": 7200,
        "policies": [names.PEARL, names.RLBOOST, names.ELASTIC],
        "paper": {"pearl_over_rlboost_range": [0.098, 0.265]},
    }
    (D / "scenarios" / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
# issue 35: multi-job scenarios drawn, not tuned (the hand-written multi-2jobs, -4jobs, -8jobs are not generated)
for seed, n_jobs in ((11, 4), (12, 3)):
    drawn = draw_jobs_scenario(seed, n_jobs)
    (D / "scenarios" / f"{drawn['name']}.yaml").write_text(yaml.safe_dump(drawn, sort_keys=False))
