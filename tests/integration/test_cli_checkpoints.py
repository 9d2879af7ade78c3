"""`pearl checkpoints` and `pearl export` against a live server (a real Daphne on the test database, issue 36):
a job submitted from a spec with its checkpoint settings, the trainer's checkpoints (the real exporter, tiny
model) listed, the newest and a chosen step exported into directories that transformers loads with the same
logits, and an unknown step or a non-empty target refused with what to do."""

from __future__ import annotations

import json

import pytest
import torch

from agents import models
from agents.trainer.export import Exporter
from tests.integration.test_cli import pearl
from tests.support.cluster import make_node

SPEC = """\
name: ck-cli
model: tiny
engine: torch
hardware: cpu
rollout_batch_size: 4
num_return_sequences_in_group: 2
environment: calculator
gpus: {{rollout: 1, training: 1}}
checkpoint_every: 5
checkpoint_keep: 0
checkpoint_dir: {ckdir}
"""


@pytest.fixture
def cp(control_plane_server, tmp_path):
    control_plane_server.tmp = tmp_path
    make_node("roll", slots=2, hardware="cpu")
    make_node("train", pool="training", slots=1, hardware="cpu")
    return control_plane_server


def test_checkpoints_listed_and_exported(cp, tmp_path):
    from transformers import AutoModelForCausalLM

    token = cp.user_token("alice")
    spec = tmp_path / "job.yaml"
    spec.write_text(SPEC.format(ckdir=tmp_path / "ck"))
    pearl(cp, "submit", str(spec), token=token)
    assert "has no checkpoint yet" in pearl(cp, "checkpoints", "ck-cli", token=token).stdout

    model = models.load_model("tiny")
    ex = Exporter(tmp_path / "ck", every=5, keep=0, model_spec="tiny", job="ck-cli")
    logits = {}
    for step in (4, 9):
        with torch.no_grad():
            next(model.parameters()).mul_(1.01)
            logits[step] = model(torch.tensor([[5, 6, 7]])).logits
        ex.export(model, step=step, version=step + 1)

    out = pearl(cp, "checkpoints", "ck-cli", token=token).stdout
    assert out.splitlines()[0].split() == ["STEP", "WEIGHTS", "WRITTEN", "SIZE", "TOKENIZER", "PATH"]
    assert [ln.split()[:2] for ln in out.splitlines()[1:]] == [["4", "v5"], ["9", "v10"]]
    rows = json.loads(pearl(cp, "checkpoints", "ck-cli", "--json", token=token).stdout)
    assert [r["path"] for r in rows] == [str(tmp_path / "ck" / "step_00000004"), str(tmp_path / "ck" / "step_00000009")]

    for args, step in ((["--step", "4"], 4), ([], 9)):
        target = tmp_path / f"out-{step}"
        r = pearl(cp, "export", "ck-cli", str(target), *args, token=token)
        assert f"step {step}" in r.stdout and str(target) in r.stdout
        loaded = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
        with torch.no_grad():
            assert torch.equal(loaded(torch.tensor([[5, 6, 7]])).logits, logits[step])
        assert not list(tmp_path.glob(f".out-{step}.*"))  # the temporary directory went

    r = pearl(cp, "export", "ck-cli", str(tmp_path / "out-x"), "--step", "3", token=token, check=False)
    assert r.returncode == 1 and "no checkpoint at step 3 (steps: 4, 9)" in r.stderr, r.stderr
    assert not (tmp_path / "out-x").exists()
    r = pearl(cp, "export", "ck-cli", str(tmp_path / "out-9"), token=token, check=False)
    assert r.returncode == 2 and "not an empty directory" in r.stderr, r.stderr


def test_status_says_where_checkpoints_go_and_how_each_tracker_fares():
    from pearl_cli.checkpoints import outputs_lines

    job = {
        "checkpoint_every": 10,
        "checkpoint_keep": 3,
        "checkpoint_dir": "/ck/j",
        "init_from": "",
        "tracking": {"tensorboard": {"logdir": "/tb"}, "wandb": {"project": "p"}},
        "tracking_state": {
            "tensorboard": {"step": 7, "error": ""},
            "wandb": {"step": -1, "error": "wandb: not installed"},
        },
    }
    assert outputs_lines(job) == [
        "checkpoints: every 10 updates and at stop, newest 3 kept, in /ck/j",
        "tracker tensorboard (/tb): logged through step 7",
        "tracker wandb (p): FAILING — wandb: not installed",
    ]
    assert outputs_lines({}) == []
