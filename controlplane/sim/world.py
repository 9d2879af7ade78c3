"""The simulated world under the core loop: GPU units, their engines, KV links, environments and
the execution of transition plans in virtual time.

What is modelled (finer than the predictor's closed forms):
- every worker's continuous batching at iteration level (`core.batching.IterationScheduler`), chunked prefill
  interfering with decode when colocated, serialised KV links and decode-pool KV limits;
- prefix caches: a trajectory's next turn reuses its cached context on its home worker unless KV
  pressure evicted it (`submit_first`), or the worker's memory was re-partitioned;
- elastic GPUs: preparation in the background, then admission-paused finalisation; preemption
  takes a unit at once (its requests come back as interruptions, partial tokens kept);
- overlap (training-GPU) workers: activation when borrowed, deactivation when returned;
- transitions from core placement (`core.placement.place`): removals, drain-then-flip role
  changes, additions, each with Table 3 costs.

The world never decides: routing, the RL loop, signals and training live in `core.loop`; the world
only reports what happened (`sim.feed(event)`).

By idea: `sim.units` (the units, their states and the world's shared state), `sim.transitions`
(placement plans in virtual time), `sim.serving` (trajectories and requests on the engines).
"""

from __future__ import annotations

from controlplane.sim.serving import Serving
from controlplane.sim.transitions import Transitions
from controlplane.sim.units import (
    DRAINING,
    EV_DRAIN_TIMEOUT,
    EV_ENV,
    EV_KV,
    EV_PREP,
    EV_READY,
    EV_RETURNED,
    EV_UNPAUSE,
    EV_WAKE,
    GONE,
    IDLE,
    INACTIVE,
    PENDING,
    PREPARING,
    SERVING,
    Host,
    Slot,
    WorldState,
)


class World(Transitions, Serving):
    """The simulated world under the core loop: its units (`WorldState`), the transitions placed on them
    (`Transitions`) and the trajectories they serve (`Serving`)."""


__all__ = [
    "DRAINING",
    "EV_DRAIN_TIMEOUT",
    "EV_ENV",
    "EV_KV",
    "EV_PREP",
    "EV_READY",
    "EV_RETURNED",
    "EV_UNPAUSE",
    "EV_WAKE",
    "GONE",
    "IDLE",
    "INACTIVE",
    "PENDING",
    "PREPARING",
    "SERVING",
    "Host",
    "Slot",
    "World",
    "WorldState",
]
