"""`pearl checkpoints JOB` and `pearl export JOB [--step N] DIR` (issue 36): a job's exported checkpoints, and
one copied out as a Hugging Face directory (`AutoModelForCausalLM.from_pretrained(DIR)`, `vllm serve DIR`).

The control plane streams the checkpoint as a tar of its files (JSON, text and safetensors only); it is
unpacked into a temporary directory beside DIR and renamed to DIR, so DIR is complete or absent."""

from __future__ import annotations

import argparse
import json
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from controlplane.core.checkpoints import servable
from pearl_cli.client import Client, CliError


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def checkpoints_text(job: str, rows: list[dict[str, Any]]) -> str:
    if not rows:
        return f"job {job} has no checkpoint yet (one every checkpoint_every trainer updates, and one at stop)"
    table = [["STEP", "WEIGHTS", "WRITTEN", "SIZE", "TOKENIZER", "PATH"]]
    for c in rows:
        table.append(
            [
                str(c["step"]),
                f"v{c['weight_version']}",
                c["written"][:19],
                _size(c["size_bytes"]),
                c["tokenizer"],
                c["path"],
            ]
        )
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table)


def cmd_checkpoints(c: Client, args: argparse.Namespace) -> None:
    rows = c.get(f"/api/jobs/{c.job_id(args.job)}/checkpoints/")
    print(json.dumps(rows, indent=2) if args.json else checkpoints_text(args.job, rows))


def cmd_export(c: Client, args: argparse.Namespace) -> None:
    out = Path(args.dir).absolute()
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CliError(f"{out} exists and is not an empty directory", 2)
    job_id = c.job_id(args.job)
    step = "latest" if args.step is None else str(args.step)
    headers = {"Accept": "application/x-tar, application/json"}
    if c.s.token:
        headers["Authorization"] = f"Token {c.s.token}"
    req = urllib.request.Request(f"{c.s.url}/api/jobs/{job_id}/checkpoints/{step}/", headers=headers)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        try:
            with urllib.request.urlopen(req, timeout=c.timeout) as res:
                at = res.headers.get("X-Pearl-Checkpoint-Step", step)
                with tarfile.open(fileobj=res, mode="r|") as tar:
                    for member in tar:
                        if not member.isfile() or not servable(member.name):
                            raise CliError(f"the server sent {member.name!r}, which a checkpoint may not hold", 1)
                        tar.extract(member, tmp, filter="data")
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read() or b"{}").get("detail", e.reason)
            except ValueError:
                detail = e.reason
            raise CliError(f"export of job {args.job}: {detail}", 1) from None
        except urllib.error.URLError as e:
            raise CliError(f"cannot reach the control plane at {c.s.url} ({e.reason})", 3) from None
        if out.exists():
            out.rmdir()
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    files = sorted(p.name for p in out.iterdir())
    data = {"job": args.job, "step": int(at), "dir": str(out), "files": files}
    print(
        json.dumps(data, indent=2)
        if args.json
        else f"exported the checkpoint of step {at} of job {args.job} to {out} ({len(files)} files); load it with "
        f"AutoModelForCausalLM.from_pretrained({str(out)!r})"
    )


def outputs_lines(j: dict[str, Any]) -> list[str]:
    """`pearl status`'s lines on what the job hands back: its checkpoint settings and each experiment tracker (how
    far it logged, or why it fails)."""
    if "checkpoint_every" not in j:  # a server before issue 36
        return []
    keep = f"newest {j['checkpoint_keep']} kept" if j.get("checkpoint_keep") else "all kept"
    lines = [f"checkpoints: every {j['checkpoint_every']} updates and at stop, {keep}, in {j.get('checkpoint_dir')}"]
    if j.get("init_from"):
        lines.append(f"  started from {j['init_from']}")
    state = j.get("tracking_state") or {}
    for name, conf in (j.get("tracking") or {}).items():
        st = state.get(name) or {}
        where = conf.get("logdir") or conf.get("uri") or conf.get("project") or ""
        done = f"logged through step {st['step']}" if st.get("step", -1) >= 0 else "no trained step logged yet"
        lines.append(f"tracker {name} ({where}): " + (f"FAILING — {st['error']}" if st.get("error") else done))
    return lines
