"""Experiment trackers (issue 36): every trained step's scalars in TensorBoard's event files, MLflow's file store
and an offline W&B run equal the API's series (`GET /api/jobs/<id>/series/`), each step once, with the step as x,
the configuration and the decision's why as text and the job spec as the run's parameters; a tracker that fails
or whose library is missing is reported (tracking_state, a tracking.failed event) and the others go on.

A tracker whose client library is not installed here is skipped with the reason (`pip install 'pearl[tracking]'`
installs all three; the test extra installs tensorboard only)."""

from __future__ import annotations

import glob
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

from controlplane.core.telemetry import step as step_record
from controlplane.core.telemetry import train as train_record
from controlplane.models import Decision, Event, Job, TelemetrySample
from controlplane.services import tracking
from tests.support.cluster import make_node
from tests.support.environment import redis_available

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(not redis_available(), reason="the trackers' single flight is a Redis lock"),
]

BASE: dict[str, Any] = {
    "name": "tracked",
    "engine": "torch",
    "hardware": "cpu",
    "environment": "calculator",
    "batch_size": 4,
    "group_size": 2,
    "rollout_gpus": 1,
    "training_gpus": 1,
}
SCALARS = tracking.SCALARS


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_tb = pytest.mark.skipif(not _has("tensorboard"), reason="tensorboard is not installed (pearl[test] has it)")
needs_mlflow = pytest.mark.skipif(not _has("mlflow"), reason="mlflow is not installed (pip install 'pearl[tracking]')")
needs_wandb = pytest.mark.skipif(not _has("wandb"), reason="wandb is not installed (pip install 'pearl[tracking]')")


def _job(api, tracking_spec: dict[str, Any]) -> Job:
    make_node("roll", slots=2, hardware="cpu")
    make_node("train", pool="training", slots=1, hardware="cpu")
    r = api.post("/api/jobs/", BASE | {"tracking": tracking_spec}, format="json")
    assert r.status_code == 201, r.content
    return Job.objects.get(pk=r.json()["id"])


def _trained(job: Job, steps: range) -> None:
    """What the driver reports of each step: its STEP record and its trainer update's TRAIN record, with a
    decision in force before it."""
    for j in steps:
        Decision.objects.create(
            job=job, signal="step_start", mode="colocated", n_colocated=1 + j % 2, reason=f"why of step {j}"
        )
        rec = step_record(
            job=job.name,
            step=j,
            time_s=10.0 * (j + 1),
            makespan_s=3.0 + j,
            predicted_makespan_s=2.5 + j,
            reward_mean=0.1 * j + 0.05,
            reward_std=0.2 + 0.01 * j,
            generated_tokens_total=1000 + j,
            train_tokens=300,
            borrowed_gpu_s=1.25 * j,
            stale_aborted=j % 2,
            mode="colocated",
            n_colocated=1 + j % 2,
            batch_size=4,
        )
        TelemetrySample.objects.create(job=job, kind="step", record=rec.to_json())
        tr = train_record(job=job.name, step=j, loss=0.5 - 0.1 * j, weight_version=j + 1, duration_s=1.0)
        TelemetrySample.objects.create(job=job, kind="train", record=tr.to_json())


def _api_series(api, job: Job) -> dict[int, dict[str, float]]:
    series = api.get(f"/api/jobs/{job.pk}/series/").json()
    train = {t["step"]: t for t in series["train"]}
    return {
        s["step"]: {
            **{k: float(s.get(k) or 0.0) for k in SCALARS if k not in ("loss", "weight_version")},
            "loss": float(train[s["step"]]["loss"]),
            "weight_version": float(train[s["step"]]["weight_version"]),
        }
        for s in series["steps"]
    }


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))  # TensorBoard keeps float32


