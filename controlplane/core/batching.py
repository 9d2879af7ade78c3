"""The iteration-level continuous-batching model of one inference engine (a TP-group worker).

Shared world logic, not simulator logic: the simulator's engines (`sim.world`) and the live
emulated engine (`agents.engines.emulated`) both run `IterationScheduler`, one on a virtual clock, the
other on the wall clock.

The scheduler is advanced in *segments*: runs of iterations over which its running batch does not
change. A decode segment lasts until the first running sequence finishes its turn; a prefill
segment runs the chunked prefill of the queued prompts (colocated: every chunk iteration also
carries the running decodes, which is the PD interference). Within a segment every iteration is
costed by the hardware profile's `decode_iteration_s(batch, mean_context)` at the segment's mean
context (exact when the per-iteration cost is linear in context, as the roofline's KV-read term
is), so the segment time is the sum of per-iteration costs computed in closed form. An arrival
interrupts a decode segment at the next iteration boundary, exactly as continuous batching admits
new work between iterations. Nothing here evaluates the predictor's closed forms.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, SupportsFloat

from controlplane.core import telemetry as tm
from controlplane.core.state import Role


class EngineCosts(Protocol):
    def decode_iteration_s(self, batch: int, mean_context: float) -> float: ...

    def prefill_s(self, tokens: int, prefix: int) -> float: ...


CHUNK_TOKENS = 8192
"""Chunked-prefill token budget per iteration: the simulator's default (`EngineSpec.chunk_tokens`) and the
emulated engine's."""


class CostModel(Protocol):
    """What `ScaledCosts` scales: a hardware profile's engine costs (numpy-backed, so any float-like answer)."""

    def decode_iteration_s(self, batch: int, mean_context: float) -> SupportsFloat: ...

    def prefill_s(self, tokens: int, prefix: int) -> SupportsFloat: ...


