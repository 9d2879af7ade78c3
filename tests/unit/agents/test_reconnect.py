"""The agents' one reconnect loop: the waits it keeps between attempts, give-way closes and stopping."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from aiohttp import ServerDisconnectedError

from agents.reconnect import GIVE_WAY_CLOSE_CODES, HANDSHAKE_TIMEOUT_S, failed_delay, reconnect_forever
from controlplane.core import agent_link as link


def run_attempts(outcomes: list[object], **kw: object) -> list[float]:
    """Run the loop over `outcomes` (a close code, or an exception to raise) and return the waits seen
    before each attempt after the first."""
    starts: list[float] = []
    stop = asyncio.Event()

    async def connect_once() -> int | None:
        starts.append(time.monotonic())
        outcome = outcomes[len(starts) - 1]
        if len(starts) == len(outcomes):
            stop.set()
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]

    asyncio.run(reconnect_forever(connect_once, stop=stop, **kw))  # type: ignore[arg-type]
    return [b - a for a, b in itertools.pairwise(starts)]


def test_failed_attempts_double_the_wait_and_a_close_resets_it():
    waits = run_attempts(
        [OSError("refused"), OSError("refused"), OSError("refused"), 1000, 1000],
        initial_s=0.05,
        max_s=10.0,
        jitter=False,
    )
    # each wait is at least its delay (a loaded machine only adds to it): doubling while attempts fail, back to
    # the first after a close. A wait that failed to double is under its bound; one that was not reset (0.4 s)
    # or grew more than twofold is over the slack
    expected = [0.05, 0.1, 0.2, 0.05]
    assert all(e - 0.002 <= w < 1.8 * e for w, e in zip(waits, expected, strict=True)), waits


def test_the_wait_is_capped_and_jittered():
    waits = run_attempts([OSError()] * 6, initial_s=0.04, max_s=0.08, jitter=True)
    assert all(0.04 * 0.5 - 0.005 <= w <= 0.08 * 1.5 + 0.05 for w in waits)
    assert max(waits[2:]) >= 0.08 * 0.5 - 0.005  # capped at max_s, not at initial_s


def test_a_give_way_close_waits_half_the_longest_backoff():
    assert link.CLOSE_SUPERSEDED in GIVE_WAY_CLOSE_CODES and 4401 in GIVE_WAY_CLOSE_CODES
    waits = run_attempts([link.CLOSE_SUPERSEDED, 1000], initial_s=0.01, max_s=0.6, jitter=False)
    assert waits[0] == pytest.approx(0.3, abs=0.1)


def test_an_error_outside_retry_on_ends_the_loop():
    with pytest.raises(ValueError):
        run_attempts([OSError(), ValueError("a bug, not a link that is down"), 1000], initial_s=0.01, jitter=False)


def test_stop_ends_the_wait_at_once():
    async def main() -> float:
        stop = asyncio.Event()

        async def connect_once() -> int | None:
            asyncio.get_running_loop().call_later(0.05, stop.set)
            return link.CLOSE_SUPERSEDED  # the next attempt would wait max_s / 2 = 30 s

        t0 = time.monotonic()
        await reconnect_forever(connect_once, stop=stop, max_s=60.0)
        return time.monotonic() - t0

    assert asyncio.run(main()) < 2.0


def test_a_slow_failed_handshake_waits_at_least_as_long_before_the_next():
    """A fleet whose handshakes all failed after seconds (a loaded server) spreads its retries over that long."""
    outcomes: list[object] = [OSError("timed out"), 1000, 1000]
    starts: list[float] = []
    stop = asyncio.Event()

    async def connect_once() -> int | None:
        starts.append(time.monotonic())
        if len(starts) == 1:
            await asyncio.sleep(0.3)  # the attempt took 0.3 s, then failed
        if len(starts) == len(outcomes):
            stop.set()
        outcome = outcomes[len(starts) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]

    asyncio.run(reconnect_forever(connect_once, stop=stop, initial_s=0.01, max_s=10.0, jitter=False))
    assert starts[1] - starts[0] >= 0.3 + 0.3 - 0.01  # the attempt's 0.3 s, then a wait of as long
    # a link that served past a handshake's longest, then failed, is no sign of load: the delay stands
    assert failed_delay(0.2, HANDSHAKE_TIMEOUT_S + 1.0, 30.0) == 0.2
    assert failed_delay(0.2, 5.0, 30.0) == 5.0 and failed_delay(0.2, 5.0, 2.0) == 2.0


def test_a_server_that_goes_away_mid_handshake_is_a_link_that_is_down():
    # a control plane restarting closes connections before it answers: aiohttp's ServerDisconnectedError is no
    # OSError, and ending the loop on it would leave the node without a link until someone restarts its agent
    waits = run_attempts([ServerDisconnectedError(), 1000], initial_s=0.01, jitter=False)
    assert len(waits) == 1
