"""`pearl` — launch, watch and steer PEARL jobs from a terminal (the same REST API as the dashboard).

Server URL and token: --url/--token, else PEARL_URL / PEARL_TOKEN, else ~/.config/pearl/config.toml
(`pearl configure`). Every command takes --json for scripts. Exit status: 0 ok, 1 refused by the
server, 2 bad usage or spec, 3 server unreachable.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from pearl_cli.checkpoints import cmd_checkpoints, cmd_export, outputs_lines
from pearl_cli.client import ApiError, Client, CliError, load_settings, save_settings
from pearl_cli.profile import cmd_profile
from pearl_cli.spec import load_spec


def _config(j: dict[str, Any]) -> str:
    return f"{j['n_prefill']}P{j['n_decode']}D" if j.get("mode") == "disaggregated" else f"{j.get('n_colocated', 0)}C"


def _s(x: Any) -> str:
    return "–" if x is None else f"{float(x):.1f} s"


def _out(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2) if args.json else text)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


# ---- commands ----------------------------------------------------------------------------------------
def cmd_configure(c: Client, args: argparse.Namespace) -> None:
    path = save_settings(args.url or c.s.url, args.token or c.s.token)
    _out(
        args,
        {"config": str(path), "url": args.url or c.s.url},
        f"saved {path} (url {args.url or c.s.url}); PEARL_URL / PEARL_TOKEN still override it",
    )


def cmd_submit(c: Client, args: argparse.Namespace) -> None:
    body, wrote = load_spec(args.spec, name=args.name)
    try:
        job = c.post("/api/jobs/", body)
    except ApiError as e:  # name the key the user wrote (rollout_batch_size, gpus.training, ...), every one
        errors = e.body.get("errors")
        if not isinstance(errors, dict):
            detail = str(e.body.get("detail", ""))
            errors = {
                e.field: detail[len(f"{e.field}: ") :] if e.field and detail.startswith(f"{e.field}: ") else detail
            }
        lines = [
            f"{args.spec}: {wrote.get(f, f) + ': ' if f and f != 'non_field_errors' else ''}"
            f"{' '.join(map(str, m)) if isinstance(m, list) else m}"
            for f, m in errors.items()
        ]
        raise CliError("\n".join(lines), 1) from None
    _out(
        args, job, f"submitted job {job['name']} (#{job['id']}, {job['status']}); watch it: pearl status {job['name']}"
    )


def cmd_list(c: Client, args: argparse.Namespace) -> None:
    jobs = c.get("/api/jobs/", limit=args.limit)["results"]
    rows = [["ID", "NAME", "STATUS", "POLICY", "CONFIG", "STEP", "WEIGHTS", "CREATED BY"]]
    rows += [
        [
            str(j["id"]),
            j["name"],
            j["status"],
            j["policy"],
            _config(j),
            str(j["step"]),
            f"v{j['weight_version']}",
            j.get("created_by") or "",
        ]
        for j in jobs
    ]
    _out(args, jobs, _table(rows) if jobs else "no jobs; submit one: pearl submit spec.yaml")


def status_text(st: dict[str, Any], top: int = 5) -> str:
    j = st["job"]
    lines = [
        f"job {j['name']} (#{j['id']}) {j['status']} — policy {j['policy']}, step {j['step']}, "
        f"weights v{j['weight_version']}"
    ]
    if j.get("failure_reason"):
        lines.append(f"  failed: {j['failure_reason']}")
    if j.get("status_reason"):  # what a pending job waits for (the planner's admission), for a person to act on
        lines.append(f"  {j['status']}: {j['status_reason']}")
    sh = j.get("sharing")
    if sh:  # the cluster arbiter's share (issue 35)
        allotted = sh["allotted_rollout_gpus"]
        lines.append(
            f"share: {'not divided yet' if allotted is None else f'allotted {allotted}'} of at most "
            f"{sh['max_rollout_gpus'] or 'all'} rollout GPUs, holds {sh['held_rollout_gpus']}; guaranteed "
            f"{sh['min_rollout_gpus']}, priority {sh['priority']}, weight {sh['weight']:g}"
        )
        # cross-job lends of idle training GPUs, each until its owner's next Training Begin
        for other, gpus in sorted((sh.get("borrows") or {}).items()):
            lines.append(f"  borrows {gpus} training GPU(s) of job {other} until {other}'s next Training Begin")
        for other, gpus in sorted((sh.get("lends") or {}).items()):
            lines.append(f"  lends {gpus} training GPU(s) to job {other} until its next Training Begin")
        if sh.get("not_lending"):
            lines.append(f"  lends no training GPU to other jobs: {sh['not_lending']}")
    types = j.get("hardware_types") or [j["hardware"]]
    if types != [j["hardware"]]:
        lines.append(f"hardware: training on {j['hardware']}, rollout on {', '.join(types)}")
    lines.append(
        f"configuration: {j['configuration']} {j['mode']}; trainer {'computing' if j['training_active'] else 'idle'}"
    )
    lines.append(f"override: {st['override_summary'] or 'none (the policy decides)'}")
    d = st.get("latest_decision")
    if d:
        conf = "" if d.get("confidence") is None else f", predictor confidence {100 * d['confidence']:.0f}%"
        lines.append(
            f"latest decision ({d['created'][11:19]}, signal {d['signal']}, "
            f"{'admitted' if d['admitted'] else 'suppressed'}): "
            f"{d['label']} predicts {_s(d['predicted_makespan_s'])}, "
            f"expected gain {100 * d['expected_gain']:.1f}%{conf}"
        )
        lines.append(f"  why: {d['reason']}")
        feasible = sorted(
            (x for x in d["candidates"] if x.get("feasible") and x.get("makespan_s") is not None),
            key=lambda x: x["makespan_s"],
        )
        if feasible:
            lines.append(
                "  best candidates: " + ", ".join(f"{x['label']} {_s(x['makespan_s'])}" for x in feasible[:top])
            )
    for t in st.get("transitions", [])[:1]:
        done = sum(1 for s in t["steps"] if s["status"] == "done")
        lines.append(
            f"last transition #{t['id']} → {t['plan'].get('target', '?')}: {t['status']} "
            f"({done}/{len(t['steps'])} steps done)" + (f" — {t['error']}" if t.get("error") else "")
        )
    s = st["staleness"]
    if s.get("lag") is not None:
        lines.append(
            f"staleness: workers at v{s['workers_min']}–v{s['workers_max']}, "
            f"lag {s['lag']} / bound {s['max_staleness']}"
            + (f", {s['asleep']} asleep (pull on wake)" if s.get("asleep") else "")
        )
    lines += outputs_lines(j)
    return "\n".join(lines)


def cmd_status(c: Client, args: argparse.Namespace) -> None:
    st = c.get(f"/api/jobs/{c.job_id(args.job)}/status/")
    _out(args, st, status_text(st))


def _event_line(e: dict[str, Any]) -> str:
    who = f" [{e['actor']}]" if e.get("actor") else ""
    return f"{e['created'][11:19]} {e['kind']:<24} {e['message']}{who}"


def cmd_events(c: Client, args: argparse.Namespace) -> None:
    params: dict[str, Any] = {"kind": args.kind, "node": args.node, "limit": args.limit}
    if args.job:
        params["job"] = c.job_id(args.job)
    events = list(reversed(c.get("/api/events/", **params)["results"]))
    seen = {e["id"] for e in events}
    for e in events:
        print(json.dumps(e) if args.json else _event_line(e), flush=True)
    while args.follow:
        time.sleep(args.interval)
        since = events[-1]["created"] if events else None
        fresh = [e for e in reversed(c.get("/api/events/", **params, since=since)["results"]) if e["id"] not in seen]
        for e in fresh:
            seen.add(e["id"])
            events.append(e)
            print(json.dumps(e) if args.json else _event_line(e), flush=True)


def trajectories_text(step: int | None, rows: list[dict[str, Any]], count: int) -> str:
    """A step's agent trajectories, one line each: how it ended, its reward, turns, forks, the tokens the
    policy sampled (trained on) of all kept, the weight versions and workers of its turns, why it failed."""
    if not rows:
        return "no trajectories" + (f" in step {step}" if step is not None else "") + " (an agent job reports them)"
    table = [
        ["TRAJECTORY", "STEP", "STATUS", "REWARD", "TURNS", "FORKS", "SAMPLED/TOKENS", "VERSIONS", "WORKERS", "REASON"]
    ]
    for t in rows:
        tokens = f"{sum(t['mask'])}/{t['token_count']}" + ("+" if t["truncated"] else "")
        table.append(
            [
                t["name"],
                str(t["step"]),
                t["status"] + (" untrained" if t.get("trained") is False else ""),
                "–" if t["reward"] is None else f"{t['reward']:.3g}",
                str(t["turns"]),
                str(t["forks"]),
                tokens,
                ",".join(f"v{v}" for v in sorted(set(t["weight_versions"]))),
                ",".join(str(w) for w in sorted({w for turn in t["workers"] for w in _listed(turn)})),
                (t["reason"] or "")[:60],
            ]
        )
    more = f"\n({len(rows)} of {count}; --limit shows more)" if count > len(rows) else ""
    return _table(table) + more


def _listed(turn: Any) -> list[int]:
    """A turn's workers (a list; a row stored before turns listed every worker has one id)."""
    return turn if isinstance(turn, list) else [turn]


