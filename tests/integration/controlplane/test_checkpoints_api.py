"""A job's exported checkpoints through the real API (issue 36): the settings checked at submission (400 naming
the field), the trainer's checkpoints (written by the real exporter on the tiny model) listed with step, weight
version, time, size and path, a checkpoint killed mid-write never listed while the previous stays listed and
loadable, retention, the tar download unpacking into a directory `from_pretrained` loads, and `init_from`
resolved from another job's checkpoint (or refused naming what is missing)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import pytest
import torch

from agents import models
from agents.trainer.export import Exporter
from controlplane.core import checkpoints as ck
from controlplane.models import Event, Job
from tests.support.cluster import make_node

pytestmark = pytest.mark.django_db

BASE: dict[str, Any] = {
    "name": "ck-job",
    "engine": "torch",
    "hardware": "cpu",
    "environment": "calculator",
    "batch_size": 4,
    "group_size": 2,
    "rollout_gpus": 1,
    "training_gpus": 1,
}


def _cluster() -> None:
    make_node("roll", slots=2, hardware="cpu")
    make_node("train", pool="training", slots=1, hardware="cpu")


def _submit(api, **changes: Any) -> Any:
    return api.post("/api/jobs/", BASE | changes, format="json")


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"checkpoint_every": 0}, "checkpoint_every", "greater than or equal to 1"),
        ({"checkpoint_every": "5"}, "checkpoint_every", "must be a JSON integer"),
        ({"checkpoint_keep": -1}, "checkpoint_keep", "greater than or equal to 0"),
        ({"checkpoint_dir": "ckpts"}, "checkpoint_dir", "absolute directory path"),
        ({"init_from": "rel/dir"}, "init_from", "absolute path"),
        ({"init_from": {"job": "nope"}}, "init_from.job", "no job named 'nope'"),
        ({"init_from": {"job": "x", "stp": 1}}, "init_from", "unknown key 'stp'"),
        ({"init_from": {"job": "x", "step": -2}}, "init_from.step", "integer >= 0"),
        ({"tracking": {"tensorbord": "/x"}}, "tracking", "unknown key 'tensorbord'"),
        ({"tracking": {"tensorboard": "logs"}}, "tracking.tensorboard", "absolute log directory"),
        ({"tracking": {"mlflow": "mlruns"}}, "tracking.mlflow.uri", "a tracking URI"),
        ({"tracking": {"wandb": {"project": ""}}}, "tracking.wandb.project", "a project name"),
    ],
)
def test_bad_checkpoint_and_tracking_settings_are_a_400_naming_the_field(api, change, field, says):
    _cluster()
    r = _submit(api, **change)
    assert r.status_code == 400, r.content
    body = r.json()
    named = body.get("field") or next(iter(body.get("errors") or {}), "")
    assert named == field, body
    assert says in str(body), body
    assert not Job.objects.exists()


def test_defaults_and_the_stored_settings(api, tmp_path):
    _cluster()
    r = _submit(api, tracking={"tensorboard": str(tmp_path / "tb"), "mlflow": "file:" + str(tmp_path / "ml")})
    assert r.status_code == 201, r.content
    job = r.json()
    assert job["checkpoint_every"] == ck.DEFAULT_EVERY and job["checkpoint_keep"] == ck.DEFAULT_KEEP
    assert job["checkpoint_dir"].endswith("/checkpoints/ck-job") and job["checkpoint_dir"].startswith("/")
    assert job["tracking"] == {
        "tensorboard": {"logdir": str(tmp_path / "tb")},
        "mlflow": {"uri": "file:" + str(tmp_path / "ml"), "experiment": "pearl"},
    }


def _exporter(job: dict[str, Any], keep: int = 0) -> Exporter:
    return Exporter(Path(job["checkpoint_dir"]), every=1, keep=keep, model_spec="tiny", job=job["name"])


def test_checkpoints_are_listed_retained_and_downloaded_as_a_loadable_directory(api, tmp_path):
    _cluster()
    job = _submit(api, checkpoint_dir=str(tmp_path / "ck"), checkpoint_keep=2).json()
    model = models.load_model("tiny")
    ex = _exporter(job, keep=2)
    for step in (0, 1, 2):
        with torch.no_grad():
            next(model.parameters()).add_(0.01)  # each checkpoint holds other weights
        ex.export(model, step=step, version=step + 1)
    listed = api.get(f"/api/jobs/{job['id']}/checkpoints/").json()
    assert [c["step"] for c in listed] == [1, 2]  # retention kept the newest two
    c = listed[-1]
    assert c["weight_version"] == 3 and c["tokenizer"] == "byte" and c["path"] == str(tmp_path / "ck" / "step_00000002")
    assert c["size_bytes"] == sum(p.stat().st_size for p in Path(c["path"]).iterdir() if p.name != ck.MANIFEST)
    assert {"config.json", "generation_config.json", ck.MANIFEST} <= set(c["files"]) | {ck.MANIFEST}
    assert Event.objects.filter(job_id=job["id"], kind="checkpoint.written").count() == 2

    r = api.get(f"/api/jobs/{job['id']}/checkpoints/latest/")
    assert r.status_code == 200 and r["Content-Type"] == "application/x-tar", r
    body = b"".join(r.streaming_content)
    assert len(body) == int(r["Content-Length"])
    out = tmp_path / "export"
    with tarfile.open(fileobj=io.BytesIO(body)) as tar:
        names = tar.getnames()
        assert all(ck.servable(n) for n in names) and not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
        tar.extractall(out, filter="data")
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    prompt = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.equal(loaded(prompt).logits, model(prompt).logits)  # fp32 weights: identical

    assert api.get(f"/api/jobs/{job['id']}/checkpoints/0/").status_code == 404  # removed by retention
    r = api.get(f"/api/jobs/{job['id']}/checkpoints/x/")
    assert r.status_code == 400 and r.json()["field"] == "step"


KILLED_MID_WRITE = """
import os, sys
from pathlib import Path
from agents import models
from agents.trainer.export import Exporter