class ScaledCosts:
    """The profile's engine costs times a constant factor (`EngineSpec.engine_slowdown`), memoised.

    Why memoised: the profile's roofline is numpy-backed (~10 µs a call) and the engine asks for
    the same (batch, context) many times; contexts are bucketed to CONTEXT_BUCKET tokens, which
    changes an iteration's KV-read time by < 0.05%.
    """

    __slots__ = ("_dcache", "_dec", "_pcache", "_pre", "k")
    CONTEXT_BUCKET = 32

    def __init__(self, costs: CostModel, k: float = 1.0) -> None:
        self._dec = costs.decode_iteration_s
        self._pre = costs.prefill_s
        self.k = k
        self._dcache: dict[tuple[int, int], float] = {}
        self._pcache: dict[tuple[int, int], float] = {}

    def decode_iteration_s(self, batch: int, mean_context: float) -> float:
        key = (batch, int(mean_context) // self.CONTEXT_BUCKET)
        v = self._dcache.get(key)
        if v is None:
            v = self.k * float(self._dec(batch, (key[1] + 0.5) * self.CONTEXT_BUCKET))
            self._dcache[key] = v
        return v

    def prefill_s(self, tokens: int, prefix: int) -> float:
        key = (tokens, prefix)
        v = self._pcache.get(key)
        if v is None:
            v = self.k * float(self._pre(tokens, prefix))
            self._pcache[key] = v
        return v


@dataclass(slots=True, eq=False)
class Request:
    """One turn of one trajectory being served (possibly the resumed remainder of a turn). `traj` is the
    caller's handle: a workload Trajectory (simulator), the emulated engine's sequence."""

    traj: Any
    compute: int  # prompt tokens to prefill (not in this worker's prefix cache)
    prefix: int  # prompt tokens already cached on the prefill worker
    ctx0: int  # context when decoding starts (prompt incl. partial response)
    remaining: int  # tokens left to generate in this turn
    arrive_s: float = 0.0
    join_it: int = 0
    end_it: int = 0
    seq: int = 0
    join_s: float = -1.0  # when it joined the decode batch (-1: not decoding yet)


@dataclass(slots=True)
class IterationSegment:
    kind: str  # "decode" | "prefill"
    t0: float
    it0: int
    k: int  # iterations in the segment
    dt: float  # mean seconds per iteration
    end_s: float
    batch: tuple[Request, ...] = ()  # prompts being prefilled
    # (tokens, cached prefix, seconds) of each prompt prefilled: its PREFILL telemetry record, kept even
    # when the prompt is aborted mid-pass (the pass did the work)
    parts: tuple[tuple[int, int, float], ...] = ()
    carried: int = 0  # decodes that ran in the same iterations (0: the prefill ran alone)

    @property
    def prefill_s(self) -> float:
        """Seconds of the segment spent prefilling (the rest carried the running decodes)."""
        return sum(p[2] for p in self.parts)

    @property
    def prefill_tokens(self) -> int:
        return sum(p[0] for p in self.parts)


def prefill_records(seg: IterationSegment, **kw: Any) -> list[tm.TelemetryRecord]:
    """One PREFILL record per prompt of a prefill segment, as an engine reports each prompt's prefill:
    its tokens, the cached prefix it attended over, its time, and the decodes that rode in the same
    iterations (the tracker compares those with prefill alone to measure the PD interference)."""
    return [
        tm.prefill(tokens=n, prefix_tokens=p, duration_s=s, running_batch=seg.carried, **kw) for n, p, s in seg.parts
    ]


class IterationScheduler:
    """One engine's continuous-batching scheduler at iteration level: its prompt and join queues, running
    batch and KV admission, for a colocated (prefill+decode), prefill-only or decode-only worker."""

    __slots__ = (
        "_seq",
        "busy_s",
        "chunk_tokens",
        "costs",
        "gen",
        "heap",
        "homed",
        "homed_ctx",
        "it",
        "iters",
        "joinq",
        "kv_capacity",
        "kv_used",
        "link_free_s",
        "mixed_penalty",
        "pool",
        "pq",
        "role",
        "running",
        "s0",
        "seg",
        "serving",
        "slot",
        "stats",
        "tokens_out",
        "version",
    )

    def __init__(
        self,
        slot: int,
        pool: str,
        role: Role,
        costs: EngineCosts,
        *,
        chunk_tokens: int,
        kv_capacity: int,
        gen: int = 0,
        mixed_penalty: float = 1.0,
    ) -> None:
        self.slot = slot
        self.mixed_penalty = mixed_penalty  # what-if: prefill next to running decodes costs this much more
        self.pool = pool
        self.gen = gen
        self.role = role
        self.costs = costs
        self.chunk_tokens = chunk_tokens
        self.kv_capacity = kv_capacity  # tokens of KV this worker can hold
        self.it = 0
        self.running: dict[int, Request] = {}
        self.heap: list[tuple[int, int]] = []  # (end_it, seq)
        self.s0 = 0  # Σ (ctx0 - join_it) over running, so Σ context(it) = s0 + n·it
        self.kv_used = 0  # tokens reserved by running requests (final context of their turn)
        self.pq: deque[Request] = deque()  # prompts waiting for prefill
        self.joinq: deque[Request] = deque()  # prefilled requests waiting to join decoding
        self.seg: IterationSegment | None = None
        self.version = 0
        self.homed = 0  # live trajectories whose home (sticky worker) this is
        self.homed_ctx = 0  # Σ context of those trajectories (their prefix-cache demand)
        self.busy_s = 0.0
        self.iters = 0
        self.tokens_out = 0
        self.serving = False  # active in the serving set W
        self.link_free_s = 0.0  # prefill worker's KV link
        self._seq = 0
        # motivation statistics (sim/calibration.py): prefill tokens computed / served from the prefix
        # cache, GPU time in prefill passes and in decode iterations, and the pure-decode segments
        # ("between prefill insertions") on their own
        self.stats = {
            "prefill_tokens": 0,
            "cached_tokens": 0,
            "prefill_s": 0.0,
            "decode_s": 0.0,
            "decode_tokens": 0,
            "pure_decode_s": 0.0,
            "pure_decode_tokens": 0,
        }

    # ------------------------------------------------------------------ queries
    def inflight_tokens(self) -> int:
        """Tokens generated (and counted) for running requests not yet credited to trajectories."""
        return sum(min(r.remaining, max(0, self.it - r.join_it)) for r in self.running.values())

    def load(self) -> int:
        return len(self.running) + len(self.pq) + len(self.joinq)

    def idle(self) -> bool:
        return self.seg is None

    # ------------------------------------------------------------------ admission
    def submit_prompt(self, req: Request) -> None:
        self.pq.append(req)

    def submit_decode(self, req: Request) -> None:
        self.joinq.append(req)

    def _join(self, req: Request, t: float) -> None:
        req.join_s = t
        self._seq += 1
        req.seq = self._seq
        req.join_it = self.it
        req.end_it = self.it + max(1, req.remaining)
        self.running[req.seq] = req
        heapq.heappush(self.heap, (req.end_it, req.seq))
        self.s0 += req.ctx0 - self.it
        self.kv_used += req.ctx0 + req.remaining

    def _fits(self, req: Request) -> bool:
        return not self.running or self.kv_used + req.ctx0 + req.remaining <= self.kv_capacity

    # ------------------------------------------------------------------ segments
    def plan(self, t: float) -> float | None:
        """Start the next segment at `t`; return its end time (None: nothing to do)."""
        while self.joinq and self._fits(self.joinq[0]):
            self._join(self.joinq.popleft(), t)
        n = len(self.running)
        if self.pq and self.role is not Role.DECODE and (self.role is Role.PREFILL or self._fits(self.pq[0])):
            batch: list[Request] = []
            parts: list[tuple[int, int, float]] = []
            tokens = 0
            kv_extra = 0
            while self.pq:
                r = self.pq[0]
                if batch and tokens + r.compute > self.chunk_tokens:
                    break
                over_kv = self.kv_used + kv_extra + r.ctx0 + r.remaining > self.kv_capacity
                if self.role is Role.COLOCATED and batch and over_kv:
                    break
                self.pq.popleft()
                batch.append(r)
                tokens += r.compute
                kv_extra += r.ctx0 + r.remaining
                parts.append((r.compute, r.prefix, self.costs.prefill_s(r.compute, r.prefix)))
            carried = 0 if self.role is Role.PREFILL else n
            if carried and self.mixed_penalty != 1.0:
                parts = [(a, b, c * self.mixed_penalty) for a, b, c in parts]
            seg = IterationSegment("prefill", t, self.it, 1, 0.0, t, tuple(batch), tuple(parts), carried)
            total = seg.prefill_s
            if carried:  # every chunk iteration also carries the running decodes
                seg.k = max(1, math.ceil(tokens / max(1, self.chunk_tokens - n)))
                mean_ctx = self.s0 / n + self.it + (seg.k - 1) * 0.5
                total += seg.k * self.costs.decode_iteration_s(n, mean_ctx)
            seg.dt, seg.end_s = total / seg.k, t + total
            self.seg = seg
            return seg.end_s
        if n:
            while self.heap[0][1] not in self.running:  # a removed request's entry
                heapq.heappop(self.heap)
            k = self.heap[0][0] - self.it
            mean_ctx = self.s0 / n + self.it + (k - 1) * 0.5
            dt = self.costs.decode_iteration_s(n, mean_ctx)
            self.seg = IterationSegment("decode", t, self.it, k, dt, t + k * dt)
            return self.seg.end_s
        self.seg = None
        return None

    def interrupt(self, t: float) -> float | None:
        """Cut a decode segment at the first iteration boundary at/after `t` (new end time), so
        newly arrived work is admitted between iterations. Returns None if no change is needed."""
        seg = self.seg
        if seg is None or seg.kind != "decode":
            return None
        j = math.ceil((t - seg.t0) / seg.dt - 1e-9) if seg.dt > 0 else seg.k
        if j >= seg.k:
            return None
        j = max(j, 1)
        seg.k = j
        seg.end_s = seg.t0 + j * seg.dt
        return seg.end_s

    def finish(self) -> tuple[list[Request], list[Request], IterationSegment]:
        """Apply the current segment: (prefilled requests, finished decode requests, segment)."""
        seg = self.seg
        assert seg is not None
        self.seg = None
        self.busy_s += seg.end_s - seg.t0
        n = len(self.running)
        prefilled: list[Request] = []
        if seg.kind == "prefill":
            prefilled = list(seg.batch)
            if self.role is Role.PREFILL or n == 0:
                k = 0
            else:
                k = seg.k
        else:
            k = seg.k
        done: list[Request] = []
        st = self.stats
        if seg.kind == "prefill":
            st["prefill_tokens"] += seg.prefill_tokens
            st["cached_tokens"] += sum(r.prefix for r in seg.batch)
            st["prefill_s"] += seg.prefill_s
            if k:
                st["decode_s"] += seg.end_s - seg.t0 - seg.prefill_s
        elif k:
            st["decode_s"] += seg.end_s - seg.t0
            st["pure_decode_s"] += seg.end_s - seg.t0
        if k:
            tok0 = self.tokens_out
            self.it += k
            self.iters += k
            self.tokens_out += k * n
            heap = self.heap
            while heap and heap[0][0] <= self.it:
                _, sq = heapq.heappop(heap)
                req = self.running.pop(sq, None)
                if req is None:  # removed earlier
                    continue
                self.tokens_out -= self.it - req.end_it  # overshoot inside a prefill segment
                self.s0 -= req.ctx0 - req.join_it
                self.kv_used -= req.ctx0 + req.remaining
                done.append(req)
            st["decode_tokens"] += self.tokens_out - tok0
            if seg.kind == "decode":
                st["pure_decode_tokens"] += self.tokens_out - tok0
        if seg.kind == "prefill" and self.role is Role.COLOCATED:
            for r in prefilled:
                self._join(r, seg.end_s)
            prefilled = []
        return prefilled, done, seg

    def _elapsed(self, t: float) -> int:
        """Iterations of the current segment that carried the running decodes and were done by `t`."""
        seg = self.seg
        if seg is None or seg.dt <= 0 or not (seg.kind == "decode" or self.role is Role.COLOCATED):
            return 0
        return max(0, min(seg.k, int((t - seg.t0) / seg.dt)))

    def generated(self, req: Request, t: float) -> int:
        """Tokens `req` has generated on this worker by `t` (mid-segment included)."""
        if self.running.get(req.seq) is not req:
            return 0
        return min(req.remaining, max(0, self.it + self._elapsed(t) - req.join_it))

    def remove(self, req: Request, t: float) -> int:
        """Take one request off this worker at `t` (an abort): returns the tokens it generated here.
        A running decode segment is cut at the next iteration boundary, so the batch it was costed
        for changes only between iterations."""
        seg = self.seg
        if seg is not None and seg.kind == "prefill" and req in seg.batch:
            seg.batch = tuple(r for r in seg.batch if r is not req)  # its prefill time is spent anyway
            return 0
        for q in (self.pq, self.joinq):
            if req in q:
                q.remove(req)
                return 0
        if self.running.get(req.seq) is not req:
            return 0
        g = self.generated(req, t)
        del self.running[req.seq]  # its heap entry is skipped when it comes up
        self.s0 -= req.ctx0 - req.join_it
        self.kv_used -= req.ctx0 + req.remaining
        self.interrupt(t)
        return g

    def evict(self, t: float) -> list[tuple[Request, int]]:
        """Take every request off this worker at `t` (drain, role change, preemption): returns
        (request, tokens generated in this service so far). Partial progress is kept by the caller."""
        out: list[tuple[Request, int]] = []
        seg = self.seg
        if seg is not None:
            self.busy_s += max(0.0, t - seg.t0)
            if seg.kind == "prefill":
                out.extend((r, 0) for r in seg.batch)
        for req in self.running.values():
            g = self.generated(req, t)
            self.tokens_out += g - min(req.remaining, max(0, self.it - req.join_it))  # the cut segment's part
            out.append((req, g))
        out.extend((r, 0) for r in self.pq)
        out.extend((r, 0) for r in self.joinq)
        self.running.clear()
        self.heap.clear()
        self.pq.clear()
        self.joinq.clear()
        self.s0 = 0
        self.kv_used = 0
        self.seg = None
        self.version += 1
        return out


OnDone = Callable[[IterationScheduler, list[Request], list[Request], IterationSegment, float], None]
