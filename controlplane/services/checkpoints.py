"""A job's exported checkpoints (issue 36): the settings checked at submission, and the records of what the
trainer wrote.

The trainer writes each checkpoint as a complete `step_N/` directory (core.checkpoints) under the job's
checkpoint directory, a path its training node writes and this process reads (the same machine, or shared
storage). The control plane learns of them by reading that directory (`sync`): after each trained step (the
telemetry intake queues it) and whenever they are listed, so the one written at stop, after the trainer's job
ended, is found too, and one that retention removed is dropped from the list. A directory read this way
holds the files the API serves; nothing in it is loaded here (manifests are JSON, weights are only streamed).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction

from controlplane.core import checkpoints as ck
from controlplane.core.model_dir import is_model_dir_spec
from controlplane.models import Checkpoint, Job
from controlplane.services.errors import InvalidInput, NotFound
from controlplane.services.events import emit


def default_dir(job_name: str) -> str:
    """Where a job's checkpoints go when its spec names no `checkpoint_dir`: under the control plane's var dir."""
    return str(Path(settings.VAR_DIR).resolve() / "checkpoints" / job_name)


def check_settings(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with `checkpoint_every`, `checkpoint_keep`, `checkpoint_dir` and `init_from` checked and
    resolved (a 400 naming the field otherwise); `init_from` becomes the directory the policy starts from."""
    try:
        every, keep = ck.validate_settings(spec.get("checkpoint_every"), spec.get("checkpoint_keep"))
        init = ck.parse_init_from(spec.get("init_from"))
    except ck.CheckpointSpecError as exc:
        raise InvalidInput(str(exc), field=exc.field) from None
    where = spec.get("checkpoint_dir") or default_dir(str(spec["name"]))
    if not isinstance(where, str) or not where.startswith("/") or "\x00" in where:
        raise InvalidInput("checkpoint_dir must be an absolute directory path", field="checkpoint_dir")
    other = Job.objects.filter(checkpoint_dir=where).values_list("name", flat=True).first()
    if other is not None and other != spec.get("name"):  # its retention would remove the other job's checkpoints
        raise InvalidInput(f"checkpoint_dir {where!r} holds job {other!r}'s checkpoints", field="checkpoint_dir")
    return {
        **spec,
        "checkpoint_every": every,
        "checkpoint_keep": keep,
        "checkpoint_dir": where,
        "init_from": _init_dir(init, str(spec.get("model", "tiny"))) if init else "",
    }


def _init_dir(init: ck.InitFrom, model: str) -> str:
    """The checkpoint directory `init_from` names, checked: it exists, is complete, and holds the architecture
    of the new job's model (its manifest's model, or a plain directory's config.json against the model's)."""
    if init.path:
        path = Path(init.path)
        if not (path / "config.json").is_file() or not any(path.glob("*.safetensors")):
            raise InvalidInput(
                f"init_from: {init.path!r} is not a checkpoint directory (config.json and *.safetensors)",
                field="init_from",
            )
        manifest = _manifest(path)
        if manifest is not None and manifest.model != model:
            raise InvalidInput(
                f"init_from: {init.path!r} is a checkpoint of model {manifest.model!r}, not {model!r}",
                field="init_from",
            )
        if manifest is None and is_model_dir_spec(model) and _arch(path) != _arch(Path(model)):
            raise InvalidInput(
                f"init_from: {init.path!r} does not hold the architecture of {model!r} (config.json differs)",
                field="init_from",
            )
        return str(path)
    source = Job.objects.filter(name=init.job).first()
    if source is None:
        raise InvalidInput(f"init_from.job: no job named {init.job!r}", field="init_from.job")
    found = sync(source.pk)
    if not found:
        raise InvalidInput(f"init_from.job: job {init.job!r} has no checkpoint", field="init_from.job")
    pick = found[-1] if init.step is None else next((c for c in found if c.step == init.step), None)
    if pick is None:
        steps = ", ".join(str(c.step) for c in found)
        raise InvalidInput(
            f"init_from.step: job {init.job!r} has no checkpoint at step {init.step} (it has {steps})",
            field="init_from.step",
        )
    if source.model != model:
        raise InvalidInput(
            f"init_from: job {init.job!r} trained model {source.model!r}, not {model!r}", field="init_from.job"
        )
    return pick.path


_ARCH_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")


def _arch(path: Path) -> tuple[Any, ...]:
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return ()
    return tuple(cfg.get(k) for k in (*_ARCH_KEYS, "vocab_size"))


def _manifest(path: Path) -> ck.Manifest | None:
    try:
        return ck.Manifest.from_json(json.loads((path / ck.MANIFEST).read_text()))
    except (OSError, ValueError):
        return None


def scan(directory: str) -> dict[int, tuple[Path, ck.Manifest]]:
    """The complete checkpoints under a job's checkpoint directory, by step (temporary directories and anything
    without a valid manifest are not checkpoints)."""
    root = Path(directory)
    out: dict[int, tuple[Path, ck.Manifest]] = {}
    try:
        entries = list(os.scandir(root))
    except OSError:
        return out
    for e in entries:
        step = ck.step_of(e.name)
        if step is None or not e.is_dir(follow_symlinks=False):
            continue
        m = _manifest(Path(e.path))
        if m is not None and m.step == step:
            out[step] = (Path(e.path), m)
    return out


def sync(job_id: int) -> list[Checkpoint]:
    """Record the checkpoints the job's directory holds now (a `checkpoint.written` event for each new one) and
    forget those retention removed; the job's checkpoints, oldest first."""
    job = Job.objects.get(pk=job_id)
    found = {s: f for s, f in (scan(job.checkpoint_dir) if job.checkpoint_dir else {}).items() if f[1].job == job.name}
    with transaction.atomic():
        have = {c.step: c for c in Checkpoint.objects.select_for_update().filter(job=job)}
        gone = [s for s in have if s not in found]
        if gone:
            Checkpoint.objects.filter(job=job, step__in=gone).delete()
        for step, (path, m) in sorted(found.items()):
            if step in have:
                continue
            have[step] = Checkpoint.objects.create(
                job=job,
                step=step,
                weight_version=m.weight_version,
                written=datetime.fromtimestamp(m.time_s, tz=UTC),
                size_bytes=m.size_bytes,
                path=str(path),
                files=m.files,
                tokenizer=m.tokenizer,
            )
            emit(
                kind="checkpoint.written",
                message=f"checkpoint of step {step} (weights v{m.weight_version}, {m.size_bytes / 1e6:.1f} MB) "
                f"at {path}",
                job=job,
                data={"step": step, "weight_version": m.weight_version, "path": str(path), "bytes": m.size_bytes},
            )
        return [have[s] for s in sorted(have) if s not in gone]


def find(job_id: int, step: int | None) -> Checkpoint:
    """The job's checkpoint of `step` (None: the newest) as its directory holds it now; 404 naming what exists."""
    if not Job.objects.filter(pk=job_id).exists():
        raise NotFound(f"job {job_id} does not exist", field="id")
    found = sync(job_id)
    if not found:
        raise NotFound(f"job {job_id} has no checkpoint yet", field="step")
    pick = found[-1] if step is None else next((c for c in found if c.step == step), None)
    if pick is None:
        raise NotFound(
            f"job {job_id} has no checkpoint at step {step} (steps: {', '.join(str(c.step) for c in found)})",
            field="step",
        )
    return pick
