"""Crash points for the fault suite (issue 34): `PEARL_CRASH_AT=name` makes the process that reaches the named
point SIGKILL itself there, as a machine or OOM kill would, so a test can kill a live job at a precise moment
of its step (between the last trajectory and Training Begin, mid-update, between the update's commit and
its answer, ...). Off by default: with the variable unset a crash point is one dictionary lookup.

`PEARL_CRASH_FLAG=path` makes it one-shot: the point fires only if `path` does not exist, and creates it first,
so the process restarted with the same environment (a driver restarted by its node agent) runs through.
`PEARL_CRASH_AFTER=n` lets the point pass n times before it fires (e.g. the second update, not the first).

The points, each in the process its name starts with:

- `driver.trajectory_durable`: a trajectory's samples were acknowledged by the trainer, before the loop counts it;
- `driver.mid_rollout_after_turn`: a turn that did not end its trajectory is journaled, before the next is asked for;
- `driver.before_training_begin`: the step's last trajectory is in, before Training Begin goes out;
- `driver.after_update`: the trainer answered the update, before the driver reports it trained;
- `trainer.mid_update`: the update's samples are taken from the buffer, before it trains and commits;
- `trainer.after_commit`: the update's checkpoint is committed, before its audit line and its answer.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

POINTS = frozenset(
    {
        "driver.trajectory_durable",
        "driver.mid_rollout_after_turn",
        "driver.before_training_begin",
        "driver.after_update",
        "trainer.mid_update",
        "trainer.after_commit",
    }
)
_passed: dict[str, int] = {}


def crash_point(name: str) -> None:
    """SIGKILL this process here if PEARL_CRASH_AT names this point (see the module's docstring)."""
    if os.environ.get("PEARL_CRASH_AT") != name:
        return
    _passed[name] = _passed.get(name, 0) + 1
    if _passed[name] <= int(os.environ.get("PEARL_CRASH_AFTER", "0")):
        return
    flag = os.environ.get("PEARL_CRASH_FLAG", "")
    if flag:
        path = Path(flag)
        if path.exists():
            return
        path.write_text(name)
    os.kill(os.getpid(), signal.SIGKILL)