def cmd_trajectories(c: Client, args: argparse.Namespace) -> None:
    jid = c.job_id(args.job)
    step = args.step
    steps = c.get(f"/api/jobs/{jid}/trajectories/steps/")
    if step is None:  # the latest step that has any
        step = steps[0]["step"] if steps else None
    params: dict[str, Any] = {"limit": args.limit, "status": args.status}
    if step is not None:
        params["step"] = step
    page = c.get(f"/api/jobs/{jid}/trajectories/", **params)
    text = trajectories_text(step, page["results"], page["count"])
    counts: dict[str, Any] = next((s for s in steps if s["step"] == step), {})
    if counts:  # the step's audit (issue 34): trained by its committed update, left out, rerun after a crash, resumed
        text += "\nstep {}: trained {}, untrained {}, rerun {}, resumed {}".format(
            step, *(counts.get(k, 0) for k in ("trained", "untrained", "rerun", "resumed"))
        )
    if counts.get("given_up") or counts.get("dropped_groups"):  # slots of the step's batch that were not trained
        text += (
            f"\nstep {step}: {counts.get('given_up', 0)} member(s) given up after agent_max_attempts,"
            f" {counts.get('dropped_groups', 0)} group(s) dropped (fewer than 2 left): not trained"
        )
    _out(args, page["results"], text)


