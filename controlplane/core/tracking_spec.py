"""A job's `tracking:` (issue 36): which experiment trackers its per-step series goes to, checked at submission.

    tracking:
      tensorboard: /abs/logdir          # event files under <logdir>/<job name>
      mlflow: file:/abs/mlruns          # a tracking URI (a local file: store, sqlite:////abs/db, http(s)://server), or
                                        # {uri: ..., experiment: NAME} (default experiment: pearl)
      wandb: my-project                 # a project, or {project: ..., entity: ...}; WANDB_MODE=offline honoured

Any combination. Not the Runtime Tracker (`core/tracker`, which refits the predictor): these are the user's own
experiment trackers. Pure: `normalise` returns the stored form, every value a dict.
"""

from __future__ import annotations

import re
from typing import Any

BACKENDS = ("tensorboard", "mlflow", "wandb")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,127}$")
_URI = re.compile(r"^(file:/|sqlite:////|https?://)\S{1,1000}$")


class TrackingSpecError(ValueError):
    """A bad `tracking` entry; `field` names it (tracking.mlflow.uri, ...)."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def _keys(value: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    unknown = set(value) - set(allowed)
    if unknown:
        raise TrackingSpecError(f"{where}: unknown key {sorted(unknown)[0]!r} ({', '.join(allowed)})", where)


def _text(value: Any, where: str, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise TrackingSpecError(f"{where} must be {what}", where)
    return value


def normalise(spec: Any) -> dict[str, dict[str, str]]:
    """The stored form of `tracking` ({} for none), or `TrackingSpecError` naming the bad entry."""
    if spec is None or spec == {}:
        return {}
    if not isinstance(spec, dict):
        raise TrackingSpecError(f"tracking maps a tracker ({', '.join(BACKENDS)}) to its settings", "tracking")
    _keys(spec, BACKENDS, "tracking")
    out: dict[str, dict[str, str]] = {}
    if "tensorboard" in spec:
        v = spec["tensorboard"]
        v = v if isinstance(v, dict) else {"logdir": v}
        _keys(v, ("logdir",), "tracking.tensorboard")
        logdir = v.get("logdir")
        if not isinstance(logdir, str) or not logdir.startswith("/") or len(logdir) > 1000 or "\x00" in logdir:
            raise TrackingSpecError("tracking.tensorboard must be an absolute log directory", "tracking.tensorboard")
        out["tensorboard"] = {"logdir": logdir}
    if "mlflow" in spec:
        v = spec["mlflow"]
        v = v if isinstance(v, dict) else {"uri": v}
        _keys(v, ("uri", "experiment"), "tracking.mlflow")
        uri = _text(
            v.get("uri"),
            "tracking.mlflow.uri",
            _URI,
            "a tracking URI (file:/abs/path, sqlite:////abs/db or http(s)://host)",
        )
        experiment = _text(v.get("experiment", "pearl"), "tracking.mlflow.experiment", _NAME, "an experiment name")
        out["mlflow"] = {"uri": uri, "experiment": experiment}
    if "wandb" in spec:
        v = spec["wandb"]
        v = v if isinstance(v, dict) else {"project": v}
        _keys(v, ("project", "entity"), "tracking.wandb")
        project = _text(v.get("project"), "tracking.wandb.project", _NAME, "a project name")
        entry = {"project": project}
        if v.get("entity") is not None:
            entry["entity"] = _text(v["entity"], "tracking.wandb.entity", _NAME, "an entity name")
        out["wandb"] = entry
    return out
