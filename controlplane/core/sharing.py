"""How several RL jobs share one cluster, as the simulator compares them (issue 35): `pearl` is the cluster
arbiter (`core.arbiter.arbitrate`); the baselines, pure like it, are `split_static` (a fixed equal split),
`split_fcfs` (first come takes free units and keeps them: the behaviour before the arbiter) and `split_rlix`
(units in proportion to outstanding demand, RLix's gap ratio, no cross-job borrowing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

from controlplane.core.arbiter import JobDemand


class Sharing(StrEnum):
    """How several jobs share the cluster (the simulator's multi-job policies)."""

    STATIC = "static"  # each job a fixed equal-weight split of the pool
    FCFS = "fcfs"  # first come takes free units and keeps them (before the arbiter)
    RLIX = "rlix"  # rollout units split by outstanding demand, no cross-job borrowing
    PEARL = "pearl"  # the arbiter (`arbitrate`) + each job's PEARL inside its allotment


SHARING_NAMES: tuple[str, ...] = tuple(s.value for s in Sharing)


def split_static(capacity: int, all_jobs: Sequence[str], running: Sequence[JobDemand]) -> dict[str, int]:
    """A fixed equal split of the pool over every job of the cluster, present or not (a job's share sits idle
    while it is absent), each capped at its maximum."""
    n = len(all_jobs)
    out: dict[str, int] = {}
    for j in running:
        i = list(all_jobs).index(j.name)
        share = capacity // n + (1 if i < capacity % n else 0)
        out[j.name] = min(share, j.max_units)
    return out


def split_fcfs(capacity: int, running: Sequence[JobDemand], previous: Mapping[str, int]) -> dict[str, int]:
    """First come, first served: each job keeps what it holds; free units go to the earliest arrival that
    wants more (up to its maximum); a shrinking pool takes from the latest arrivals first."""
    order = sorted(running, key=lambda j: (j.arrival_s, j.name))
    alloc = {j.name: min(previous.get(j.name, 0), j.max_units) for j in order}
    excess = sum(alloc.values()) - capacity
    for j in reversed(order):
        if excess <= 0:
            break
        take = min(excess, alloc[j.name])
        alloc[j.name] -= take
        excess -= take
    free = capacity - sum(alloc.values())
    for j in order:
        give = min(free, j.max_units - alloc[j.name])
        alloc[j.name] += give
        free -= give
    return alloc


def split_rlix(
    capacity: int, running: Sequence[JobDemand], previous: Mapping[str, int] | None = None, rebalance: float = 0.10
) -> dict[str, int]:
    """RLix's gap ratio: units in proportion to outstanding demand (unfinished trajectories × tp), every job
    with demand keeps at least one unit, each capped at its maximum; no cross-job borrowing. Like RLix's
    poll, the previous split stays while every job's demand share and unit share differ by <= `rebalance`."""
    wanting = [j for j in running if j.max_units > 0]
    alloc = {j.name: 0 for j in running}
    if not wanting or capacity <= 0:
        return alloc
    demand = sum(max(1, j.outstanding) for j in wanting)
    if previous is not None and set(previous) >= set(alloc) and sum(previous.get(n, 0) for n in alloc) == capacity:
        gap = max(abs(max(1, j.outstanding) / demand - previous.get(j.name, 0) / capacity) for j in wanting)
        if gap <= rebalance and all(previous.get(j.name, 0) <= j.max_units for j in wanting):
            return {n: previous.get(n, 0) for n in alloc}
    for j in sorted(wanting, key=lambda j: (-j.outstanding, j.arrival_s))[:capacity]:
        alloc[j.name] = 1
    left = capacity - sum(alloc.values())
    while left > 0:
        open_ = [j for j in wanting if alloc[j.name] < j.max_units]
        if not open_:
            break
        # the largest gap: demand share minus unit share
        g = max(open_, key=lambda j: (max(1, j.outstanding) / demand - alloc[j.name] / capacity, -j.arrival_s))
        alloc[g.name] += 1
        left -= 1
    return alloc


__all__ = ["SHARING_NAMES", "Sharing", "split_fcfs", "split_rlix", "split_static"]
