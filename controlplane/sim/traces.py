"""Elastic availability traces: rollout GPUs available over time (reserved + preemptible).

A trace is a piecewise-constant function time_s -> available rollout GPUs, stored as CSV with the
header `time_s,available_gpus` (the count includes the reserved rollout GPUs, as in the paper's
segment means 13.6 / 9.0 / 11.8). `generate_bamboo_like` draws Bamboo-like preemptible traces:
spot GPUs arrive and are preempted in TP-sized units, with a target mean and change frequency.
"""

from __future__ import annotations

import bisect
import csv
import io
import math
import random
from dataclasses import dataclass
from pathlib import Path


class TraceError(ValueError):
    """A trace file is malformed; the message says where and why."""


@dataclass(frozen=True, slots=True)
class AvailabilityTrace:
    times: tuple[float, ...]  # strictly increasing, first is 0
    gpus: tuple[int, ...]
    name: str = "trace"

    def __post_init__(self) -> None:
        if not self.times or len(self.times) != len(self.gpus):
            raise TraceError("a trace needs at least one (time_s, available_gpus) row")
        if self.times[0] != 0.0:
            raise TraceError("a trace must start at time_s = 0")
        for a, b in zip(self.times, self.times[1:]):
            if b <= a:
                raise TraceError(f"time_s must be strictly increasing (got {a} then {b})")

    def at(self, t: float) -> int:
        i = bisect.bisect_right(self.times, t) - 1
        return self.gpus[max(i, 0)]

    def changes(self, until_s: float) -> list[tuple[float, int]]:
        """(time, gpus) change points after t=0 up to `until_s`."""
        return [(t, g) for t, g in zip(self.times[1:], self.gpus[1:]) if t <= until_s]

    def mean(self, duration_s: float) -> float:
        total = 0.0
        for i, t in enumerate(self.times):
            if t >= duration_s:
                break
            t_next = self.times[i + 1] if i + 1 < len(self.times) else duration_s
            total += self.gpus[i] * (min(t_next, duration_s) - t)
        return total / duration_s

    def n_changes(self, duration_s: float) -> int:
        return len(self.changes(duration_s))

    def constant(self, gpus: int) -> AvailabilityTrace:
        return AvailabilityTrace((0.0,), (gpus,), name=f"constant-{gpus}")

    def to_csv(self) -> str:
        buf = io.StringIO()
        buf.write("time_s,available_gpus\n")
        for t, g in zip(self.times, self.gpus):
            buf.write(f"{t:.1f},{g}\n")
        return buf.getvalue()


def parse_trace_csv(text: str, *, name: str = "trace", source: str = "<trace>") -> AvailabilityTrace:
    """Parse `time_s,available_gpus` CSV; every error names the file and line."""
    reader = csv.reader(io.StringIO(text))
    rows = list(reader)
    if not rows:
        raise TraceError(f"{source}: empty trace file")
    header = [c.strip() for c in rows[0]]
    if header != ["time_s", "available_gpus"]:
        raise TraceError(f"{source}:1: header must be 'time_s,available_gpus' (got {','.join(header)!r})")
    times: list[float] = []
    gpus: list[int] = []
    for lineno, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) != 2:
            raise TraceError(f"{source}:{lineno}: expected 2 columns, got {len(row)}")
        try:
            t = float(row[0])
        except ValueError:
            raise TraceError(f"{source}:{lineno}: time_s {row[0]!r} is not a number") from None
        try:
            g = int(row[1])
        except ValueError:
            raise TraceError(f"{source}:{lineno}: available_gpus {row[1]!r} is not an integer") from None
        if not math.isfinite(t) or t < 0:
            raise TraceError(f"{source}:{lineno}: time_s must be finite and >= 0")
        if g < 0:
            raise TraceError(f"{source}:{lineno}: available_gpus must be >= 0")
        if times and t <= times[-1]:
            raise TraceError(f"{source}:{lineno}: time_s must be strictly increasing")
        times.append(t)
        gpus.append(g)
    if not times:
        raise TraceError(f"{source}: no data rows")
    if times[0] != 0.0:
        raise TraceError(f"{source}:2: the first row must be at time_s 0")
    return AvailabilityTrace(tuple(times), tuple(gpus), name=name)


