"""Checkpoints and a tracker of a live job, through real processes only (issue 36): Daphne, a Celery worker, two
node agents with the torch engine and the trainer on a Llama directory. The job's checkpoint settings reach the
trainer through the training worker's desired state; after each update the Celery task records the checkpoints
the trainer wrote (retention keeps two) and logs the trained steps to TensorBoard equal to the API's series;
at stop the trainer writes one more, of its last update, whose weights are exactly the version it published.
A second job starts from that checkpoint (`init_from`): its trainer's first weights are the checkpoint's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.agents.test_agents_via_control_plane import start_agent
from tests.integration.agents.test_control_plane_link import wait_for
from tests.support.hf_models import model_dir
from tests.support.processes import stop_processes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.long]


def test_a_live_job_writes_checkpoints_and_logs_its_steps(control_plane_server, celery_worker_process, tmp_path):
    import torch
    from safetensors.torch import load as st_load
    from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
        EventAccumulator,
    )

    from agents import models
    from agents.trainer.export import read_weights
    from agents.weights import WeightStore
    from controlplane.models import Checkpoint, Job
    from controlplane.selectors.jobs import job_series
    from controlplane.services import checkpoints, tracking
    from controlplane.services.jobs import create_job, stop_job

    path = str(model_dir(tmp_path / "models", "llama"))
    cp = control_plane_server
    agents = [
        start_agent(cp, "train-ck", "training", 1, "torch", tmp_path),
        start_agent(cp, "roll-ck", "reserved", 2, "torch", tmp_path),
    ]
    spec = {
        "model": path,
        "engine": "torch",
        "hardware": "cpu",
        "environment": "calculator",
        "batch_size": 8,
        "group_size": 4,
        "rollout_gpus": 2,
        "training_gpus": 1,
        "checkpoint_every": 2,
        "checkpoint_keep": 2,
        "checkpoint_dir": str(tmp_path / "ck"),
    }
    try:
        for name in ("train-ck", "roll-ck"):
            wait_for(lambda n=name: _heartbeat(n) or None, what=name)
        job = create_job(
            spec={"name": "ck-live", **spec, "tracking": {"tensorboard": str(tmp_path / "tb")}}, actor="test"
        )
        wait_for(lambda: Job.objects.get(pk=job.pk).weight_version >= 3, timeout=240, what="three GRPO updates")
        # recorded by the Celery task after the updates (v2, ...), not by a listing
        wait_for(lambda: Checkpoint.objects.filter(job=job).exists() or None, timeout=60, what="a checkpoint")
        stop_job(job_id=job.pk, actor="test")
        # the trainer, stopped, writes the checkpoint of its last update (unless that one was written already)
        wait_for(lambda: _at_stop(tmp_path), timeout=60, what="the checkpoint at stop")
        # a second job starts from that checkpoint: its trainer publishes those weights as its version 0 (what its
        # rollout workers pull first)
        start = checkpoints.scan(str(tmp_path / "ck"))
        second = create_job(
            spec={"name": "ck-next", **spec, "checkpoint_dir": str(tmp_path / "ck2"), "init_from": {"job": "ck-live"}},
            actor="test",
        )
        assert second.init_from == str(start[max(start)][0])
        wait_for(lambda: Job.objects.get(pk=second.pk).weight_version >= 1, timeout=240, what="ck-next's update")
        v0 = WeightStore(_store_dir(tmp_path, "ck-next"))
        first = st_load(v0.read(0)) if 0 in v0.versions() else None
    finally:
        stop_processes(agents, grace_s=60)

    found = checkpoints.sync(job.pk)
    assert len(found) == 2 and found[0].step < found[1].step  # retention kept the newest two
    last = found[-1]
    # the checkpoint at stop holds the trainer's last published version, bit for bit
    store = WeightStore(_store_dir(tmp_path))
    assert last.weight_version == store.latest()
    published = st_load(store.read(last.weight_version))
    exported = read_weights(last.path)
    for name, t in published.items():
        if name in exported:
            assert torch.equal(exported[name], t), name
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(last.path, dtype=torch.float32).eval()
    reference = models.load_model(path)
    models.load_wire_state(reference, published)
    prompt = torch.tensor([[3, 17, 42, 99, 7]])
    with torch.no_grad():
        assert torch.allclose(loaded(prompt).logits, reference(prompt).logits, atol=1e-6, rtol=0)

    # every trained step in TensorBoard, equal to the API's series
    tracking.sync(job.pk)
    ea = EventAccumulator(str(tmp_path / "tb" / "ck-live"), size_guidance={"scalars": 0})
    ea.Reload()
    series = {s["step"]: s for s in tracking.trained_steps(job.pk)}
    got = {e.step: e.value for e in ea.Scalars("reward_mean")}
    assert got.keys() == series.keys() and len(got) >= 2  # the steps whose TRAIN record came before the stop
    assert all(abs(got[s] - series[s]["reward_mean"]) <= 1e-6 for s in got)
    assert len(job_series(job.pk)["train"]) >= len(got)

    assert second.init_from == last.path
    assert first is not None, "ck-next's v0 was pruned before it was read"
    assert first.keys() <= exported.keys() and all(torch.equal(first[k], exported[k]) for k in first)


def _heartbeat(name: str) -> bool:
    from controlplane.models import Node

    return Node.objects.filter(name=name, last_heartbeat__isnull=False).exists()


def _store_dir(root: Path, job: str = "ck-live") -> Path:
    """The job's trainer's weight store, under its node agent's state directory."""
    return next(p for p in Path(root).rglob(f"jobs/{job}/worker-*/weights") if p.is_dir())


def _at_stop(root: Path) -> bool | None:
    """The newest checkpoint holds the latest version the trainer published (None: not yet)."""
    from agents.weights import WeightStore
    from controlplane.services.checkpoints import scan

    found = scan(str(Path(root) / "ck"))
    if not found:
        return None
    newest = found[max(found)][1]
    return newest.weight_version == WeightStore(_store_dir(root)).latest() or None
