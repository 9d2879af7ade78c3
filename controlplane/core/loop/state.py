"""The loop's records (a trajectory's accounting, a step's) and their checkpoint codec.

`encode` and `decode_into` are the JSON form of what a loop must not lose across a driver restart
(`RolloutLoop.checkpoint` / `RolloutLoop.restore`): the step, the weight version, the trainer's place
in the handshake and every live trajectory's accounting. A loop that is checkpointed keeps a
`CheckpointCache`: a trajectory's JSON is rebuilt only when an event touched it since the last
checkpoint, and a trained step's only once, so a checkpoint's Python work follows what changed, not
B·G (its JSON text is still the whole state: the control plane keeps the last one whole).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from controlplane.core.state import Configuration, Mode

# why a trajectory left unfinished by a driver that died is restarted on its task (its replacement is a rerun)
DRIVER_RESTARTED = "the rollout driver restarted"


class TrajState(StrEnum):
    WAITING = "waiting"  # queued for a worker
    FIRST = "first"  # on a colocated or prefill worker
    DECODE = "decode"  # on a decode worker (after the KV hand-off)
    ENV = "env"  # the environment is running its tool call
    DONE = "done"
    ABORTED = "aborted"


class TrainerPhase(StrEnum):
    """Where the job's trainer is in the loop's update cycle (a phase, not the trainer process)."""

    IDLE = "idle"
    RETURNING = "returning"  # Training Begin sent, waiting for ReturnConfirmed
    TRAINING = "training"
    PUBLISHING = "publishing"


@dataclass(slots=True)
class Traj:
    """One trajectory's progress and accounting (partial progress survives interruptions)."""

    tid: str
    step: int
    group: int
    index: int
    version: int  # weights version when it started
    min_version: int  # oldest weights that generated any of it
    start_s: float = 0.0
    state: TrajState = TrajState.WAITING
    worker: int | None = None
    turn: int = 0
    turn_start_s: float = 0.0
    gen_in_turn: int = 0
    pre_in_turn: int = 0
    generated: int = 0  # tokens generated into the sample
    prompt: int = 0  # prompt tokens appended (first prompt + observations)
    prefilled: int = 0  # prompt tokens engines prefilled (cache misses)
    gen_time_s: float = 0.0  # being served (queue + prefill + decode)
    env_time_s: float = 0.0
    decode_time_s: float = 0.0  # decoding only (no queueing, no prefill): the numerator of f
    decode_in_turn_s: float = 0.0
    decode_since_s: float = -1.0  # when the KV hand-off put the turn on a decode worker
    end_s: float = 0.0
    reward: float = 0.0
    interruptions: int = 0


@dataclass(slots=True)
class StepState:
    step: int
    start_s: float
    version: int  # weights version when the step started
    trajectories: list[str]
    remaining: int
    end_s: float = 0.0
    predicted_makespan_s: float = 0.0
    predicted_at_start_s: float = 0.0
    configuration: str = ""
    generated_tokens: int = 0  # every token generated for this step's trajectories (incl. aborted ones)
    borrowed_gpu_s: float = 0.0
    stale_aborted: int = 0
    interruptions: int = 0
    given_up: int = 0  # members whose failure was final: out of the batch (each leaves its slot empty)
    dropped_groups: int = 0  # groups that lost members and kept fewer than 2: not trained
    dropped: list[str] = field(default_factory=list)  # the finished trajectories of those groups


# ==================================================================================== checkpoint codec
_TRAJ_FIELDS = tuple(f.name for f in fields(Traj))
_STEP_FIELDS = tuple(f.name for f in fields(StepState))


def traj_json(t: Traj) -> dict[str, Any]:
    """A trajectory's checkpoint record (`asdict` without its deep copies: every field is a scalar)."""
    out = {name: getattr(t, name) for name in _TRAJ_FIELDS}
    out["state"] = str(t.state)
    return out


def step_json(s: StepState) -> dict[str, Any]:
    out = {name: getattr(s, name) for name in _STEP_FIELDS}
    out["trajectories"] = list(s.trajectories)
    out["dropped"] = list(s.dropped)
    return out


class CheckpointCache:
    """The JSON of the trajectories and trained steps as of the last checkpoint, and which trajectories
    events touched since (the loop marks them): `encode` rebuilds only those. Cached records are
    replaced, never mutated, so a checkpoint handed out earlier stays what it was."""

    __slots__ = ("dirty", "steps", "trajs")

    def __init__(self) -> None:
        self.trajs: dict[str, dict[str, Any]] = {}  # in the loop's order (new trajectories are marked as made)
        self.dirty: dict[str, None] = {}  # an ordered set: touched since the last checkpoint
        self.steps: dict[int, dict[str, Any]] = {}  # trained steps before the current one: final

    def trajectories(self, trajs: dict[str, Traj]) -> list[dict[str, Any]]:
        cache = self.trajs
        for tid in self.dirty:
            t = trajs.get(tid)
            if t is None:
                cache.pop(tid, None)
            else:
                cache[tid] = traj_json(t)
        self.dirty.clear()
        if len(cache) != len(trajs):  # something unmarked (a restored loop's first checkpoint): all again
            self.trajs = cache = {tid: traj_json(t) for tid, t in trajs.items()}
        return list(cache.values())

    def step_records(self, loop: Any) -> list[dict[str, Any]]:
        out = []
        final = min(loop.trained_next, loop.step)  # trained, and not the step borrowed GPU time is added to
        for j, s in loop.steps.items():
            if j < final:
                rec = self.steps.get(j)
                if rec is None:
                    rec = self.steps[j] = step_json(s)
                out.append(rec)
            else:
                out.append(step_json(s))
        return out


