"""One reconnect loop for the agents' websocket links (the node agent's `/ws/agent/`, the rollout
driver's `/ws/driver/`): jittered exponential backoff, so that a control plane that restarts is not met
by every agent of the cluster at the same instant, and a long wait after a close that says "give way".

    async def connect_once() -> int | None:        # one connection, until it closes
        async with http.ws_connect(url) as ws:
            ...
        return ws.close_code

    await reconnect_forever(connect_once, stop=stopping, name="agent link")

`connect_once` returns the close code (or None). After a close with a give-way code (the token was
refused, or another socket now holds the lease) the next attempt waits about `max_s / 2`; after any other
close it waits about `initial_s`; after a failed attempt (an exception in `retry_on`) the wait doubles, up
to `max_s`, and is at least as long as the failed attempt took: a handshake that timed out or was refused
after seconds says the server is loaded, and a fleet whose handshakes all failed together then retries
spread over about that long instead of together a fraction of a second later. Every wait is the delay times
a uniform factor in [0.5, 1.5) (no factor with `jitter=False`). An exception not in `retry_on` ends the loop
(it propagates).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Collection

from aiohttp import ClientConnectionError, WSServerHandshakeError

from controlplane.core import agent_link as link

log = logging.getLogger("pearl.reconnect")

CLOSE_UNAUTHORIZED = 4401  # the token was refused
CLOSE_FORBIDDEN = 4403  # the token is valid but not for this node or job
# refused or superseded: reconnecting at once would only be refused again (or take the lease back from the
# socket that holds it now), so the next attempt waits the longest backoff's half
GIVE_WAY_CLOSE_CODES: frozenset[int] = frozenset({CLOSE_UNAUTHORIZED, CLOSE_FORBIDDEN, link.CLOSE_SUPERSEDED})
# what a link that is down raises: the peer is unreachable, refused the handshake, did not answer, or went
# away mid-handshake (a control plane restarting: ServerDisconnectedError is no OSError)
LINK_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ClientConnectionError,
    WSServerHandshakeError,
    asyncio.TimeoutError,
)
# the longest a link's handshake may take: a server too loaded to answer in this long is tried again later
# (with the backoff above) rather than waited on
HANDSHAKE_TIMEOUT_S = 20.0


async def reconnect_forever(
    connect_once: Callable[[], Awaitable[int | None]],
    *,
    stop: asyncio.Event | None = None,
    initial_s: float = 0.2,
    max_s: float = 30.0,
    jitter: bool = True,
    give_way: Collection[int] = GIVE_WAY_CLOSE_CODES,
    retry_on: tuple[type[BaseException], ...] = LINK_ERRORS,
    name: str = "link",
) -> None:
    """Call `connect_once` again and again, with backoff between the calls, until `stop` is set (checked
    after each connection and during each wait; without `stop`, until an exception outside `retry_on`)."""
    stop = stop or asyncio.Event()
    delay = initial_s
    while not stop.is_set():
        started = time.monotonic()
        try:
            code = await connect_once()
            delay = max_s / 2 if code in give_way else initial_s
            if code in give_way:
                log.error(
                    "%s: the peer closed the link with %s (token refused, or another socket holds it)", name, code
                )
        except retry_on as exc:
            log.warning("%s down: %s", name, exc)
            delay = failed_delay(delay, time.monotonic() - started, max_s)
        if stop.is_set():
            break
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), delay * (0.5 + random.random()) if jitter else delay)
        delay = min(max_s, delay * 2)


def failed_delay(delay: float, attempt_s: float, max_s: float) -> float:
    """The backoff after a failed attempt that took `attempt_s`: at least that long (see the module), at most
    `max_s`; an attempt longer than a handshake may take was a link that served a while, then failed: it
    keeps `delay`. Shared with the load generator's emulated agents (benchmarks/load_agents.py)."""
    return delay if attempt_s > HANDSHAKE_TIMEOUT_S else min(max_s, max(delay, attempt_s))
