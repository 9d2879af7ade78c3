#!/usr/bin/env python
"""Restart and pause of the demo's jobs (issue 34): the stack `make demo` starts (`manage.py launch`, the same
command, on its own var directory, web and Redis ports, and SQLite unless --database-url), killed mid-rollout
and launched again, N times; then, on the same stack, `pearl pause` / `pearl resume` of the watched job.

    .venv/bin/python benchmarks/bench_restart.py [--runs 3] [--job swe|calc] [--kill group|stack] [--json]

Each restart run: wait until the watched job (default the SWE-like one) is mid-rollout with some of its step's
trajectories durable at its trainer (the trainer's step buffer) and others running; SIGKILL the launcher's
process group (`--kill group`, what Ctrl-\\ or the OOM killer does to the launcher: its children are in their
own sessions and get SIGTERM from the kernel, PR_SET_PDEATHSIG) or every process of the stack at once
(`--kill stack`); list the stack's processes still alive after --settle s (orphans; killed then, so the relaunch
can start); relaunch the same command and measure, for every demo job:

- first new turn: wall seconds from the relaunch to the first TURN telemetry record of the job the control
  plane stored after it (`TelemetrySample.created`; the driver flushes its records every 0.5 s);
- the step in flight at the kill, once its update committed: the audit counts of
  `GET /api/jobs/<id>/trajectories/steps/` (the driver's trajectory records: trained, untrained, rerun from the
  prompt, resumed from a kept prefix), read once the step's TrainedReport marked them, and the trainer's own
  audit (`<ckpt>/updates.jsonl`): the trajectories trained, how many were durable at the kill (none of them
  regenerated), and the replacements (`-rN`) of those that were in flight.

Pause runs: `pearl pause JOB` mid-rollout -> seconds until the job reads `paused` with no rollout worker left
(every alive worker a training one, or a sleeping overlap worker; `GET /api/jobs/<id>/status/`);
`pearl resume JOB` -> seconds until a rollout worker of the job is active again, and to the first TURN record
stored after that (a turn the drain interrupted can reach the control plane after the resume: not a new one).

Figures and the machine they were measured on: BENCHMARKS.md, "Restart and pause of a job"."""

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
from pathlib import Path
from typing import Any

from bench_controlplane import free_port
from bench_live import PY, ROOT, Stack, own_leftovers
from harness import write_report

PEARL = str(ROOT / ".venv" / "bin" / "pearl")


class DemoStack(Stack):
    """bench_live's stack started as `make demo` starts it: `manage.py launch` and nothing else (its demo jobs
    and availability trace included); the port comes from PEARL_PORT, Redis from REDIS_URL (started by the
    launcher: nothing answers there), the database from DATABASE_URL or SQLite in the var directory."""

    def __init__(self, var: Path, database_url: str = "") -> None:
        super().__init__(var, port=free_port(), redis_port=free_port(), time_factor=0.05)
        if database_url:
            self.env["DATABASE_URL"] = database_url
        self.launches = 0

    def start(self, timeout_s: float = 300.0) -> None:
        self.var.mkdir(parents=True, exist_ok=True)
        self.launches += 1
        self.log = self.var / f"launch-{self.launches}.log"
        self.procs = [p for p in self.procs if p.poll() is None]
        self.launcher = self._spawn(["manage.py", "launch"], self.log.name)
        self.t_launch = time.time()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "PEARL is up" in self.log.read_text(errors="replace"):
                self.up_s = time.time() - self.t_launch
                self.token = json.loads((self.var / "demo-credentials.json").read_text())["token"]
                return
            if self.launcher.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the stack did not come up; see {self.log}")

    def pearl(self, *args: str) -> float:
        """`pearl ARGS` against this stack; its wall seconds."""
        t0 = time.monotonic()
        subprocess.run(
            [PEARL, *args],
            env=dict(os.environ, PEARL_URL=f"http://127.0.0.1:{self.port}", PEARL_TOKEN=self.token),
            check=True,
            capture_output=True,
            timeout=120,
        )
        return time.monotonic() - t0


