"""The one way a driver feeds its loop: events queued, commands carried out in order, no re-entry."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from controlplane.core.loop.machine import RolloutLoop
from controlplane.core.loop.messages import Command, Event


class Feeder:
    """Feeds events to a loop and carries its commands out in order through `dispatch`.

    Events raised while a command is being carried out are queued and handled after the current
    batch, in arrival order: the loop never re-enters itself, and a driver on any clock (the
    simulator's heap, asyncio) sees the same commands for the same events.
    """

    __slots__ = ("_draining", "_queue", "dispatch", "loop")

    def __init__(self, loop: RolloutLoop, dispatch: Callable[[Command], None]) -> None:
        self.loop = loop
        self.dispatch = dispatch
        self._queue: deque[Event] = deque()
        self._draining = False

    def feed(self, event: Event) -> None:
        self._queue.append(event)
        if self._draining:
            return
        self._draining = True
        try:
            q, handle, dispatch = self._queue, self.loop.handle, self.dispatch
            while q:
                for cmd in handle(q.popleft()):
                    dispatch(cmd)
        finally:
            self._draining = False
