"""Replay an availability trace (`time_s,available_gpus`, the simulator's format) on the live
cluster: at each change point the elastic pool is held at the trace's level, scaled to this
cluster's reserved and elastic GPUs, by preemption notices and returns (services.availability).
Time runs `--speedup` times faster than the trace; the trace repeats until stopped."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.core.state import Pool
from controlplane.models import GPU
from controlplane.services.availability import elastic_target, set_elastic_capacity
from controlplane.sim.traces import TraceError, load_trace

POLL_S = 1.0


class Command(BaseCommand):
    help = "Hold the elastic pool at an availability trace's level (preemption notices and returns), in real time."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--trace",
            required=True,
            help="CSV with time_s,available_gpus (e.g. controlplane/sim/traces/bamboo-seg1.csv)",
        )
        parser.add_argument("--speedup", type=float, default=10.0, help="trace seconds per wall second (default 10)")
        parser.add_argument(
            "--notice-s", type=float, default=10.0, help="preemption notice in wall seconds (default 10)"
        )
        parser.add_argument("--once", action="store_true", help="play the trace once, do not repeat it")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            trace = load_trace(opts["trace"])
        except (OSError, TraceError) as exc:
            raise CommandError(f"cannot read the trace: {exc}") from None
        if opts["speedup"] <= 0:
            raise CommandError("--speedup must be > 0")
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        # the last level lasts as long as an average one before the trace starts again
        period = trace.times[-1] + (trace.times[-1] / (len(trace.times) - 1) if len(trace.times) > 1 else 60.0)
        peak = max(trace.gpus)
        t0 = time.monotonic()
        last: tuple[int, int] | None = None
        while True:
            # the level is held, not only set at change points: nodes that register late, or come back,
            # are noticed or returned on the next poll
            t = (time.monotonic() - t0) * opts["speedup"]
            gpus = trace.at(t if opts["once"] else t % period)
            # the reserved GPUs of the elastic pool's hardware only: the cpu slots of another job's
            # reserved node are no part of the trace's H800 pool
            hardware = set(GPU.objects.filter(node__pool=Pool.ELASTIC).values_list("hardware", flat=True))
            reserved = GPU.objects.filter(present=True, node__pool=Pool.RESERVED, hardware__in=hardware).count()
            elastic = GPU.objects.filter(node__pool=Pool.ELASTIC).count()
            target = elastic_target(gpus, peak, reserved=reserved, elastic=elastic)
            change = set_elastic_capacity(gpus=target, notice_s=opts["notice_s"], actor="trace")
            if (gpus, change.after_gpus) != last or change.preempted or change.returned:
                last = (gpus, change.after_gpus)
                self.stdout.write(
                    f"[trace {trace.name} t={t % period:.0f}s] {gpus} GPUs → elastic "
                    f"{change.before_gpus}→{change.after_gpus}"
                    + (f", notice to {', '.join(change.preempted)}" if change.preempted else "")
                    + (f", returned {', '.join(change.returned)}" if change.returned else "")
                )
                self.stdout.flush()
            if (opts["once"] and t >= trace.times[-1]) or stop.wait(POLL_S):
                return
