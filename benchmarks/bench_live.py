#!/usr/bin/env python
"""Live side by side: the same emulated Qwen3-8B/H800 SWE-like job and the same availability trace under
`fixed`, `elastic` and `pearl`, each on a fresh stack (`manage.py launch`: Redis, Daphne, Celery worker +
beat, the demo node agents, the job's rollout driver and trainer), then the simulator on the same
scenario for the same model-time duration, and the live predictor's error.

    .venv/bin/python benchmarks/bench_live.py [--cluster live16|paper32] [--minutes N] [--policies fixed,elastic,pearl]

Prints a table and writes `benchmarks/out/bench_live-<stamp>.json`.

Clusters (CLUSTERS below; H800 logical slots, emulated engines and trainer):
- `live16` (default): launch's DEMO_NODES (train-0 4 training, rollout-0 4 reserved, spot-0 and spot-1 4
  elastic each; the cpu nodes idle), B = 32, G = 8, 16K contexts. The trace is
  `benchmarks/bamboo-seg1-live16.csv`: Bamboo seg1 pre-scaled to this cluster exactly as the live replay
  holds it (whole 4-GPU elastic nodes; values are reserved + elastic GPUs, 4..12).
- `paper32`: the paper's Qwen3-8B cluster (PEARL §7: 16 training, 4 reserved, <= 12 preemptible GPUs) from
  `benchmarks/nodes-paper32.yaml` (the elastic GPUs as six 2-GPU nodes, so the replay holds Bamboo seg1's
  levels exactly), B = 64, G = 16, 32K contexts, the trace `controlplane/sim/traces/bamboo-seg1.csv`.
In both the live replay (peak -> reserved + elastic) and the simulator (available - reserved =
preemptible) read the same levels. The replay starts when the job is submitted; the simulator's copy of
the trace is shifted by the measured delay between that moment and the driver's loop-clock zero.

Throughput is the simulator's definition (controlplane/sim/cluster.py `_result`): over the trained steps
after the warm-up (the first `warmup + 1` trained steps are excluded), (generated tokens + training tokens)
divided by the model time from the warm-up step's weight publication to the last one's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from controlplane.core.policies.names import FIXED  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python")
OUT = ROOT / "benchmarks" / "out"
WARMUP = 2  # the scenarios' engine.warmup_steps: steps excluded from throughput and predictor MAPE
_JOB = {
    "model": "qwen3-8b",
    "hardware": "h800",
    "engine": "emulated",
    "environment": "swe-like",
    "tp": 2,
    "max_staleness": 1,
}
CLUSTERS: dict[str, dict[str, Any]] = {
    "live16": {
        "scenario": ROOT / "benchmarks" / "live-qwen3-8b-h800-16gpu.yaml",
        "trace": ROOT / "benchmarks" / "bamboo-seg1-live16.csv",
        "nodes": None,
        "job": _JOB
        | {"batch_size": 32, "group_size": 8, "rollout_gpus": 12, "training_gpus": 4, "max_trajectory_tokens": 16384},
    },
    "paper32": {
        "scenario": ROOT / "benchmarks" / "live-paper-qwen3-8b-h800-32gpu.yaml",
        "trace": ROOT / "controlplane" / "sim" / "traces" / "bamboo-seg1.csv",
        "nodes": ROOT / "benchmarks" / "nodes-paper32.yaml",
        "job": _JOB
        | {"batch_size": 64, "group_size": 16, "rollout_gpus": 16, "training_gpus": 16, "max_trajectory_tokens": 32768},
    },
}


# ============================================================================ pure figures
def throughput(steps: list[dict[str, Any]], trains: list[dict[str, Any]], *, warmup: int = WARMUP) -> dict[str, Any]:
    """The simulator's throughput on live records: trained steps (a TRAIN record, whose time_s is the
    weight publication) joined with their STEP record; the first warmup+1 are excluded."""
    by_step = {int(s.get("step", 0)): s for s in steps}
    done = sorted((t for t in trains if int(t.get("step", 0)) in by_step), key=lambda t: float(t["time_s"]))
    if len(done) <= warmup + 1:
        return {"throughput_tok_s": None, "steps_trained": len(done), "steps_measured": 0, "span_s": 0.0}
    body = done[warmup + 1 :]
    span = float(body[-1]["time_s"]) - float(done[warmup]["time_s"])
    tokens = sum(
        int(by_step[int(t.get("step", 0))].get("generated_tokens_total", 0))
        + int(by_step[int(t.get("step", 0))].get("train_tokens", 0))
        for t in body
    )
    return {
        "throughput_tok_s": tokens / span if span > 0 else None,
        "steps_trained": len(done),
        "steps_measured": len(body),
        "span_s": span,
    }


def mape(steps: list[dict[str, Any]], key: str, *, warmup: int = WARMUP) -> dict[str, Any]:
    """Mean absolute percentage error of `key` against the observed makespan, steps >= warmup with a
    prediction (> 0); also the median and how many steps counted."""
    errs = [
        abs(float(s[key]) - float(s["makespan_s"])) / float(s["makespan_s"])
        for s in steps
        if int(s.get("step", 0)) >= warmup and float(s.get(key) or 0) > 0 and float(s.get("makespan_s") or 0) > 0
    ]
    return {
        "mape_pct": 100 * statistics.fmean(errs) if errs else None,
        "median_ape_pct": 100 * statistics.median(errs) if errs else None,
        "n": len(errs),
    }


def live_figures(run: dict[str, Any]) -> dict[str, Any]:
    """Every figure of one live run from its collected records."""
    steps, trains = run["steps"], run["train"]
    lat = [float(t.get("return_latency_s", 0.0)) for t in trains]
    deadline = max((float(t.get("return_deadline_s", 0.0)) for t in trains), default=0.0)
    batch = max((int(s.get("batch_size", 0)) for s in steps), default=0)
    out = throughput(steps, trains)
    makespans = [float(s["makespan_s"]) for s in steps if int(s.get("step", 0)) >= WARMUP]
    train_s = [float(t["duration_s"]) for t in trains]
    out |= {
        "steps_rolled_out": len(steps),
        "rollout_s_median": statistics.median(makespans) if makespans else None,
        "train_s_median": statistics.median(train_s) if train_s else None,
        "transitions": run["transitions"],
        "transition_steps": run["transition_steps"],
        "decisions": run["decisions"],
        "decisions_admitted": run["decisions_admitted"],
        "borrowed_gpu_s": sum(float(s.get("borrowed_gpu_s", 0.0)) for s in steps),
        "return_deadline_s": deadline,
        "return_latency_median_s": statistics.median(lat) if lat else None,
        "return_latency_max_s": max(lat) if lat else None,
        "deadline_misses": sum(1 for x in lat if x > deadline + 1e-9),
        "lost_trajectories": sum(int(t.get("missing_trajectories", 0)) for t in trains),
        "trained_trajectories": sum(int(t.get("trajectories", 0)) for t in trains),
        "expected_trajectories": sum(
            int(by.get("batch_size", 0))
            for by in steps
            if any(int(t.get("step", 0)) == int(by.get("step", 0)) for t in trains)
        ),
        "over_full_batches": sum(1 for t in trains if int(t.get("trajectories", 0)) > batch),
        "interruptions": sum(int(s.get("interruptions", 0)) for s in steps),
        "stale_aborted": sum(int(s.get("stale_aborted", 0)) for s in steps),
        "configurations": sorted(
            {f"{s.get('n_prefill') or 0}P{s.get('n_decode') or 0}D{s.get('n_colocated') or 0}C" for s in steps}
        ),
        "steps_by_mode": {
            m: sum(1 for s in steps if s.get("mode") == m) for m in sorted({s.get("mode", "") for s in steps})
        },
        "prefill_interference": run.get("prefill_interference"),
        "predictor_at_start": mape(steps, "predicted_at_start_s"),
        "predictor_decision": mape(steps, "predicted_makespan_s"),
    }
    return out


def shift_trace(points: list[tuple[float, int]], offset_s: float) -> list[tuple[float, int]]:
    """The trace as seen from a clock that starts `offset_s` later: level at t' = level at t' + offset."""
    if offset_s <= 0:
        return list(points)
    level = points[0][1]
    for t, g in points:
        if t <= offset_s:
            level = g
    return [(0.0, level)] + [(round(t - offset_s, 3), g) for t, g in points if t > offset_s]


def read_trace(path: Path) -> list[tuple[float, int]]:
    rows = path.read_text().strip().splitlines()[1:]
    return [(float(a), int(b)) for a, b in (r.split(",") for r in rows)]


# ============================================================================ one live stack
COLLECT = r"""
import json
from django.db.models import Count
from controlplane.models import Decision, Event, Job, TelemetrySample, Transition, TransitionStep
job = Job.objects.get(pk=JOB_ID)
def recs(kind):
    return [dict(r, created=c.timestamp()) for r, c in
            TelemetrySample.objects.filter(job=job, kind=kind).order_by("id").values_list("record", "created")]
