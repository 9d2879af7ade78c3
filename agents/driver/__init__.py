"""The rollout driver (one per job, the paper's Pipeline Scheduler): core's RL loop on asyncio.

`python -m agents.driver --control-plane http://cp:8000 --job NAME` (token in `PEARL_DRIVER_TOKEN`)
connects to the driver link (`/ws/driver/`), restores the loop from the control plane's checkpoint,
and runs it: environments (`agents.envs`) produce prompts and rewards, engine workers generate turns
(colocated, or prefill → KV hand-off → decode), the trainer trains each collected batch. The
control plane pushes the serving workers and the weight version (level-triggered) and answers the
loop's elastic signals by re-planning; the driver reports progress, telemetry and checkpoints.

By idea: `clock` (`AsyncLoopRunner`: the loop on the event loop's clock, as the simulator's heap is its
virtual one), `episodes` (`Episode`: a trajectory's environment and its turns on engine workers; a new
kind of environment plugs in with `agents.envs.register`), `rollout` (`RolloutDriver`: the loop's
command sink, the training handshake, the reports), `link` (`ControlLink`, `run_driver`: the socket to
the control plane), `__main__` (the command line).
"""

from __future__ import annotations

from agents.driver.clock import AsyncLoopRunner
from agents.driver.episodes import Episode, EpisodeRunner, WorkerUnavailable
from agents.driver.link import ControlLink, run_driver
from agents.driver.rollout import CHECKPOINT_EVERY_S, RolloutDriver

__all__ = [
    "CHECKPOINT_EVERY_S",
    "AsyncLoopRunner",
    "ControlLink",
    "Episode",
    "EpisodeRunner",
    "RolloutDriver",
    "WorkerUnavailable",
    "run_driver",
]