def load_trace(path: str | Path) -> AvailabilityTrace:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise TraceError(f"{p}: cannot read trace file ({exc.strerror})") from None
    return parse_trace_csv(text, name=p.stem, source=str(p))


@dataclass(frozen=True, slots=True)
class SegmentSpec:
    """How a Bamboo-like segment looks: mean total rollout GPUs and how often availability changes."""

    name: str
    mean_gpus: float  # including the reserved GPUs
    reserved_gpus: int = 4
    max_preemptible: int = 12
    mean_hold_s: float = 240.0  # mean time between availability changes
    duration_s: float = 7200.0
    tp: int = 2
    dip: tuple[float, float, int] | None = None  # (start_s, end_s, cap on preemptible GPUs)


# The paper's three 2-hour Bamboo segments (following RLBoost): Seg1 frequent changes / abundant,
# Seg2 frequent / limited (with a mid-trace dip, Fig. 6), Seg3 moderate / fewer changes.
PAPER_SEGMENTS: dict[str, SegmentSpec] = {
    "seg1": SegmentSpec("seg1", 13.6, mean_hold_s=180.0),
    "seg2": SegmentSpec("seg2", 9.0, mean_hold_s=180.0, dip=(2700.0, 4200.0, 2)),
    "seg3": SegmentSpec("seg3", 11.8, mean_hold_s=600.0),
}


def generate_bamboo_like(spec: SegmentSpec, *, seed: int) -> AvailabilityTrace:
    """A seeded preemptible-availability trace whose time-mean equals `spec.mean_gpus` (±0.05).

    Spot capacity follows a mean-reverting random walk in TP-sized units (Bamboo's arrivals and
    preemptions come in instance units), held for exponential times. The walk's level is then
    shifted until the time-mean matches the segment mean, so the three paper segments are
    reproduced in their means, change frequency and Seg2's dip.
    """
    rng = random.Random(seed)
    unit = spec.tp
    target_pre = spec.mean_gpus - spec.reserved_gpus
    times: list[float] = [0.0]
    t = 0.0
    while True:
        t += max(30.0, rng.expovariate(1.0 / spec.mean_hold_s))
        if t >= spec.duration_s:
            break
        times.append(round(t, 1))
    # Mean-reverting walk in units, clamped to [0, max].
    levels: list[float] = []
    x = target_pre
    for _ in times:
        x = x + 0.5 * (target_pre - x) + rng.gauss(0.0, 0.35 * spec.max_preemptible)
        levels.append(x)

    def realise(shift: float) -> list[int]:
        out = []
        for tt, lv in zip(times, levels):
            cap = spec.max_preemptible
            if spec.dip and spec.dip[0] <= tt < spec.dip[1]:
                cap = spec.dip[2]
            g = int(round((lv + shift) / unit)) * unit
            out.append(spec.reserved_gpus + min(max(g, 0), cap))
        return out

    def mean_of(gpus: list[int]) -> float:
        return AvailabilityTrace(tuple(times), tuple(gpus)).mean(spec.duration_s)

    lo, hi = -2.0 * spec.max_preemptible, 2.0 * spec.max_preemptible
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if mean_of(realise(mid)) < spec.mean_gpus:
            lo = mid
        else:
            hi = mid
    best = realise(0.5 * (lo + hi))
    # Fine-tune: nudge single segments by one unit until the mean is within 0.05.
    for _ in range(200):
        m = mean_of(best)
        if abs(m - spec.mean_gpus) <= 0.05:
            break
        i = rng.randrange(len(best))
        step = unit if m < spec.mean_gpus else -unit
        cap = spec.max_preemptible
        if spec.dip and spec.dip[0] <= times[i] < spec.dip[1]:
            cap = spec.dip[2]
        cand = best[i] + step
        if spec.reserved_gpus <= cand <= spec.reserved_gpus + cap:
            best[i] = cand
    # Merge equal neighbours (a change point is a change).
    mt, mg = [times[0]], [best[0]]
    for tt, g in zip(times[1:], best[1:]):
        if g != mg[-1]:
            mt.append(tt)
            mg.append(g)
    return AvailabilityTrace(tuple(mt), tuple(mg), name=spec.name)