tr = Transition.objects.filter(job=job)
print("@@COLLECT@@" + json.dumps({
    "status": job.status, "failure_reason": getattr(job, "failure_reason", ""),
    "steps": recs("step"), "train": recs("train"),
    "transitions": {r["status"]: r["n"] for r in tr.values("status").annotate(n=Count("id"))},
    "transition_steps": TransitionStep.objects.filter(transition__job=job).count(),
    "decisions": Decision.objects.filter(job=job).count(),
    "decisions_admitted": Decision.objects.filter(job=job, admitted=True).count(),
    "prefill_interference": (Decision.objects.filter(job=job).order_by("-id").values_list("profile", flat=True).first()
                             or {}).get("prefill_interference"),
    "events": {r["kind"]: r["n"] for r in Event.objects.values("kind").annotate(n=Count("id"))},
}))
"""


class Stack:
    def __init__(
        self,
        var: Path,
        *,
        port: int,
        redis_port: int,
        time_factor: float,
        nodes: Path | None = None,
        interference: float = 1.0,
    ) -> None:
        self.var, self.port, self.tf, self.nodes, self.interference = var, port, time_factor, nodes, interference
        self.env = dict(
            os.environ,
            PEARL_VAR_DIR=str(var),
            PEARL_PORT=str(port),
            REDIS_URL=f"redis://127.0.0.1:{redis_port}",
            PYTHONUNBUFFERED="1",
        )
        self.env.pop("DATABASE_URL", None)  # SQLite in the fresh var dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def _spawn(self, args: list[str], log: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen(
            ["nice", "-n", "5", PY, *args],
            cwd=ROOT,
            env=self.env,
            stdout=open(self.var / log, "wb"),  # noqa: SIM115 (open while the child runs)
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append(p)
        return p

    def start(self, timeout_s: float = 240.0) -> None:
        self.var.mkdir(parents=True, exist_ok=True)
        self.launcher = self._spawn(
            [
                "manage.py",
                "launch",
                "--no-demo-job",
                "--trace",
                "",
                "--time-factor",
                str(self.tf),
                "--port",
                str(self.port),
                *(["--nodes", str(self.nodes)] if self.nodes else []),
                "--interference",
                str(self.interference),
            ],
            "launch.log",
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "PEARL is up" in (self.var / "launch.log").read_text(errors="replace"):
                self.token = json.loads((self.var / "demo-credentials.json").read_text())["token"]
                return
            if self.launcher.poll() is not None:
                break
            time.sleep(1.0)
        raise RuntimeError(f"the stack did not come up; see {self.var / 'launch.log'}")

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Token {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read())

    def replay(self, trace: Path) -> None:
        self.replayer = self._spawn(
            ["manage.py", "replay_availability", "--trace", str(trace), "--speedup", str(1.0 / self.tf)], "replay.log"
        )

    def collect(self, job_id: int) -> dict[str, Any]:
        out = subprocess.run(
            [PY, "manage.py", "shell", "-c", COLLECT.replace("JOB_ID", str(job_id))],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        for line in out.stdout.splitlines():
            if line.startswith("@@COLLECT@@"):
                return json.loads(line[len("@@COLLECT@@") :])
        raise RuntimeError(f"collect failed: {out.stderr[-2000:]}")

    def stop(self) -> list[int]:
        """SIGTERM the replay and the launcher (which stops its children), then end any process still
        carrying this stack's var dir in its environment (by pid). Returns the pids that needed it."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
        left = own_leftovers(str(self.var))
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return left


