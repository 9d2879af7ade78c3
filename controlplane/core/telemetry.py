"""The one telemetry record that engines, the rollout driver and the simulator all emit.

The Runtime Tracker (`tracker.py`) refits the predictor's workload and engine coefficients from
these records: S (turns), ΔL (new prompt tokens per turn), r (generated tokens per turn), T_env,
f (active-decode fraction, θ = (1−f)/f), decode iteration time vs running batch (A, b),
prefill time vs tokens (t_prefill) and, from prefill next to running decodes against prefill alone,
the PD interference. Every record is a flat JSON object so it can cross the agent
link unchanged; `to_json`/`from_json` are the only (de)serialisers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from enum import StrEnum
from typing import Any


class RecordKind(StrEnum):
    TURN = "turn"  # one trajectory turn (driver / simulator)
    STEP = "step"  # one finished rollout step (driver / simulator)
    DECODE_ITERATION = "decode_iteration"  # one engine decode iteration (engines / simulator)
    PREFILL = "prefill"  # one prefill pass (engines / simulator)
    KV_TRANSFER = "kv_transfer"  # one prefill->decode KV hand-off
    TOGGLE = "toggle"  # one borrow (activation) + return (deactivation) of an overlap worker
    TRAIN = "train"  # one training step: Training Begin -> return -> update -> weights published


@dataclass(slots=True)
class TelemetryRecord:
    """A single observation. Fields that do not apply to a kind stay at their zero default."""

    kind: RecordKind
    time_s: float = 0.0  # when it was observed (wall or virtual clock of the emitter)
    job: str = ""
    step: int = 0
    worker: int | None = None  # stable worker slot id, when a worker emitted it
    # the emitting worker's chip type (engine records on a mixed pool): the tracker corrects each type's costs from
    # its own records, also when the worker is no longer in the pool the policy last saw (records arrive batched)
    hardware: str = ""
    # TURN
    trajectory: str = ""
    turn: int = 0
    new_prompt_tokens: int = 0  # ΔL contribution of this turn
    generated_tokens: int = 0  # r contribution of this turn
    env_time_s: float = 0.0  # environment (tool) latency after this turn
    # STEP
    batch_size: int = 0  # B
    turns_max: int = 0  # S: turns of the slowest trajectory
    turns_mean: float = 0.0
    new_prompt_tokens_mean: float = 0.0  # ΔL
    generated_tokens_mean: float = 0.0  # r
    env_time_total_s: float = 0.0  # T_env along the slowest trajectory
    active_decode_fraction: float = 0.0  # f, time-averaged over live trajectories
    makespan_s: float = 0.0  # observed rollout makespan of the step
    predicted_makespan_s: float = 0.0  # what the predictor said for the configuration used
    mode: str = ""
    n_prefill: int = 0
    n_decode: int = 0
    n_colocated: int = 0
    predicted_at_start_s: float = 0.0  # the step-start forecast (constant-resource makespan)
    generated_tokens_total: int = 0  # tokens generated into the step's samples
    train_tokens: int = 0  # tokens the trainer consumes (prompts + responses of the batch)
    reward_mean: float = 0.0
    reward_std: float = 0.0  # the spread of the trained trajectories' rewards (population standard deviation)
    borrowed_gpu_s: float = 0.0  # overlap (training-GPU) GPU-seconds serving this step's rollout
    stale_aborted: int = 0  # trajectories aborted by the staleness bound
    interruptions: int = 0  # requests interrupted (preemption, drain, return) and resumed elsewhere
    given_up: int = 0  # group members whose failure was final (agent_max_attempts): out of the batch
    dropped_groups: int = 0  # groups that lost members and kept fewer than 2: not trained
    # TRAIN (also uses step, duration_s)
    return_latency_s: float = 0.0  # Training Begin -> every borrowed worker confirmed returned
    return_deadline_s: float = 0.0
    loss: float = 0.0
    weight_version: int = 0  # published by this training step
    trajectories: int = 0  # the step's batch, as the loop counted it
    missing_trajectories: int = 0  # of those, the ones the trainer had no samples of (lost)
    # DECODE_ITERATION / PREFILL
    running_batch: int = 0  # sequences in the decode iteration; PREFILL: decodes riding in the same pass (0: alone)
    tokens: int = 0  # prefill tokens in the pass
    prefix_tokens: int = 0  # PREFILL: cached prefix the new tokens attend over
    duration_s: float = 0.0  # iteration, pass, transfer or toggle time; TURN: generation and environment
    # KV_TRANSFER
    kv_bytes: int = 0
    # TOGGLE
    activation_s: float = 0.0
    return_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Only non-default fields, so the record stays small on the wire (a driver makes one per turn:
        the fields and their defaults are looked up once, in `_DEFAULTS`)."""
        out: dict[str, Any] = {"kind": str(self.kind)}
        for name, default in _DEFAULTS:
            value = getattr(self, name)
            if value != default:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TelemetryRecord:
        """Strict: unknown keys or wrong types raise ValueError (the record crosses trust boundaries)."""
        if not isinstance(data, dict):
            raise ValueError("telemetry record must be a JSON object")
        known = {f.name: f for f in fields(cls)}
        unknown = set(data) - set(known)
        if unknown:
            raise ValueError(f"unknown telemetry fields: {sorted(unknown)}")
        try:
            kind = RecordKind(str(data.get("kind")))
        except ValueError as exc:
            raise ValueError(f"unknown telemetry kind: {data.get('kind')!r}") from exc
        kwargs: dict[str, Any] = {"kind": kind}
        for name, value in data.items():
            if name == "kind":
                continue
            default = known[name].default
            if name == "worker":
                if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                    raise ValueError("telemetry field 'worker' must be an integer or null")
            elif isinstance(default, bool) or isinstance(value, bool):
                raise ValueError(f"telemetry field {name!r} has the wrong type")
            elif isinstance(default, int) and not isinstance(value, int):
                raise ValueError(f"telemetry field {name!r} must be an integer")
            elif isinstance(default, float) and not isinstance(value, (int, float)):
                raise ValueError(f"telemetry field {name!r} must be a number")
            elif isinstance(default, str) and not isinstance(value, str):
                raise ValueError(f"telemetry field {name!r} must be a string")
            kwargs[name] = float(value) if isinstance(default, float) else value
        return cls(**kwargs)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


_DEFAULTS = tuple((f.name, f.default) for f in fields(TelemetryRecord) if f.name != "kind")


def turn(**kw: Any) -> TelemetryRecord:
    return TelemetryRecord(RecordKind.TURN, **kw)


def step(**kw: Any) -> TelemetryRecord:
    return TelemetryRecord(RecordKind.STEP, **kw)


def decode_iteration(**kw: Any) -> TelemetryRecord:
    return TelemetryRecord(RecordKind.DECODE_ITERATION, **kw)


def prefill(**kw: Any) -> TelemetryRecord:
    return TelemetryRecord(RecordKind.PREFILL, **kw)


def kv_transfer(**kw: Any) -> TelemetryRecord:
    return TelemetryRecord(RecordKind.KV_TRANSFER, **kw)


def toggle(**kw: Any) -> TelemetryRecord:
    return TelemetryRecord(RecordKind.TOGGLE, **kw)


def train(**kw: Any) -> TelemetryRecord:
    return TelemetryRecord(RecordKind.TRAIN, **kw)


__all__ = [
    "RecordKind",
    "TelemetryRecord",
    "decode_iteration",
    "kv_transfer",
    "prefill",
    "step",
    "toggle",
    "train",
    "turn",
]