# ============================================================================ reading the stack
def django_setup(stack: DemoStack) -> None:
    """This process reads the stack's database with the ORM (after the first launch migrated it)."""
    for k in ("PEARL_VAR_DIR", "REDIS_URL", "DATABASE_URL"):
        os.environ.pop(k, None)
        if k in stack.env:
            os.environ[k] = stack.env[k]
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pearl_site.settings")
    import django

    django.setup()


def demo_jobs(stack: DemoStack) -> dict[str, dict[str, Any]]:
    """The demo's jobs by kind (`calc`, `swe`): the launcher names them calc-N / swe-N."""
    jobs = stack.api("GET", "jobs/")["results"]
    return {j["name"].split("-")[0]: j for j in jobs if j["status"] in ("running", "paused")}


def ckpt_dir(stack: DemoStack, job: str) -> Path | None:
    """The job's trainer checkpoint directory on its training node's agent (`jobs/<job>/worker-<id>/ckpt`)."""
    found = sorted((stack.var / "agents").glob(f"*/jobs/{job}/worker-*/ckpt"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def durable(ckpt: Path) -> dict[int, set[str]]:
    """Per step not trained yet, the trajectories whose samples the trainer acknowledged (its step buffer)."""
    from agents.trainer.server import StepBuffer

    return {step: set(held) for step, held in StepBuffer(ckpt).steps.items()}


def updates(ckpt: Path) -> dict[int, dict[str, Any]]:
    """The trainer's audit: step -> its committed update (trajectories trained, missing, version)."""
    out: dict[int, dict[str, Any]] = {}
    path = ckpt / "updates.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            u = json.loads(line)
            out[int(u["step"])] = u
    return out


def last_turn_id(job_id: int) -> int:
    from controlplane.models import TelemetrySample

    return (
        TelemetrySample.objects.filter(job_id=job_id, kind="turn").order_by("-id").values_list("id", flat=True).first()
        or 0
    )


def first_turn_after(job_id: int, mark: int) -> float | None:
    """When the control plane stored the job's first TURN record after the row `mark` (epoch seconds)."""
    from controlplane.models import TelemetrySample

    created = (
        TelemetrySample.objects.filter(job_id=job_id, kind="turn", id__gt=mark)
        .order_by("id")
        .values_list("created", flat=True)
        .first()
    )
    return created.timestamp() if created else None


def wait(what: str, cond: Any, timeout_s: float, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(every_s)
    raise TimeoutError(f"waited {timeout_s:.0f} s for {what}")


def mid_rollout(ckpt: Path, batch: int, timeout_s: float = 300.0) -> tuple[int, set[str]]:
    """Until a trajectory of the step in flight becomes durable with others of it still running: (step, its
    durable trajectories)."""
    before = durable(ckpt)

    def grown() -> tuple[int, set[str]] | None:
        nonlocal before
        now = durable(ckpt)
        hit = next(((s, n) for s, n in now.items() if n - before.get(s, set()) and 0 < len(n) < batch // 2 + 1), None)
        before = now
        return hit

    return wait("a step in flight with some trajectories durable", grown, timeout_s, every_s=0.1)


def processes(pids: list[int]) -> list[dict[str, Any]]:
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            out.append({"pid": pid, "cmd": b" ".join(a for a in argv if a).decode(errors="replace")[:160]})
    return out


def driver_lines(stack: DemoStack, needle: str, since: float) -> list[str]:
    """The rollout drivers' log lines (`agents/<node>/drivers/<job>.log`) with `needle`, logged since `since`."""
    after = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
    return [
        f"{log.stem}: {line}"
        for log in sorted((stack.var / "agents").glob("*/drivers/*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if needle in line and line[:19] >= after
    ]


# ============================================================================ one restart
def kill(stack: DemoStack, mode: str, settle_s: float) -> dict[str, Any]:
    """SIGKILL the launcher's process group (or the whole stack); after `settle_s`, the stack's processes
    still alive are orphans: listed, then SIGKILLed so that the relaunch can start."""
    t0 = time.monotonic()
    if mode == "group":
        os.killpg(stack.launcher.pid, signal.SIGKILL)
    else:
        for pid in own_leftovers(str(stack.var)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        stack.launcher.wait(timeout=10)
    deadline = time.monotonic() + settle_s
    last_seen: dict[str, float] = {}  # what each process of the stack is, and when it was last alive
    while (alive := processes(own_leftovers(str(stack.var)))) and time.monotonic() < deadline:
        last_seen |= {f"{o['pid']} {o['cmd']}": time.monotonic() - t0 for o in alive}
        time.sleep(0.2)
    gone_s = time.monotonic() - t0
    slowest = sorted(last_seen.items(), key=lambda kv: -kv[1])[:5]
    orphans = processes(own_leftovers(str(stack.var)))
    for o in orphans:
        with contextlib.suppress(ProcessLookupError):
            os.kill(o["pid"], signal.SIGKILL)
    time.sleep(0.5)
    return {
        "stack_gone_s": round(gone_s, 2),
        "slowest_to_end": [{"process": p[:120], "alive_s": round(t, 1)} for p, t in slowest],
        "orphans": orphans,
    }


def audit(stack: DemoStack, job: dict[str, Any], ckpt: Path, step: int, held: set[str]) -> dict[str, Any]:
    """The step in flight at the kill, once trained: the API's audit counts and the trainer's."""
    u = updates(ckpt)[step]
    trained = set(u["trajectories"])

    def audited() -> dict[str, Any] | None:  # the records, once the step's TrainedReport marked them
        steps = stack.api("GET", f"jobs/{job['id']}/trajectories/steps/")
        row = next((s for s in steps if s["step"] == step), None)
        return row if row and row["trained"] + row["untrained"] >= row["total"] else None

    try:
        row = wait(f"the records of step {step} marked trained", audited, 60, every_s=0.5)
    except TimeoutError:
        row = next((s for s in stack.api("GET", f"jobs/{job['id']}/trajectories/steps/") if s["step"] == step), None)
    replaced = sorted(t for t in trained if "-r" in t)
    return {
        "step": step,
        "batch": job["batch_size"],
        "durable_at_kill": len(held),
        "api": {k: row[k] for k in ("total", "trained", "untrained", "rerun", "resumed")} if row else None,
        "trainer": {
            "trained": len(trained),
            "durable_trained_as_they_were": len(held & trained),
            "durable_regenerated": len({t.split("-r")[0] for t in replaced} & held),
            "replacements": len(replaced),
            "missing": len(u.get("missing") or []),
            "version": u.get("version"),
        },
    }


def restart_run(stack: DemoStack, watch: str, mode: str, settle_s: float) -> dict[str, Any]:
    jobs = demo_jobs(stack)
    w = jobs[watch]
    wait(f"a first update of {w['name']}", lambda: demo_jobs(stack)[watch]["weight_version"] >= 1, 600, every_s=1)
    ck = wait(f"the trainer checkpoint of {w['name']}", lambda: ckpt_dir(stack, w["name"]), 60)
    step, _ = mid_rollout(ck, int(w["batch_size"]))
    ckpts = {k: ckpt_dir(stack, j["name"]) for k, j in jobs.items()}
    out = kill(stack, mode, settle_s)
    held = {k: (durable(c) if c else {}) for k, c in ckpts.items()}  # after the kill: what survived it
    at_kill: dict[str, dict[str, Any]] = {}
    for k, j in jobs.items():  # the steps not trained at the kill: the one in flight and any buffered
        current = step if k == watch else _job_step(j["id"])
        at_kill[k] = {
            "steps": sorted(set(held[k]) | ({current} if current is not None else set())),
            "durable": {s: len(n) for s, n in held[k].items()},
        }
    marks = {k: last_turn_id(j["id"]) for k, j in jobs.items()}
    stack.start()
    t0 = stack.t_launch
    first: dict[str, float | None] = dict.fromkeys(jobs)
    deadline = time.monotonic() + 240
    while None in first.values() and time.monotonic() < deadline:
        for k, j in jobs.items():
            first[k] = first[k] or first_turn_after(j["id"], marks[k])
        time.sleep(0.25)
    per_job: dict[str, Any] = {}
    for k, j in jobs.items():
        c = ckpts[k]
        turn = first[k]
        entry: dict[str, Any] = {
            "name": j["name"],
            "first_turn_s": round(turn - t0, 2) if turn is not None else None,
            "at_kill": at_kill[k],
            "in_flight": [],
        }
        for s in at_kill[k]["steps"]:
            if c is None:
                break
            try:
                wait(f"step {s} of {j['name']} trained", lambda c=c, s=s: s in updates(c), 300, every_s=0.5)
                entry["in_flight"].append(audit(stack, j, c, s, held[k].get(s, set())))
            except TimeoutError as exc:
                entry["in_flight"].append({"step": s, "error": str(exc)})
        per_job[k] = entry
    out |= {
        "watched": watch,
        "watched_step": step,
        "up_s": round(stack.up_s, 2),
        "jobs": per_job,
        "driver_recovery": driver_lines(stack, "resumed:", t0),
        "load": os.getloadavg()[0],
    }
    return out


def _job_step(job_id: int) -> int | None:
    from controlplane.models import Job

    return Job.objects.filter(pk=job_id).values_list("step", flat=True).first()


# ============================================================================ pause and resume
def released(stack: DemoStack, job_id: int) -> bool:
    st = stack.api("GET", f"jobs/{job_id}/status/")
    workers = st.get("workers") or []
    status = (st.get("job") or st).get("status")
    return status == "paused" and all(
        w["role"] == "training" or (w["zone"] == "overlap" and w["activity"] != "active") for w in workers
    )


def serving(stack: DemoStack, job_id: int) -> bool:
    st = stack.api("GET", f"jobs/{job_id}/status/")
    return any(w["role"] != "training" and w["activity"] == "active" for w in st.get("workers") or [])


def pause_run(stack: DemoStack, watch: str) -> dict[str, Any]:
    j = demo_jobs(stack)[watch]
    ck = ckpt_dir(stack, j["name"])
    assert ck is not None
    step, held = mid_rollout(ck, int(j["batch_size"]))
    t0 = time.monotonic()
    cli_pause_s = stack.pearl("pause", j["name"])
    wait("the job paused with its rollout workers released", lambda: released(stack, j["id"]), 120, every_s=0.2)
    released_s = time.monotonic() - t0
    time.sleep(3.0)
    mark = last_turn_id(j["id"])
    t1 = time.time()
    cli_resume_s = stack.pearl("resume", j["name"])
    # a turn the drain interrupted may be recorded late (the driver's link): the new turns are those stored once
    # the job serves again
    wait("rollout workers serving again", lambda: serving(stack, j["id"]), 120, every_s=0.2)
    serving_s = time.time() - t1
    mark = max(mark, last_turn_id(j["id"]))
    turn = wait("a new turn after the resume", lambda: first_turn_after(j["id"], mark), 120, every_s=0.2)
    return {
        "job": j["name"],
        "step": step,
        "durable_at_pause": len(held),
        "released_s": round(released_s, 2),
        "serving_after_resume_s": round(serving_s, 2),
        "first_turn_after_resume_s": round(turn - t1, 2),
        "cli_pause_s": round(cli_pause_s, 2),
        "cli_resume_s": round(cli_resume_s, 2),
        "load": os.getloadavg()[0],
    }


# ============================================================================ report
def _med(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 2) if xs else None


def summary(runs: list[dict[str, Any]], pauses: list[dict[str, Any]]) -> dict[str, Any]:
    kinds = sorted({k for r in runs for k in r["jobs"]})
    out: dict[str, Any] = {"up_s": _med([r["up_s"] for r in runs])}
    for k in kinds:
        jr = [r["jobs"][k] for r in runs if k in r["jobs"]]
        audits = [f for e in jr for f in e["in_flight"] if "error" not in f]

        def total(key: str, part: str, audits: list[dict[str, Any]] = audits) -> int | None:
            got = [(f.get(part) or {}).get(key) for f in audits]
            return sum(g for g in got if g is not None) if any(g is not None for g in got) else None

        out[k] = {
            "first_turn_s": _med([e["first_turn_s"] for e in jr]),
            "steps_audited": len(audits),
            "durable_regenerated": total("durable_regenerated", "trainer"),
            "replacements": total("replacements", "trainer"),
            "api_rerun": total("rerun", "api"),
            "api_resumed": total("resumed", "api"),
        }
    if pauses:
        out["pause"] = {
            "released_s": _med([p["released_s"] for p in pauses]),
            "serving_after_resume_s": _med([p["serving_after_resume_s"] for p in pauses]),
            "first_turn_after_resume_s": _med([p["first_turn_after_resume_s"] for p in pauses]),
        }
    return out


def text(runs: list[dict[str, Any]], pauses: list[dict[str, Any]], summ: dict[str, Any], first: int = 1) -> str:
    lines = []
    for i, r in enumerate(runs, first):
        lines.append(
            f"restart {i} (kill {r['kill']}, watched {r['watched']} step {r['watched_step']}): stack gone in "
            f"{r['stack_gone_s']} s, {len(r['orphans'])} orphan(s){' ' + str(r['orphans']) if r['orphans'] else ''}; "
            f"up in {r['up_s']} s; load {r['load']:.1f}"
        )
        for k, e in r["jobs"].items():
            lines.append(f"  {k}: first new turn {e['first_turn_s']} s after the relaunch")
            for f in e["in_flight"]:
                t = f.get("trainer") or {}
                lines.append(
                    f"    step {f.get('step')} (B={f.get('batch')}): {f.get('durable_at_kill')} durable at the kill, "
                    f"trained {t.get('trained')}, {t.get('durable_regenerated')} durable regenerated, "
                    f"{t.get('replacements')} replacements (-rN); API audit {f.get('api')}{f.get('error', '')}"
                )
        for line in r["driver_recovery"]:
            lines.append(f"  log: {line.strip()[:200]}")
    for i, p in enumerate(pauses, first):
        lines.append(
            f"pause {i} ({p['job']} step {p['step']}, {p['durable_at_pause']} durable): released in "
            f"{p['released_s']} s; after resume serving in {p['serving_after_resume_s']} s, first new turn "
            f"{p['first_turn_after_resume_s']} s; load {p['load']:.1f}"
        )
    lines.append(f"medians: {json.dumps(summ)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="kill-and-relaunch runs (default 3)")
    ap.add_argument("--pauses", type=int, default=None, help="pause-and-resume runs (default --runs)")
    ap.add_argument("--job", choices=("swe", "calc"), default="swe", help="the demo job whose rollout the kill hits")
    ap.add_argument("--kill", choices=("group", "stack"), default="group")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds the stack has to end after the kill")
    ap.add_argument("--database-url", default="", help="a database of this benchmark's own (default: SQLite)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default="", help="also write the JSON here")
    args = ap.parse_args(argv)

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    base = Path(tempfile.mkdtemp(prefix="bench_restart-"))
    stack = DemoStack(base / "var", args.database_url)
    first_up = None
    runs: list[dict[str, Any]] = []
    pauses: list[dict[str, Any]] = []
    try:
        stack.start()
        first_up = stack.up_s
        django_setup(stack)
        print(f"demo up in {first_up:.1f} s on port {stack.port}, var {stack.var}", file=sys.stderr, flush=True)
        for i in range(args.runs):
            r = restart_run(stack, args.job, args.kill, args.settle) | {"kill": args.kill}
            runs.append(r)
            print(text([r], [], {}, i + 1).rsplit("\nmedians", 1)[0], file=sys.stderr, flush=True)
        for i in range(args.runs if args.pauses is None else args.pauses):
            p = pause_run(stack, args.job)
            pauses.append(p)
            print(text([], [p], {}, i + 1).rsplit("\nmedians", 1)[0], file=sys.stderr, flush=True)
    finally:
        left = stack.stop()
    summ = summary(runs, pauses)
    report = {
        "command": "manage.py launch (as make demo), PEARL_VAR_DIR/PEARL_PORT/REDIS_URL of its own",
        "args": vars(args),
        "machine": {"cpus": os.cpu_count(), "uname": " ".join(os.uname())},
        "first_launch_up_s": round(first_up, 2) if first_up else None,
        "runs": runs,
        "pauses": pauses,
        "medians": summ,
        "left_at_the_end": left,
        "var": str(stack.var),
        "python": PY,
    }
    if args.json:
        write_report(report, args.out)
    else:
        print(text(runs, pauses, summ))
        if args.out:
            Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
