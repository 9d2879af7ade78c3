"""A job's model may be a `save_pretrained` directory (issue 36): one that cannot run is a 400 at submission
naming what is wrong (missing, no config, no weights, an unsupported architecture, a tokenizer without a chat
template), never a worker crash later; a good one is accepted and the planner places it on the profile derived
from its config.json. Through the real API, services, planner and executor (agents converge as reported)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from controlplane.core.profiles import get_profile
from controlplane.models import Job
from controlplane.selectors.driver import job_view
from controlplane.services import planner
from tests.support.cluster import make_node, run_transition
from tests.support.hf_models import bad_model_dir, model_dir

pytestmark = pytest.mark.django_db

BASE: dict[str, Any] = {
    "name": "own-model",
    "engine": "torch",
    "hardware": "cpu",
    "environment": "calculator",
    "tp": 1,
    "batch_size": 4,
    "group_size": 2,
    "rollout_gpus": 1,
    "training_gpus": 1,
}


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf-models")


def _cluster() -> None:
    make_node("roll", slots=2, hardware="cpu")
    make_node("train", pool="training", slots=1, hardware="cpu")


@pytest.mark.parametrize(
    ("defect", "says"),
    [
        ("missing", "does not exist"),
        ("no_config", "has no config.json"),
        ("no_weights", "has no weights"),
        ("architecture", "unsupported architecture 'gpt2' (GPT2LMHeadModel)"),
        ("no_template", "a tokenizer without a chat template"),
    ],
)
def test_a_directory_that_cannot_run_is_a_400_naming_why(api, models_root, defect, says):
    _cluster()
    path = str(bad_model_dir(models_root, defect))
    r = api.post("/api/jobs/", BASE | {"model": path}, format="json")
    assert r.status_code == 400, r.content
    assert r.json()["field"] == "model" and says in r.json()["detail"], r.json()
    assert path in r.json()["detail"]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"model": "models/llama"}, "must be given as an absolute path"),
        ({"engine": "emulated"}, "runs on engine 'torch' or 'vllm'"),
        ({"model": "llama-7b"}, "unknown model 'llama-7b'"),
    ],
)
def test_a_model_that_is_neither_a_profile_nor_a_usable_directory_is_a_400(api, models_root, change, says):
    _cluster()
    spec = BASE | {"model": str(model_dir(models_root, "llama"))} | change
    r = api.post("/api/jobs/", spec, format="json")
    assert r.status_code == 400 and r.json()["field"] == "model", r.json()
    assert says in r.json()["detail"], r.json()


def test_a_model_directory_is_accepted_and_planned_on_its_derived_profile(api, models_root):
    _cluster()
    path = str(model_dir(models_root, "qwen2"))
    r = api.post("/api/jobs/", BASE | {"model": path}, format="json")
    assert r.status_code == 201, r.content
    job = Job.objects.get(name="own-model")
    assert job.model == path and r.json()["model"] == path
    profile = get_profile("cpu", path, 1)  # registered by the submission, from config.json
    assert profile.model == path and profile.spec.layers == 2 and profile.spec.hidden == 64
    assert profile.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads, head dim 16, fp32
    assert run_transition(planner.plan_job(job_id=job.pk, signal="step_start")).status == "succeeded"
    assert job_view(Job.objects.get(pk=job.pk)).model == path  # the driver is told the directory
