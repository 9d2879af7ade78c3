"""Experiment trackers (issue 36): each trained step of a job goes to the TensorBoard, MLflow and W&B runs its
`tracking:` names, with the job spec as the run's parameters.

Where: here, in the control plane, from the same read model the API's series answers (`selectors.jobs.
job_series`): a tracker's series and the job page's are one computation, equal by construction, and a tracker
that is slow, down or not installed is outside the training path altogether (a Celery task runs `sync` after
a trained step's telemetry is stored; the trainer and the rollout driver never wait on it). Each tracker keeps
a cursor (`Job.tracking_state[name].step`, the last step it took): a step is logged once, a failed tracker
retries from where it stopped at the next trained step, and a failure is reported on the job page (its state's
`error`) and as one `tracking.failed` event per new error, never raised.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from controlplane.core.tracking_spec import BACKENDS, TrackingSpecError, normalise
from controlplane.models import Job
from controlplane.selectors.jobs import job_series
from controlplane.services import dispatch
from controlplane.services.errors import InvalidInput
from controlplane.services.events import emit

# the per-step scalars every tracker gets, named as the API's series names them
SCALARS = (
    "reward_mean",
    "reward_std",
    "makespan_s",
    "predicted_makespan_s",
    "throughput_tok_s",
    "borrowed_gpu_s",
    "stale_aborted",
    "loss",
    "weight_version",
)
TEXTS = ("configuration", "why")  # the configuration label (a tag) and the decision's reason
LOCK_S = 120  # one sync per job at a time (a crashed one's lock runs out)
INSTALL = "pip install 'pearl[tracking]'"


def check_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with `tracking` in its stored form (a 400 naming the bad entry otherwise)."""
    try:
        return {**spec, "tracking": normalise(spec.get("tracking"))}
    except TrackingSpecError as exc:
        raise InvalidInput(str(exc), field=exc.field) from None


def trained_steps(job_id: int) -> list[dict[str, Any]]:
    """The job's trained steps as the trackers log them: each row of the API's series (`job_series`) whose step
    has a trainer update, with that update's loss and weight version; oldest first."""
    series = job_series(job_id)
    train = {t["step"]: t for t in series["train"]}
    return [
        {**s, "loss": train[s["step"]]["loss"], "weight_version": train[s["step"]]["weight_version"]}
        for s in series["steps"]
        if s["step"] in train
    ]


class Sink(Protocol):
    """One tracker's run of one job."""

    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None: ...

    def close(self) -> None: ...


def params_of(job: Job) -> dict[str, str]:
    """The job spec as a run's parameters (flat strings: what every tracker takes)."""
    spec = {
        f: getattr(job, f)
        for f in (
            "name",
            "model",
            "engine",
            "hardware",
            "environment",
            "policy",
            "tp",
            "batch_size",
            "group_size",
            "max_staleness",
            "max_trajectory_tokens",
            "rollout_gpus",
            "training_gpus",
            "checkpoint_every",
            "checkpoint_keep",
            "init_from",
        )
    }
    spec |= {"policy_options": job.policy_options, "hardware_types": job.hardware_types}
    return {k: v if isinstance(v, str) else json.dumps(v, sort_keys=True) for k, v in spec.items()}


_TB_WRITERS: dict[str, Any] = {}  # one event file per log directory and process, kept open between syncs


class TensorBoardSink:
    """Event files under `<logdir>/<job name>` (tensorboard's own writer and protos; no TensorFlow): one file
    per job and Celery worker process, appended to and flushed at each sync (not a file per step)."""

    def __init__(self, job: Job, conf: dict[str, str], state: dict[str, Any]) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter  # type: ignore[import-untyped]

        where = str(Path(conf["logdir"]) / job.name)
        if where not in _TB_WRITERS or not Path(where).is_dir():
            _TB_WRITERS[where] = EventFileWriter(where)
        self.writer = _TB_WRITERS[where]
        if not state.get("params"):
            self._texts(0, {"job_spec": "\n".join(f"{k}: {v}" for k, v in sorted(params_of(job).items()))})

    def _event(self, step: int, values: list[Any]) -> None:
        import time

        from tensorboard.compat.proto import event_pb2, summary_pb2  # type: ignore[import-untyped]

        self.writer.add_event(
            event_pb2.Event(wall_time=time.time(), step=step, summary=summary_pb2.Summary(value=values))
        )

    def _texts(self, step: int, texts: dict[str, str]) -> None:
        from tensorboard.compat.proto import (
            summary_pb2,
            tensor_pb2,
            tensor_shape_pb2,
            types_pb2,
        )

        meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="text"))
        values = [
            summary_pb2.Summary.Value(
                tag=k,
                metadata=meta,
                tensor=tensor_pb2.TensorProto(
                    dtype=types_pb2.DT_STRING,
                    string_val=[v.encode()],
                    tensor_shape=tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]),
                ),
            )
            for k, v in texts.items()
        ]
        self._event(step, values)

    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        from tensorboard.compat.proto import summary_pb2

        self._event(step, [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in scalars.items()])
        self._texts(step, texts)

    def close(self) -> None:
        self.writer.flush()