def cmd_stop(c: Client, args: argparse.Namespace) -> None:
    job = c.post(f"/api/jobs/{c.job_id(args.job)}/stop/")
    _out(args, job, f"job {job['name']} {job['status']}")


def cmd_pause(c: Client, args: argparse.Namespace) -> None:
    job = c.post(f"/api/jobs/{c.job_id(args.job)}/pause/")
    _out(args, job, f"job {job['name']} {job['status']} at step {job['step']}: its rollout workers are released")


def cmd_resume(c: Client, args: argparse.Namespace) -> None:
    job = c.post(f"/api/jobs/{c.job_id(args.job)}/resume/")
    _out(args, job, f"job {job['name']} {job['status']} from step {job['step']}")


def _pd(text: str) -> tuple[int, int]:
    try:
        p, d = (int(x) for x in text.replace("P", ":").replace("D", "").split(":") if x != "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected P:D (e.g. 1:3 or 1P3D), got {text!r}") from None
    return p, d


def cmd_override(c: Client, args: argparse.Namespace) -> None:
    job_id = c.job_id(args.job)
    if args.clear:
        body: dict[str, Any] = {
            "force_mode": "",
            "force_n_prefill": None,
            "force_n_decode": None,
            "force_exact": False,
            "freeze": False,
            "borrowing": True,
            "elasticity": True,
        }
    else:
        body = {}
        if args.mode:
            body["force_mode"] = "" if args.mode == "auto" else args.mode
            if args.mode != "disaggregated":
                body |= {"force_n_prefill": None, "force_n_decode": None}
        if args.pd:
            p, d = args.pd
            body |= {"force_n_prefill": p, "force_n_decode": d, "force_exact": not args.ratio}
            body.setdefault("force_mode", "disaggregated")
        for flag in ("freeze", "borrowing", "elasticity"):
            if getattr(args, flag) is not None:
                body[flag] = getattr(args, flag) == "on"
        if not body:
            raise CliError("nothing to change: give --mode, --pd, --freeze, --borrowing, --elasticity or --clear", 2)
    o = c.request("PATCH", f"/api/jobs/{job_id}/overrides/", body)
    st = c.get(f"/api/jobs/{job_id}/status/")
    _out(
        args,
        o,
        f"overrides of {st['job']['name']}: {st['override_summary'] or 'none (the policy decides)'}; "
        "the planner re-plans now",
    )


