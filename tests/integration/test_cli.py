"""The `pearl` CLI against a live server (a real Daphne on the test database): submit from a ROLL-style
spec, status with the live configuration and the decision, override (exact and ratio), events, stop,
drain/undrain, a bad spec rejected with the user's own key named, and actionable connection errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.cluster import make_node, run_transition
from tests.support.environment import ROOT

SPEC = """\
name: grpo-cli
model: qwen3-8b
engine: emulated
hardware: h800
rollout_batch_size: 64
num_return_sequences_in_group: 16
max_staleness: 1
sequence_length: 16384
policy: pearl
tensor_parallel_size: 1
gpus: {rollout: 4, training: 2}
"""


def pearl(cp, *args: str, token: str | None = None, env: dict[str, str] | None = None, check: bool = True):
    """Run `python -m pearl_cli` as a user would run `pearl` (its console script calls the same main)."""
    e = dict(os.environ, PEARL_URL=cp.base_url, PEARL_TOKEN=token or "", PEARL_CONFIG=str(Path(cp.tmp) / "none.toml"))
    e.update(env or {})
    r = subprocess.run(
        [sys.executable, "-m", "pearl_cli", *args], cwd=ROOT, env=e, capture_output=True, text=True, timeout=60
    )
    if check:
        assert r.returncode == 0, r.stderr
    return r


@pytest.fixture
def cp(control_plane_server, tmp_path):
    control_plane_server.tmp = tmp_path
    make_node("res-a", slots=4, hardware="H800")
    make_node("spot-a", pool="elastic", slots=2, hardware="H800")
    make_node("train-a", pool="training", slots=2, hardware="H800")
    return control_plane_server


def test_submit_status_override_events_stop(cp, tmp_path):
    from controlplane.models import Job, Override
    from controlplane.services import planner

    token = cp.user_token("alice")
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    out = pearl(cp, "submit", str(spec), "--json", token=token)
    job = json.loads(out.stdout)
    assert job["name"] == "grpo-cli" and job["batch_size"] == 64 and job["group_size"] == 16
    assert job["max_trajectory_tokens"] == 16384 and job["rollout_gpus"] == 4 and job["training_gpus"] == 2
    assert job["created_by"] == "alice"

    def replan(signal: str) -> None:  # what the Celery worker does on each signal
        tr = planner.plan_job(job_id=job["id"], signal=signal)
        if tr is not None:
            run_transition(tr)

    replan("step_start")
    text = pearl(cp, "status", "grpo-cli", token=token).stdout
    assert f"job grpo-cli (#{job['id']}) running" in text
    db = Job.objects.get(pk=job["id"])
    label = f"{db.n_prefill}P{db.n_decode}D" if db.mode == "disaggregated" else f"{db.n_colocated}C"
    assert f"configuration: {label} {db.mode}" in text
    assert "latest decision" in text and "why: " in text and "override: none" in text

    # Exact counts by default; --ratio for a ratio scaled to the budget. Both say which.
    assert "forced 1P3D exactly" in pearl(cp, "override", "grpo-cli", "--pd", "1:3", token=token).stdout
    o = Override.objects.get(job_id=job["id"])
    assert (o.force_mode, o.force_n_prefill, o.force_n_decode, o.force_exact) == ("disaggregated", 1, 3, True)
    replan("periodic")
    status = json.loads(pearl(cp, "status", str(job["id"]), "--json", token=token).stdout)
    assert "Override: exact 1P3D on" in status["latest_decision"]["reason"]
    assert status["job"]["configuration"] == "1P3D"
    ratio = pearl(cp, "override", "grpo-cli", "--pd", "1:3", "--ratio", "--borrowing", "off", token=token).stdout
    assert "forced P:D ratio 1:3 (scaled to the budget), borrowing off" in ratio
    assert "override: none" in pearl(cp, "override", "grpo-cli", "--clear", token=token).stdout.replace(
        "overrides of grpo-cli: none", "override: none"
    )
    o.refresh_from_db()
    assert (o.force_mode, o.force_n_prefill, o.force_exact, o.borrowing) == ("", None, False, True)

    events = pearl(cp, "events", "grpo-cli", "--kind", "override.", token=token).stdout.splitlines()
    assert len(events) == 3 and all("override.set" in line and "[alice]" in line for line in events)
    listed = json.loads(pearl(cp, "list", "--json", token=token).stdout)
    assert [j["name"] for j in listed] == ["grpo-cli"]

    assert "job grpo-cli stopped" in pearl(cp, "stop", "grpo-cli", token=token).stdout
    again = pearl(cp, "stop", "grpo-cli", token=token, check=False)
    assert again.returncode == 1 and "already stopped" in again.stderr


def test_status_says_what_a_pending_job_waits_for(cp, tmp_path):
    from controlplane.services import planner

    token = cp.user_token("alice")
    spec = tmp_path / "job.yaml"
    ids = []
    for name in ("first", "second"):  # the first binds train-a's 2 training GPUs; the second finds none free
        spec.write_text(SPEC.replace("name: grpo-cli", f"name: {name}"))
        ids.append(json.loads(pearl(cp, "submit", str(spec), "--json", token=token).stdout)["id"])
        tr = planner.plan_job(job_id=ids[-1], signal="step_start")
        if tr is not None:
            run_transition(tr)
    text = pearl(cp, "status", "second", token=token).stdout
    assert f"job second (#{ids[1]}) pending" in text
    assert "  pending: waiting for training GPUs: 0 of 2 bound (no free 1-GPU" in text
    assert "pending:" not in pearl(cp, "status", "first", token=token).stdout


def test_bad_spec_names_the_users_key_and_creates_nothing(cp, tmp_path):
    from controlplane.models import Job

    token = cp.user_token("alice")
    spec = tmp_path / "bad.yaml"
    spec.write_text(
        SPEC.replace("rollout_batch_size: 64", "rollout_batch_size: 60").replace("name: grpo-cli", "name: bad")
    )
    r = pearl(cp, "submit", str(spec), token=token, check=False)
    assert r.returncode == 1 and "rollout_batch_size: batch_size must be a multiple of group_size" in r.stderr
    spec.write_text(SPEC.replace("gpus: {rollout: 4, training: 2}", "gpus: {rollout: 400, training: 2}"))
    r = pearl(cp, "submit", str(spec), token=token, check=False)
    assert r.returncode == 1 and "gpus.rollout: rollout_gpus=400 is above the cluster's 6 rollout GPUs" in r.stderr
    spec.write_text(SPEC + "rollout_batch: 3\n")
    r = pearl(cp, "submit", str(spec), token=token, check=False)
    assert r.returncode == 2 and "unknown key 'rollout_batch'" in r.stderr
    assert not Job.objects.exists()


def test_nodes_drain_undrain_and_errors_a_person_can_act_on(cp, tmp_path):
    token = cp.user_token("alice")
    nodes = json.loads(pearl(cp, "nodes", "--json", token=token).stdout)
    assert [n["name"] for n in nodes] == ["res-a", "spot-a", "train-a"]
    assert "node spot-a: draining" in pearl(cp, "drain", "spot-a", token=token).stdout
    assert "node spot-a: returned to service (status ready)" in pearl(cp, "undrain", "spot-a", token=token).stdout
    assert (
        "preemption notice sent (status draining)"
        in pearl(cp, "preempt", "spot-a", "--deadline", "600", token=token).stdout
    )
    assert "returned to service" in pearl(cp, "undrain", "spot-a", token=token).stdout
    r = pearl(cp, "undrain", "res-a", token=token, check=False)
    assert r.returncode == 1 and "not draining or gone" in r.stderr

    viewer = cp.user_token("bob", operator=False)
    r = pearl(cp, "drain", "res-a", token=viewer, check=False)
    assert r.returncode == 1 and "changes need an operator" in r.stderr
    r = pearl(cp, "list", token="not-a-token", check=False)
    assert r.returncode == 1 and "PEARL_TOKEN" in r.stderr
    r = pearl(cp, "list", token=token, env={"PEARL_URL": "http://127.0.0.1:1"}, check=False)
    assert r.returncode == 3 and "cannot reach the control plane" in r.stderr

    # A config file instead of the environment (`pearl configure` writes it, mode 0600).
    cfg = tmp_path / "pearl.toml"
    pearl(cp, "configure", "--url", cp.base_url, "--token", token, env={"PEARL_CONFIG": str(cfg)})
    assert oct(cfg.stat().st_mode & 0o777) == "0o600"
    r = pearl(cp, "list", env={"PEARL_CONFIG": str(cfg), "PEARL_URL": "", "PEARL_TOKEN": ""})
    assert "no jobs" in r.stdout


def test_submit_the_agent_example_and_list_its_trajectories(cp):
    from agents.driver.trajectories import summarize
    from controlplane.models import Job
    from controlplane.services.trajectories import record_trajectories

    token = cp.user_token("alice")
    job = json.loads(pearl(cp, "submit", "examples/agents/job.yaml", "--json", token=token).stdout)
    assert job["environment"] == "agent" and job["agent"]["tasks"] == "examples/agents/tasks.jsonl"
    agent = Job.objects.get(name="calc-agent").agent
    assert agent["agent_concurrency"] == 64 and agent["agent_max_attempts"] == 3  # every agent field arrives
    out = pearl(cp, "trajectories", "calc-agent", token=token)
    assert "no trajectories" in out.stdout
    sample = {
        "tokens": [1, 2, 3, 4],
        "mask": [0, 0, 1, 1],
        "logprobs": [0, 0, -0.5, -0.5],
        "weight_versions": [2],
        "workers": [3],
        "latency_s": [0.1],
    }
    for step in (0, 1):
        record_trajectories(
            job_id=job["id"],
            step=step,
            trajectories=[
                summarize(f"s{step}-t0", {"samples": [sample], "reward": 1.0, "turns": 1, "status": "done"}),
                summarize(f"s{step}-t1", {"status": "failed", "reason": "the agent exited with status 1"}),
            ],
        )
    out = pearl(cp, "trajectories", "calc-agent", token=token).stdout  # the latest step by default
    assert "s1-t0" in out and "s0-t0" not in out and "2/4" in out and "v2" in out
    assert "the agent exited with status 1" in out and "given up" not in out
    assert "step 1: trained 0, untrained 0, rerun 0, resumed 0" in out  # the step's audit: not trained yet
    # step 0's STEP record: a member given up and its group dropped (the driver reports it)
    from controlplane.core import telemetry as tm
    from controlplane.models import TelemetrySample

    rec = tm.step(job="calc-agent", step=0, batch_size=2, given_up=1, dropped_groups=1).to_json()
    TelemetrySample.objects.create(job_id=job["id"], kind="step", record=rec)
    out = pearl(cp, "trajectories", "calc-agent", "--step", "0", token=token).stdout
    assert "step 0: 1 member(s) given up after agent_max_attempts, 1 group(s) dropped" in out
    rows = json.loads(
        pearl(cp, "trajectories", str(job["id"]), "--step", "0", "--status", "done", "--json", token=token).stdout
    )
    assert [r["name"] for r in rows] == ["s0-t0"] and rows[0]["mask"] == [0, 0, 1, 1]
    bad = pearl(cp, "trajectories", "calc-agent", "--limit", "999", token=token, check=False)
    assert bad.returncode != 0 and "limit" in bad.stderr


def test_pause_and_resume(cp, tmp_path):
    from controlplane.models import Event, Job, Worker
    from controlplane.services import planner

    token = cp.user_token("alice")
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC)
    jid = json.loads(pearl(cp, "submit", str(spec), "--json", token=token).stdout)["id"]
    run_transition(planner.plan_job(job_id=jid, signal="step_start"))
    early = pearl(cp, "resume", "grpo-cli", token=token, check=False)
    assert early.returncode == 1 and "only a paused job can be resumed" in early.stderr
    out = pearl(cp, "pause", "grpo-cli", token=token).stdout
    assert "job grpo-cli paused at step 0: its rollout workers are released" in out
    again = pearl(cp, "pause", "grpo-cli", token=token, check=False)
    assert again.returncode == 1 and "only a running job can be paused" in again.stderr
    run_transition(planner.plan_job(job_id=jid, signal="capacity_change"))
    assert not Worker.objects.filter(job_id=jid, alive=True, zone="rollout").exists()
    assert "paused" in pearl(cp, "status", "grpo-cli", token=token).stdout
    resumed = json.loads(pearl(cp, "resume", "grpo-cli", "--json", token=token).stdout)
    assert resumed["status"] == "running" and Job.objects.get(pk=jid).status == "running"
    assert [e.actor for e in Event.objects.filter(job_id=jid, kind__in=["job.paused", "job.resumed"])] == ["alice"] * 2