class MLflowSink:
    """One run per job in the configured experiment (named after the job), resumed by its id."""

    def __init__(self, job: Job, conf: dict[str, str], state: dict[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        if conf["uri"].startswith("file:"):  # the user chose a local file store (MLflow 3 asks to be told so)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=conf["uri"])
        self.state = state
        if not state.get("run_id"):
            exp = self.client.get_experiment_by_name(conf["experiment"])
            exp_id = exp.experiment_id if exp else self.client.create_experiment(conf["experiment"])
            run = self.client.create_run(exp_id, run_name=job.name, tags={"pearl.job": job.name})
            state["run_id"] = run.info.run_id
        self.run_id = str(state["run_id"])
        if not state.get("params"):
            from mlflow.entities import Param

            self.client.log_batch(self.run_id, params=[Param(k, v[:6000]) for k, v in params_of(job).items()])

    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        import time

        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id,
            metrics=[Metric(k, v, now, step) for k, v in scalars.items()],
            tags=[RunTag(k, v[:5000]) for k, v in texts.items()],  # a tag holds the latest; the text per step:
        )
        self.client.log_text(self.run_id, json.dumps({"step": step, **texts}), f"steps/step_{step:08d}.json")

    def close(self) -> None:
        return None


class WandbSink:
    """One run per job (id kept, resumed), the spec as its config; WANDB_MODE=offline writes it locally."""

    def __init__(self, job: Job, conf: dict[str, str], state: dict[str, Any]) -> None:
        import wandb

        state.setdefault("run_id", secrets.token_hex(4))
        self.run = wandb.init(
            project=conf["project"],
            entity=conf.get("entity"),
            id=str(state["run_id"]),
            name=job.name,
            resume="allow",
            config=params_of(job),
            dir=os.environ.get("WANDB_DIR") or None,
            reinit="create_new",
        )

    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        self.run.log({**scalars, **texts}, step=step)

    def close(self) -> None:
        self.run.finish()


SINKS: dict[str, Callable[[Job, dict[str, str], dict[str, Any]], Sink]] = {
    "tensorboard": TensorBoardSink,
    "mlflow": MLflowSink,
    "wandb": WandbSink,
}


def _error_text(name: str, exc: BaseException) -> str:
    if isinstance(exc, ImportError):
        return f"{name}: its client library is not installed ({INSTALL})"
    return f"{name}: {type(exc).__name__}: {exc}"[:500]


def sync(job_id: int) -> dict[str, Any]:
    """Log every trained step a tracker of the job has not taken yet; the trackers' state (per tracker: the last
    step logged, the run id, the last error). Single flight per job; never raises for a tracker's failure."""
    job = Job.objects.get(pk=job_id)
    if not job.tracking:
        return {}
    lock = dispatch.redis_client().lock(f"pearl:tracking:{job_id}", timeout=LOCK_S, blocking_timeout=LOCK_S)
    if not lock.acquire():
        return dict(job.tracking_state)
    try:
        job.refresh_from_db(fields=["tracking_state"])
        rows = trained_steps(job_id)
        state: dict[str, Any] = {k: dict(v) for k, v in (job.tracking_state or {}).items()}
        for name in BACKENDS:
            if name in job.tracking:
                state[name] = _sync_one(job, name, job.tracking[name], state.get(name) or {"step": -1}, rows)
        Job.objects.filter(pk=job_id).update(tracking_state=state)
        return state
    finally:
        lock.release()


def _sync_one(
    job: Job, name: str, conf: dict[str, str], st: dict[str, Any], rows: list[dict[str, Any]]
) -> dict[str, Any]:
    todo = [r for r in rows if r["step"] > int(st.get("step", -1))]
    if not todo and st.get("params"):
        return st
    sink: Sink | None = None
    try:
        sink = SINKS[name](job, conf, st)
        st["params"] = True
        for r in todo:
            scalars = {k: float(r.get(k) or 0.0) for k in SCALARS}
            sink.log(int(r["step"]), scalars, {k: str(r.get(k) or "") for k in TEXTS})
            st["step"] = int(r["step"])
        if st.get("error"):
            emit(kind="tracking.recovered", message=f"tracker {name} logs again (step {st['step']})", job=job)
        st["error"] = ""
    except Exception as exc:  # any failure of a user's tracker is reported, never raised: training goes on
        text = _error_text(name, exc)
        if text != st.get("error"):
            emit(
                kind="tracking.failed",
                message=f"tracker {text} (training goes on; it retries at the next trained step)",
                job=job,
                data={"tracker": name, "step": st.get("step", -1)},
            )
        st["error"] = text
    finally:
        if sink is not None:
            try:
                sink.close()
            except Exception as exc:  # a run that does not close cleanly: reported, the steps it took stand
                st["error"] = st.get("error") or _error_text(name, exc)
    return st