def encode(loop: Any, *, cached: bool = True) -> dict[str, Any]:  # a RolloutLoop (machine imports this module)
    """What the loop must not lose, as JSON: the step, the weight version, the trainer's place in
    the handshake and every live trajectory's accounting (turn boundaries and kept tokens). `cached`:
    through the loop's `CheckpointCache` (made on the first checkpoint); else every record anew."""
    if cached:
        if loop._checkpoint_cache is None:
            loop._checkpoint_cache = CheckpointCache()
        cache = loop._checkpoint_cache
        steps, trajectories = cache.step_records(loop), cache.trajectories(loop.trajs)
    else:
        steps = [step_json(s) for s in loop.steps.values()]
        trajectories = [traj_json(t) for t in loop.trajs.values()]
    return {
        "version": loop.version,
        "step": loop.step,
        "rollout_active": loop.rollout_active,
        "trained_next": loop.trained_next,
        "skipped": list(loop.skipped),
        "ready": list(loop.ready),
        "trainer": str(loop.trainer),
        "training_active": loop.training_active,
        "tb_s": loop.tb_s,
        "train_start_s": loop.train_start_s,
        "return_latency_s": loop.return_latency_s,
        "loss": loop.loss,
        "missing": loop.missing,
        "deadline_misses": loop.deadline_misses,
        "stale_aborted": loop.stale_aborted,
        "prompts_drawn": loop.prompts_drawn,
        "started_trajectories": loop.started_trajectories,
        "finished_trajectories": loop.finished_trajectories,
        "failed_trajectories": loop.failed_trajectories,
        "replacements": {str(k): v for k, v in loop._replacements.items()},
        "steps": steps,
        "trajectories": trajectories,
        "configuration": loop.configuration.label() if loop.configuration else "",
    }


def decode_into(loop: Any, data: dict[str, Any]) -> None:  # a fresh RolloutLoop
    """Load `encode`'s JSON into a fresh loop (it is marked resumed: unfinished trajectories restart on Start)."""
    loop.version, loop.step = int(data["version"]), int(data["step"])
    loop.rollout_active = bool(data["rollout_active"])
    loop.trained_next = int(data["trained_next"])
    loop.skipped = [int(v) for v in data.get("skipped", [])]  # (older checkpoints: none)
    loop.ready = deque(int(x) for x in data["ready"])
    loop.trainer = TrainerPhase(data["trainer"])
    loop.training_active = bool(data["training_active"])
    loop.tb_s, loop.train_start_s = float(data["tb_s"]), float(data["train_start_s"])
    loop.return_latency_s = float(data["return_latency_s"])
    loop.deadline_misses, loop.stale_aborted = int(data["deadline_misses"]), int(data["stale_aborted"])
    groups = prompts_per_step(loop.cfg.batch_size, loop.cfg.group_size)
    # the task cursor: a step draws its batch's prompts (one per group) as it starts, ordinals step·groups + g;
    # a checkpoint whose cursor is not where its step says is refused (a prompt would be skipped or drawn twice)
    loop.prompts_drawn = int(data.get("prompts_drawn", (loop.step + 1) * groups))  # (older checkpoints: derived)
    if loop.prompts_drawn != (loop.step + 1) * groups:
        raise ValueError(f"prompts_drawn {loop.prompts_drawn} is not where step {loop.step} leaves the task cursor")
    loop.started_trajectories = int(data["started_trajectories"])
    loop.finished_trajectories = int(data["finished_trajectories"])
    loop.failed_trajectories = int(data.get("failed_trajectories", 0))
    loop._replacements = {int(k): int(v) for k, v in data.get("replacements", {}).items()}
    for s in data["steps"]:
        loop.steps[int(s["step"])] = StepState(**s)
    for t in data["trajectories"]:
        tr = Traj(**{**t, "state": TrajState(t["state"])})
        loop.trajs[tr.tid] = tr
    loop.loss = float(data.get("loss", 0.0))
    loop.missing = int(data.get("missing", 0))
    loop.resumed = True
    label = data.get("configuration") or ""
    loop.configuration = _parse_label(label)


def prompts_per_step(batch_size: int, group_size: int) -> int:
    """The prompts (tasks) a step draws: one per GRPO group of its batch."""
    return -(-batch_size // group_size)


def _parse_label(label: str) -> Configuration | None:
    """'3P5D' or '8C' back to a Configuration."""
    if not label:
        return None
    if label.endswith("C"):
        return Configuration.colocated(int(label[:-1]))
    p, d = label[:-1].split("P")
    return Configuration(Mode.DISAGGREGATED, n_prefill=int(p), n_decode=int(d))