@needs_tb
def test_tensorboard_holds_every_trained_step_equal_to_the_api_once_each(api, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # type: ignore[import-untyped]

    job = _job(api, {"tensorboard": str(tmp_path / "tb")})
    _trained(job, range(3))
    state = tracking.sync(job.pk)
    assert state["tensorboard"]["step"] == 2 and state["tensorboard"]["error"] == ""
    _trained(job, range(3, 5))
    tracking.sync(job.pk)
    tracking.sync(job.pk)  # nothing new: nothing logged twice
    ea = EventAccumulator(str(tmp_path / "tb" / job.name), size_guidance={"scalars": 0, "tensors": 0})
    ea.Reload()
    want = _api_series(api, job)
    assert sorted(want) == [0, 1, 2, 3, 4]
    for key in SCALARS:
        got = [(e.step, e.value) for e in ea.Scalars(key)]
        assert [s for s, _ in got] == sorted(want), key  # every step once, the step as x
        assert all(_close(v, want[s][key]) for s, v in got), (key, got)
    why = {e.step: e.tensor_proto.string_val[0].decode() for e in ea.Tensors("why")}
    assert why == {j: f"why of step {j}" for j in range(5)}
    conf = {e.step: e.tensor_proto.string_val[0].decode() for e in ea.Tensors("configuration")}
    assert conf == {j: f"{1 + j % 2}C" for j in range(5)}
    spec = ea.Tensors("job_spec")[0].tensor_proto.string_val[0].decode()
    assert "model: tiny" in spec and "batch_size: 4" in spec


@needs_mlflow
def test_mlflow_file_store_holds_every_trained_step_and_the_spec(api, tmp_path):
    from mlflow.tracking import MlflowClient

    uri = "file:" + str(tmp_path / "mlruns")
    job = _job(api, {"mlflow": {"uri": uri, "experiment": "pearl-test"}})
    _trained(job, range(3))
    state = tracking.sync(job.pk)
    assert state["mlflow"]["error"] == "", state
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(state["mlflow"]["run_id"])
    assert run.data.params["model"] == "tiny" and run.data.params["batch_size"] == "4"
    assert run.data.tags["configuration"] == "1C" and run.data.tags["why"] == "why of step 2"  # the latest
    want = _api_series(api, job)
    for key in SCALARS:
        got = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        assert got == {s: want[s][key] for s in want}, key


def _wandb_history(run_dir: str) -> list[dict[str, str]]:
    """The history records of an offline W&B run file (LevelDB-style log blocks of protobuf Records)."""
    from wandb.proto import wandb_internal_pb2

    data = Path(glob.glob(f"{run_dir}/run-*.wandb")[0]).read_bytes()
    pos, records, part = 7, [], b""  # ':W&B', a 2-byte magic, a version byte
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:
            pos += 32768 - pos % 32768
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind in (2, 3):
            part = (part if kind == 3 else b"") + chunk
        elif kind == 4:
            records.append(part + chunk)
    out = []
    for raw in records:
        rec = wandb_internal_pb2.Record()  # type: ignore[attr-defined,unused-ignore]
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            out.append({i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item})
    return out


@needs_wandb
def test_wandb_offline_run_holds_every_trained_step(api, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    job = _job(api, {"wandb": "pearl-test"})
    _trained(job, range(2))
    tracking.sync(job.pk)
    _trained(job, range(2, 3))
    state = tracking.sync(job.pk)
    assert state["wandb"]["error"] == "" and state["wandb"]["step"] == 2, state
    rows = [
        h
        for d in sorted(glob.glob(f"{tmp_path}/wandb/offline-run-*-{state['wandb']['run_id']}"))
        for h in _wandb_history(d)
    ]
    want = _api_series(api, job)
    assert [int(h["_step"]) for h in rows] == [0, 1, 2]
    for h in rows:
        s = int(h["_step"])
        assert all(_close(float(h[k]), want[s][k]) for k in SCALARS), h
        assert json.loads(h["why"]) == f"why of step {s}"


@needs_tb
def test_a_failing_or_missing_tracker_is_reported_and_the_others_go_on(api, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's directory should be")
    job = _job(api, {"tensorboard": str(tmp_path / "tb"), "mlflow": f"file:{blocker}/mlruns", "wandb": "pearl-test"})
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    if not _has("mlflow"):
        monkeypatch.setitem(sys.modules, "mlflow", None)
    _trained(job, range(2))
    state = tracking.sync(job.pk)
    assert state["tensorboard"] == {"step": 1, "error": "", "params": True}
    assert state["wandb"]["step"] == -1 and "not installed" in state["wandb"]["error"], state
    assert state["mlflow"]["step"] == -1 and state["mlflow"]["error"].startswith("mlflow: "), state
    failed = Event.objects.filter(job=job, kind="tracking.failed")
    assert {e.data["tracker"] for e in failed} == {"mlflow", "wandb"}
    tracking.sync(job.pk)  # the same error again: no second event
    assert Event.objects.filter(job=job, kind="tracking.failed").count() == 2
    page = api.get(f"/api/jobs/{job.pk}/status/").json()["job"]["tracking_state"]
    assert "not installed" in page["wandb"]["error"]