def workers_text(st: dict[str, Any]) -> str:
    """A job's alive workers, one a line: slot, role, activity, the node and chip type it runs on, its GPUs."""
    ws = st.get("workers") or []
    if not ws:
        return f"job {st['job']['name']} has no workers (yet)"
    rows = [["SLOT", "ROLE", "ACTIVITY", "NODE", "POOL", "HARDWARE", "GPUS", "WEIGHTS"]]
    for w in ws:
        rows.append(
            [
                f"w{w['slot']}",
                w["role"],
                w["activity"],
                w["node"],
                w["pool"],
                w["hardware"],
                ",".join(str(g) for g in w["gpus"]),
                f"v{w['weight_version']}",
            ]
        )
    counts: dict[str, int] = {}
    for w in ws:
        if w["role"] != "training":
            counts[w["hardware"]] = counts.get(w["hardware"], 0) + 1
    summary = ", ".join(f"{n} on {hw}" for hw, n in sorted(counts.items()))
    return _table(rows) + (f"\nrollout workers: {summary}" if summary else "")


def cmd_workers(c: Client, args: argparse.Namespace) -> None:
    st = c.get(f"/api/jobs/{c.job_id(args.job)}/status/")
    _out(args, st.get("workers") or [], workers_text(st))


def cmd_nodes(c: Client, args: argparse.Namespace) -> None:
    nodes = c.get("/api/cluster/")["nodes"]
    rows = [
        ["ID", "NAME", "POOL", "STATUS", "HARDWARE", "GPUS", "ACTIVE", "HEARTBEAT", "PREEMPTION", "ADDRESS", "RAY NODE"]
    ]
    for n in nodes:
        active = sum(1 for g in n["gpus"] if g["activity"] == "active")
        hb = "–" if n["heartbeat_age_s"] is None else f"{n['heartbeat_age_s']:.0f}s ago"
        rows.append(
            [
                str(n["id"]),
                n["name"],
                n["pool"],
                n["status"],
                n["hardware"],
                str(len(n["gpus"])),
                str(active),
                hb,
                n["preemption_deadline"] or "",
                n.get("address") or "",
                (n.get("ray_node_id") or "")[:12],
            ]
        )
    _out(args, nodes, _table(rows) if nodes else "no nodes have registered")


def _node_action(action: str, verb: str) -> Callable[[Client, argparse.Namespace], None]:
    def run(c: Client, args: argparse.Namespace) -> None:
        body = {"deadline_s": args.deadline} if action == "preemption" else None
        node = c.post(f"/api/nodes/{c.node_id(args.node)}/{action}/", body)
        _out(args, node, f"node {node['name']}: {verb} (status {node['status']})")

    return run


def cmd_simulate(c: Client, args: argparse.Namespace) -> None:
    run = c.post("/api/simulations/", {"scenario": args.scenario, "seed": args.seed, "policies": args.policies or []})
    while run["status"] in ("pending", "running") and args.wait:
        time.sleep(1.0)
        run = c.get(f"/api/simulations/{run['id']}/")
    if args.json or run["status"] != "succeeded":
        _out(args, run, f"simulation #{run['id']} {run['status']} {run.get('error') or ''}")
        return
    from controlplane.core.policies.names import FIXED  # here: only this command needs the registry's names

    pol = run["result"]["policies"]
    base = pol.get(FIXED, {}).get("throughput_tok_s")
    rows = [["POLICY", "TOKENS/S", "VS ROLL", "STEPS", "TRANSITIONS", "BORROWED GPU-S", "MISSES", "MAPE %"]]
    for p, s in pol.items():
        rows.append(
            [
                p,
                f"{s['throughput_tok_s']:,.0f}",
                f"{s['throughput_tok_s'] / base:.2f}x" if base else "–",
                str(s["steps"]),
                str(s["transitions"]),
                f"{s['borrowed_gpu_s']:,.0f}",
                str(s["return_deadline_misses"]),
                str(s["predictor_mape"]),
            ]
        )
    print(f"simulation #{run['id']} {run['scenario']} (seed {run['seed']}), {run['wall_s']:.1f} s\n" + _table(rows))


