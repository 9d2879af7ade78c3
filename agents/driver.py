"""The rollout driver (one per job, the paper's Pipeline Scheduler): core's RL loop on asyncio.

`AsyncLoopRunner` is the asyncio clock for `controlplane.core.loop.RolloutLoop`, as the simulator's
heap is its virtual clock: events are stamped with the event loop's time since the runner started
and fed through the same `Feeder`, so for the same events both drivers see the same commands.
"""
from __future__ import annotations

import asyncio
from typing import Callable

from controlplane.core.loop import Command, Event, Feeder, RolloutLoop


class AsyncLoopRunner:
    """Feeds a RolloutLoop from asyncio callbacks and tasks; commands go to `dispatch` in order."""

    def __init__(self, loop: RolloutLoop, dispatch: Callable[[Command], None]) -> None:
        self.loop = loop
        self._feeder = Feeder(loop, dispatch)
        self._aio = asyncio.get_running_loop()
        self._t0 = self._aio.time()

    def now(self) -> float:
        """Seconds since the runner started, on the event loop's clock."""
        return self._aio.time() - self._t0

    def feed(self, event: Event) -> None:
        self._feeder.feed(event)

    def later(self, delay_s: float, make: Callable[[float], Event | None]) -> asyncio.TimerHandle:
        """Feed `make(now)` after `delay_s` (nothing if it returns None: the event was cancelled)."""
        def fire() -> None:
            ev = make(self.now())
            if ev is not None:
                self.feed(ev)

        return self._aio.call_later(max(0.0, delay_s), fire)
