"""The rollout driver's clock: core's RL loop fed from asyncio callbacks and tasks.

`AsyncLoopRunner` is the asyncio clock for `controlplane.core.loop.RolloutLoop`, as the simulator's heap is
its virtual clock: events are stamped with the event loop's time and fed through the same `Feeder`, so for
the same events both drivers see the same commands.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from controlplane.core.loop import Command, Event, Feeder, RolloutLoop


class AsyncLoopRunner:
    """Feeds a RolloutLoop from asyncio callbacks and tasks; commands go to `dispatch` in order."""

    def __init__(
        self, loop: RolloutLoop, dispatch: Callable[[Command], None], *, elapsed_s: float = 0.0, scale: float = 1.0
    ) -> None:
        self.loop = loop
        self._feeder = Feeder(loop, dispatch)
        self._aio = asyncio.get_running_loop()
        self.scale = scale  # wall seconds per loop second (an emulated job runs `time_factor` times real time)
        self._t0 = self._aio.time() - elapsed_s * scale

    def now(self) -> float:
        """Seconds on the loop's clock: `elapsed_s` at start (a restored loop's clock goes on), then the
        event loop's monotonic clock, in the job's time (model seconds for an emulated job)."""
        return (self._aio.time() - self._t0) / self.scale

    def feed(self, event: Event) -> None:
        self._feeder.feed(event)

    def later(self, delay_s: float, make: Callable[[float], Event | None]) -> asyncio.TimerHandle:
        """Feed `make(now)` after `delay_s` (nothing if it returns None: the event was cancelled)."""

        def fire() -> None:
            ev = make(self.now())
            if ev is not None:
                self.feed(ev)

        return self._aio.call_later(max(0.0, delay_s * self.scale), fire)