# ---- parser ------------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", help="control plane URL (default: PEARL_URL, the config file, http://127.0.0.1:8000)")
    common.add_argument("--token", help="API token (default: PEARL_TOKEN or the config file)")
    common.add_argument("--json", action="store_true", help="print JSON (for scripts)")
    ap = argparse.ArgumentParser(
        prog="pearl",
        description=__doc__.split("\n\n")[0],
        epilog="Options (--url, --token, --json) go after the command: pearl list --json",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(name: str, fn: Any, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, parents=[common])
        p.set_defaults(fn=fn)
        return p

    add("configure", cmd_configure, "save the server URL and token to the config file")
    p = add(
        "submit",
        cmd_submit,
        "submit a job from a YAML spec (ROLL-style keys: rollout_batch_size, sequence_length, ...)",
    )
    p.add_argument("spec")
    p.add_argument("--name", help="override the spec's name")
    p = add("list", cmd_list, "list jobs")
    p.add_argument("--limit", type=int, default=50)
    p = add("status", cmd_status, "a job's status, live configuration, override, latest decision and why")
    p.add_argument("job", help="job id or name")
    p = add("workers", cmd_workers, "a job's workers: role, activity, node, chip type (hardware) and GPUs")
    p.add_argument("job", help="job id or name")
    p = add("events", cmd_events, "the event timeline (optionally of one job), optionally followed")
    p.add_argument("job", nargs="?")
    p.add_argument("--kind", help="an event kind, or a prefix ending in '.' (e.g. transition.)")
    p.add_argument("--node")
    p.add_argument("--limit", type=int, default=30)
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events (Ctrl-C stops)")
    p.add_argument("--interval", type=float, default=2.0, help=argparse.SUPPRESS)
    p = add("trajectories", cmd_trajectories, "an agent job's trajectories of a step (default: the latest)")
    p.add_argument("job", help="job id or name")
    p.add_argument("--step", type=int, help="the step (default: the latest with trajectories)")
    p.add_argument("--status", choices=["running", "done", "failed", "aborted"])
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50, at most 200)")
    p = add("stop", cmd_stop, "stop a job (its workers are released)")
    p.add_argument("job")
    p = add("pause", cmd_pause, "pause a running job: its rollout GPUs are released, its trainer and step kept")
    p.add_argument("job")
    p = add("resume", cmd_resume, "resume a paused job where it was")
    p.add_argument("job")
    p = add("override", cmd_override, "set or clear a job's overrides (the planner re-plans at once)")
    p.add_argument("job")
    p.add_argument(
        "--mode", choices=["auto", "colocated", "disaggregated"], help="force a PD mode, or let the policy decide"
    )
    p.add_argument("--pd", type=_pd, metavar="P:D", help="force prefill:decode workers; exact counts unless --ratio")
    p.add_argument("--ratio", action="store_true", help="treat --pd as a ratio scaled to the job's worker budget")
    for flag, what in (
        ("freeze", "keep the current configuration"),
        ("borrowing", "borrow idle training GPUs"),
        ("elasticity", "use preemptible GPUs"),
    ):
        p.add_argument(f"--{flag}", choices=["on", "off"], help=what)
    p.add_argument("--clear", action="store_true", help="remove every override")
    add("nodes", cmd_nodes, "list nodes with pool, status, GPUs and heartbeat age")
    for name, action, verb, help_ in (
        ("drain", "drain", "draining", "drain a node (no new work; its workers finish and leave)"),
        ("undrain", "undrain", "returned to service", "return a draining or preempted node to service"),
        ("preempt", "preemption", "preemption notice sent", "send an elastic node a preemption notice"),
    ):
        p = add(name, _node_action(action, verb), help_)
        p.add_argument("node", help="node id or name")
        if name == "preempt":
            p.add_argument("--deadline", type=float, default=30.0, help="seconds from now (default 30)")
    p = add("simulate", cmd_simulate, "run a simulator comparison on the server and print the summary")
    p.add_argument("scenario")
    p.add_argument("--seed", type=int)
    p.add_argument("--policies", type=lambda s: [x.strip() for x in s.split(",") if x.strip()])
    p.add_argument("--no-wait", dest="wait", action="store_false")
    p = add("checkpoints", cmd_checkpoints, "a job's exported checkpoints: step, weights, when, size, path")
    p.add_argument("job", help="job id or name")
    p = add("export", cmd_export, "copy a job's checkpoint out as a Hugging Face directory (from_pretrained loads it)")
    p.add_argument("job", help="job id or name")
    p.add_argument("dir", help="the directory to create (absent or empty)")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    p = add("profile", cmd_profile, "the planner's prior for a model directory, from its config.json (local)")
    p.add_argument("dir", help="a save_pretrained directory (or its config.json)")
    p.add_argument("--hardware", default="H800", help="chip type (default H800)")
    p.add_argument("--tp", type=int, default=1, help="GPUs per worker (default 1)")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        client = Client(load_settings(args.url, args.token))
        args.fn(client, args)
        return 0
    except CliError as e:
        print(f"pearl: error: {e.message}", file=sys.stderr)
        return e.code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