def own_leftovers(var: str) -> list[int]:
    """Pids of this user's processes whose environment names `var` as PEARL_VAR_DIR."""
    mine, needle = [], f"PEARL_VAR_DIR={var}\0".encode()
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if needle in (d / "environ").read_bytes():
                    mine.append(int(d.name))
            except OSError:
                pass
    return mine


def run_live(
    policy: str,
    *,
    idx: int,
    minutes: float,
    time_factor: float,
    base: Path,
    cluster: dict[str, Any],
    interference: float = 1.0,
) -> dict[str, Any]:
    var = base / policy
    stack = Stack(
        var,
        port=8200 + idx,
        redis_port=6420 + idx,
        time_factor=time_factor,
        nodes=cluster["nodes"],
        interference=interference,
    )
    load0 = os.getloadavg()
    t_start = time.time()
    try:
        stack.start()
        up_s = time.time() - t_start
        job = stack.api("POST", "jobs/", {"name": f"bench-{policy}", "policy": policy, **cluster["job"]})
        t_submit = time.time()
        stack.replay(cluster["trace"])
        print(f"  [{policy}] stack up in {up_s:.0f} s, job {job['id']} submitted; running {minutes:g} min", flush=True)
        end = t_submit + minutes * 60
        while time.time() < end:
            time.sleep(min(30.0, max(0.0, end - time.time())))
            try:
                st = stack.api("GET", f"jobs/{job['id']}/status/")["job"]
                print(
                    f"  [{policy}] +{time.time() - t_submit:4.0f}s status={st.get('status')} step={st.get('step')} "
                    f"config={st.get('configuration') or st.get('config_label') or ''} load={os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            except Exception as exc:  # progress printing only
                print(f"  [{policy}] status unavailable: {exc}", flush=True)
        wall_s = time.time() - t_submit
        stack.replayer.send_signal(signal.SIGTERM)
    finally:
        left = stack.stop()
    data = stack.collect(job["id"])
    # the driver's loop-clock zero in wall time: created - time_s * tf is an upper bound per record; take the min
    epochs = [
        r["created"] - float(r["time_s"]) * time_factor
        for r in data["steps"] + data["train"]
        if float(r.get("time_s", 0)) > 0
    ]
    epoch = min(epochs) if epochs else t_submit
    data |= {
        "policy": policy,
        "job_id": job["id"],
        "wall_s": wall_s,
        "stack_up_s": up_s,
        "trace_offset_model_s": max(0.0, (epoch - t_submit) / time_factor),
        "model_s_covered": (t_submit + wall_s - epoch) / time_factor,
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
        "leftover_pids_killed": left,
    }
    return data


# ============================================================================ the simulator
def run_sim(
    policies: list[str],
    *,
    duration_s: float,
    offset_s: float,
    base: Path,
    cluster: dict[str, Any],
    interference: float = 1.0,
    seeds: dict[str, int] | None = None,
) -> dict[str, Any]:
    """The simulator over the live runs' window. `seeds`: each policy's live job seed (the driver seeds a job's
    environments with its id), so the simulator draws the very batches the live job drew (`swe_like`)."""
    by_seed: dict[int | None, list[str]] = {}
    for p in policies:
        by_seed.setdefault(None if seeds is None else seeds[p], []).append(p)
    out: dict[str, Any] = {}
    for seed, group in by_seed.items():
        out |= _run_sim(group, duration_s, offset_s, base, cluster, interference, seed)
    return out


def _run_sim(
    policies: list[str],
    duration_s: float,
    offset_s: float,
    base: Path,
    cluster: dict[str, Any],
    interference: float,
    seed: int | None,
) -> dict[str, Any]:
    import yaml

    pts = shift_trace(read_trace(cluster["trace"]), offset_s)
    trace = base / "sim-trace.csv"
    trace.write_text("time_s,available_gpus\n" + "".join(f"{t},{g}\n" for t, g in pts))
    sc = yaml.safe_load(cluster["scenario"].read_text())
    sc["trace"]["file"] = str(trace)
    sc["duration_s"] = round(duration_s)
    if seed is not None:
        sc["seed"] = seed
    if interference != 1.0:
        sc.setdefault("engine", {})["mixed_prefill_penalty"] = interference
    scen = base / ("scenario.yaml" if seed is None else f"scenario-seed{seed}.yaml")  # paired_steps reads it
    scen.write_text(yaml.safe_dump(sc, sort_keys=False))
    out = subprocess.run(
        [
            "nice",
            "-n",
            "5",
            PY,
            "-m",
            "controlplane.sim",
            "compare",
            "--scenario-file",
            str(scen),
            "--policies",
            ",".join(policies),
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if out.returncode:
        raise RuntimeError(f"simulator failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)["policies"]


# ============================================================================ report
def _f(x: Any, fmt: str = "{:,.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def paired_steps(raw: dict[str, dict[str, Any]], base: Path) -> dict[str, dict[str, Any]]:
    """Step by step, the live rollout beside the simulator's of the same batch (the same seed draws the same
    trajectories: `swe_like`), from the scenario files `run_sim` wrote, and both throughputs over the same
    trained steps (both windows end at the last step both trained): live and simulator then compare on the
    same steps, not through two windows that cover different ones."""
    from controlplane.sim.cluster import run_policy, window_throughput
    from controlplane.sim.scenario import load_scenario_file

    out: dict[str, dict[str, Any]] = {}
    for p, r in raw.items():
        scenario = load_scenario_file(base / f"scenario-seed{r['job_id']}.yaml")
        stats = run_policy(scenario, p).step_stats
        sim = {s.step: s for s in stats}
        trained = [s for s in stats if s.train_end_s > 0]
        last = min(len(trained), len({int(t.get("step", 0)) for t in r["train"]})) - 1
        live = throughput(r["steps"], [t for t in r["train"] if int(t.get("step", 0)) <= last])["throughput_tok_s"]
        out[p] = {
            "last_step": last,
            "live_tok_s": live,
            "sim_tok_s": window_throughput(trained, scenario.engine.warmup_steps, last=last) if last >= 0 else None,
            "steps": [
                {
                    "step": i,
                    "live_rollout_s": st["makespan_s"],
                    "sim_rollout_s": sim[i].makespan_s,
                    "same_tokens": st["generated_tokens_total"] == sim[i].generated_tokens,
                    "sim_config": sim[i].config_label,
                }
                for i, st in enumerate(r["steps"])
                if i in sim and sim[i].end_s > 0
            ],
        }
    return out


def paired_table(paired: dict[str, dict[str, Any]]) -> str:
    lines = ["policy  step  live rollout s  sim rollout s  sim-live  same tokens  sim configuration"]
    for p, x in paired.items():
        for row in x["steps"]:
            err = (row["sim_rollout_s"] - row["live_rollout_s"]) / row["live_rollout_s"]
            lines.append(
                f"{p:>7} {row['step']:>5} {row['live_rollout_s']:>15.0f} {row['sim_rollout_s']:>14.0f} {err:>+9.1%} "
                f"{'yes' if row['same_tokens'] else 'NO':>12}  {row['sim_config']}"
            )
    for p, x in paired.items():
        live, sim = x["live_tok_s"], x["sim_tok_s"]
        err = f"{(sim - live) / live:+.1%}" if live and sim else "-"
        lines.append(
            f"{p}: over the same trained steps (to step {x['last_step']}): live {_f(live)}, sim {_f(sim)} tok/s, {err}"
        )
    return "\n".join(lines)


def table(live: dict[str, dict[str, Any]], sim: dict[str, dict[str, Any]]) -> str:
    base = live.get(FIXED, {}).get("throughput_tok_s")
    rows = [
        (
            "policy",
            "live tok/s",
            "vs fixed",
            "sim tok/s",
            "sim vs fixed",
            "sim-live err",
            "steps (meas.)",
            "rollout s live med/sim mean",
            "train s live med/sim mean",
            "transitions ok/all",
            "borrowed GPU-s",
            "return med/max s (deadline)",
            "misses",
            "lost",
            "MAPE start/decision %",
        )
    ]
    for p, f in live.items():
        thr = f["throughput_tok_s"]
        s = sim.get(p, {})
        err = (s["throughput_tok_s"] - thr) / thr if thr and s.get("throughput_tok_s") else None
        tr = f["transitions"]
        sbase = sim.get(FIXED, {}).get("throughput_tok_s")
        rows.append(
            (
                p,
                _f(thr),
                _f(thr / base if thr and base else None, "{:.2f}x"),
                _f(s.get("throughput_tok_s")),
                _f(s["throughput_tok_s"] / sbase if s.get("throughput_tok_s") and sbase else None, "{:.2f}x"),
                _f(100 * err if err is not None else None, "{:+.1f}%"),
                f"{f['steps_trained']} ({f['steps_measured']})",
                f"{_f(f['rollout_s_median'], '{:.0f}')}/{_f(s.get('rollout_s_mean'), '{:.0f}')}",
                f"{_f(f['train_s_median'], '{:.0f}')}/{_f(s.get('train_s_mean'), '{:.0f}')}",
                f"{tr.get('succeeded', 0)}/{sum(tr.values())}",
                _f(f["borrowed_gpu_s"]),
                f"{_f(f['return_latency_median_s'], '{:.1f}')}/{_f(f['return_latency_max_s'], '{:.1f}')} "
                f"({f['return_deadline_s']:.0f})",
                str(f["deadline_misses"]),
                str(f["lost_trajectories"]),
                f"{_f(f['predictor_at_start']['mape_pct'], '{:.0f}')}/"
                f"{_f(f['predictor_decision']['mape_pct'], '{:.0f}')}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=6.0, help="wall minutes per policy after submission (default 6)")
    ap.add_argument("--policies", default="fixed,elastic,pearl")
    ap.add_argument(
        "--cluster", choices=sorted(CLUSTERS), default="live16", help="cluster, trace and job (default live16)"
    )
    ap.add_argument("--time-factor", type=float, default=0.05, help="wall seconds per model second (default 0.05)")
    ap.add_argument(
        "--interference",
        type=float,
        default=1.0,
        help="a what-if: the emulated engines' (and the simulator's) prefill next to running decodes "
        "costs this x its roofline time (default 1, the calibrated engine)",
    )
    ap.add_argument(
        "--report", help="print the table of a saved result JSON (benchmarks/out/bench_live-*.json) and exit"
    )
    args = ap.parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        live = {p: live_figures(r) for p, r in saved["raw"].items()} if saved.get("raw") else saved["live"]
        print(table(live, saved["sim"]))
        return 0
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]

    def stop(signum: int, _frame: Any) -> None:  # SIGTERM (or SIGINT in the background): stop the stack in `finally`
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(tempfile.mkdtemp(prefix=f"bench_live-{stamp}-"))
    cluster = CLUSTERS[args.cluster]
    print(
        f"bench_live: {args.cluster}, {policies}, {args.minutes:g} wall min each, time factor {args.time_factor}, "
        f"var dirs under {base}",
        flush=True,
    )
    raw: dict[str, dict[str, Any]] = {}
    for i, p in enumerate(policies):
        raw[p] = run_live(
            p,
            idx=i,
            minutes=args.minutes,
            time_factor=args.time_factor,
            base=base,
            cluster=cluster,
            interference=args.interference,
        )
        (OUT / f"bench_live-{stamp}-raw-{p}.json").write_text(json.dumps(raw[p], default=str))
    live = {p: live_figures(r) for p, r in raw.items()}
    covered = statistics.fmean(r["model_s_covered"] for r in raw.values())
    offset = statistics.fmean(r["trace_offset_model_s"] for r in raw.values())
    print(f"simulating {covered:.0f} model s (trace shifted by {offset:.0f} s) ...", flush=True)
    sim = run_sim(
        policies,
        duration_s=covered,
        offset_s=offset,
        base=base,
        cluster=cluster,
        interference=args.interference,
        seeds={p: int(r["job_id"]) for p, r in raw.items()},
    )
    print()
    print(table(live, sim))
    paired = paired_steps(raw, base)
    print()
    print(paired_table(paired))
    for p, f in live.items():
        print(f"{p}: steps by mode {f['steps_by_mode']}, measured PD interference I = {f['prefill_interference']}")
    result = {
        "when": stamp,
        "args": vars(args),
        "machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())},
        "cluster": args.cluster,
        "scenario": str(cluster["scenario"].relative_to(ROOT)),
        "trace": str(cluster["trace"].relative_to(ROOT)),
        "sim_duration_s": covered,
        "sim_trace_offset_s": offset,
        "live": live,
        "sim": sim,
        "paired_steps": paired,
        "sim_vs_live_err": {
            p: ((sim[p]["throughput_tok_s"] - live[p]["throughput_tok_s"]) / live[p]["throughput_tok_s"])
            if live[p]["throughput_tok_s"] and p in sim
            else None
            for p in live
        },
        "raw": {p: {k: v for k, v in r.items()} for p, r in raw.items()},
    }
    path = OUT / f"bench_live-{stamp}.json"
    path.write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