model = models.load_model("tiny")
real = model.save_pretrained

def dying(out, **kw):  # part of the shards written, then the process dies (no except, no finally runs)
    real(out, **kw)
    os._exit(9)

model.save_pretrained = dying
Exporter(Path(sys.argv[1]), every=1, keep=0, model_spec="tiny", job="ck-job").export(model, step=9, version=10)
"""


def test_a_checkpoint_killed_mid_write_leaves_the_previous_one_listed_and_loadable(api, tmp_path):
    import subprocess
    import sys

    from transformers import AutoModelForCausalLM

    _cluster()
    job = _submit(api, checkpoint_dir=str(tmp_path / "ck")).json()
    _exporter(job).export(models.load_model("tiny"), step=4, version=5)
    done = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path / "ck")], cwd=Path.cwd(), check=False)
    assert done.returncode == 9
    left = list((tmp_path / "ck").glob(".step_00000009.*.tmp"))
    assert left and any(p.name.endswith(".safetensors") for p in left[0].iterdir())  # the kill's leftovers
    assert [c["step"] for c in api.get(f"/api/jobs/{job['id']}/checkpoints/").json()] == [4]
    AutoModelForCausalLM.from_pretrained(tmp_path / "ck" / "step_00000004")
    assert api.get(f"/api/jobs/{job['id']}/checkpoints/9/").status_code == 404
    _exporter(job)  # the trainer's next start removes the leftovers
    assert not list((tmp_path / "ck").glob(".*.tmp"))


def test_init_from_another_jobs_checkpoint(api, tmp_path):
    _cluster()
    first = _submit(api, checkpoint_dir=str(tmp_path / "ck")).json()
    r = _submit(api, name="second", init_from={"job": first["name"]})
    assert r.status_code == 400 and "has no checkpoint" in r.json()["detail"], r.json()
    ex = _exporter(first)
    model = models.load_model("tiny")
    for step in (2, 5):
        ex.export(model, step=step, version=step + 1)
    r = _submit(api, name="second", init_from={"job": first["name"], "step": 3})
    assert r.status_code == 400 and r.json()["field"] == "init_from.step", r.json()
    assert "(it has 2, 5)" in r.json()["detail"]
    r = _submit(api, name="second", init_from={"job": first["name"], "step": 2})
    assert r.status_code == 201 and r.json()["init_from"] == str(tmp_path / "ck" / "step_00000002"), r.json()
    r = _submit(api, name="third", init_from={"job": first["name"]})  # no step: the newest
    assert r.status_code == 201 and r.json()["init_from"].endswith("step_00000005"), r.json()
    r = _submit(api, name="fourth", init_from=str(tmp_path / "ck" / "step_00000005"))
    assert r.status_code == 201, r.json()
    r = _submit(api, name="fifth", init_from=str(tmp_path))
    assert r.status_code == 400 and "not a checkpoint directory" in r.json()["detail"], r.json()


def test_the_job_page_lists_checkpoints_and_trackers(client, operator, api, tmp_path):
    _cluster()
    job = _submit(api, checkpoint_dir=str(tmp_path / "ck"), tracking={"tensorboard": str(tmp_path / "tb")}).json()
    client.force_login(operator)
    page = client.get(f"/jobs/{job['id']}/").content.decode()
    assert 'id="checkpoints"' in page and 'id="trackers"' in page
    assert f"pearl export {job['name']} DIR" in page
    assert '"tracking": {"tensorboard": {"logdir": ' in page  # the page's initial state: what renderTrackers draws
    _exporter(job).export(models.load_model("tiny"), step=0, version=1)
    r = client.get(f"/api/jobs/{job['id']}/checkpoints/0/")  # the page's download link, with the page's session
    assert r.status_code == 200 and r["Content-Type"] == "application/x-tar"
    from django.test import Client

    assert Client().get(f"/api/jobs/{job['id']}/checkpoints/0/").status_code == 401  # never without a login


def test_a_checkpoint_dir_is_one_jobs(api, tmp_path):
    _cluster()
    first = _submit(api, checkpoint_dir=str(tmp_path / "ck")).json()
    r = _submit(api, name="other", checkpoint_dir=str(tmp_path / "ck"))
    assert r.status_code == 400 and r.json()["field"] == "checkpoint_dir", r.json()
    assert "holds job 'ck-job'" in r.json()["detail"]
    # a checkpoint another job's trainer left there is not this job's
    Exporter(tmp_path / "ck", every=1, keep=0, model_spec="tiny", job="someone-else").export(
        models.load_model("tiny"), step=0, version=1
    )
    assert api.get(f"/api/jobs/{first['id']}/checkpoints/").json() == []
