"""The invariants of the unified GPU–worker–role map (docs/design.md §3), as one pure function.

Services check them on every write (inside the transaction, before commit) and the fuzz test checks
them after every random service call, so the same code defines "a valid cluster" everywhere.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controlplane.core.state import Activity, Role, Zone


@dataclass(frozen=True, slots=True)
class WorkerView:
    worker_id: int
    job: int
    slot: int
    role: Role
    activity: Activity
    zone: Zone
    gpus: tuple[int, ...]


def check_invariants(workers: Iterable[WorkerView], training_active: Mapping[int, bool]) -> list[str]:
    """Return every violated invariant as a sentence (empty list = valid).

    `workers` are the alive workers; `training_active` maps job id -> whether its trainer computes.
    """
    problems: list[str] = []
    active_on_gpu: dict[int, list[WorkerView]] = defaultdict(list)
    alive_rollout_on_gpu: dict[int, list[WorkerView]] = defaultdict(list)
    alive_training_on_gpu: dict[int, list[WorkerView]] = defaultdict(list)
    active_roles: dict[int, list[Role]] = defaultdict(list)
    for w in workers:
        if not w.gpus:
            problems.append(f"worker {w.slot} of job {w.job} has no GPUs")
        if len(set(w.gpus)) != len(w.gpus):
            problems.append(f"worker {w.slot} of job {w.job} lists a GPU twice")
        if w.role is Role.TRAINING and w.zone is not Zone.OVERLAP:
            problems.append(f"training worker {w.slot} of job {w.job} must live in the overlap zone")
        for g in w.gpus:
            if w.activity is Activity.ACTIVE:
                active_on_gpu[g].append(w)
            (alive_training_on_gpu if w.role is Role.TRAINING else alive_rollout_on_gpu)[g].append(w)
        if w.activity is Activity.ACTIVE and w.role is not Role.TRAINING:
            active_roles[w.job].append(w.role)
            if w.zone is Zone.OVERLAP and training_active.get(w.job, False):
                problems.append(
                    f"overlap rollout worker {w.slot} of job {w.job} is active while its trainer is computing"
                )
    for g, ws in active_on_gpu.items():
        if len(ws) > 1:
            problems.append(f"GPU {g} has {len(ws)} active workers (at most one may be active)")
    for g, ws in alive_rollout_on_gpu.items():
        if len(ws) > 1:
            problems.append(f"GPU {g} belongs to {len(ws)} rollout workers")
    for g, ws in alive_training_on_gpu.items():
        if len(ws) > 1:
            problems.append(f"GPU {g} belongs to {len(ws)} training workers")
    for job, roles in active_roles.items():
        kinds = set(roles)
        if Role.COLOCATED in kinds and kinds - {Role.COLOCATED}:
            problems.append(f"job {job} mixes colocated and disaggregated active workers")
        elif kinds & {Role.PREFILL, Role.DECODE} and not {Role.PREFILL, Role.DECODE} <= kinds:
            problems.append(f"job {job} is disaggregated without both a prefill and a decode worker")
    return problems
