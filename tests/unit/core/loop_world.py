"""A small deterministic world for the core loop, and two clocks to run it on.

The world reacts to the loop's commands with future events (engines generating, environments
stepping, the trainer training, borrowed workers returning) and to injected faults (a worker
preempted mid-turn, a worker joining, an engine serving with stale weights). It knows nothing of
clocks: it answers `(delay, make_event)` pairs that the heap clock (the simulator's kind) or the
asyncio clock (`agents.driver.AsyncLoopRunner`) schedule.
"""

from __future__ import annotations

import asyncio
import heapq
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from controlplane.core import loop as lp
from controlplane.core.context import Signal
from controlplane.core.state import Role

Make = Callable[[float], "lp.Event | list[Reaction] | None"]  # a list: more reactions to schedule
Reaction = tuple[float, Make]
EPS = 1e-4  # distinct timestamps: both clocks order equal-time events the same way only if none are equal


def _h(*parts: object) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


@dataclass
class Request:
    tid: str
    worker: int
    start: float
    tokens: int  # tokens this request generates if not interrupted
    kind: str  # "first" | "decode"
    gen: int = 0  # request generation (a stale timer checks it)


@dataclass
class ToyWorld:
    workers: dict[int, Role]  # initial serving workers
    overlap: dict[int, Role] = field(default_factory=dict)  # borrowed after Training Finished
    turns: int = 3  # turns per trajectory (varied by task)
    token_s: float = 0.01  # decode time per token
    prefill_s: float = 0.2
    env_s: float = 0.7
    train_s: float = 5.0
    sync_s: float = 0.5
    activation_s: float = 1.0
    return_s: float = 0.6
    stale_engine: int | None = None  # this worker reports weights v0 (a lagging engine)
    seq: int = 0
    inflight: dict[str, Request] = field(default_factory=dict)
    turn_of: dict[str, int] = field(default_factory=dict)
    kept: dict[str, int] = field(default_factory=dict)
    serving: dict[int, Role] = field(default_factory=dict)
    generated_by: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))

    def _eps(self) -> float:
        self.seq += 1
        return self.seq * EPS

    # ------------------------------------------------------------------ start
    def start(self) -> list[Reaction]:
        out: list[Reaction] = [(0.0, lambda now: lp.Start(now))]
        for w, role in sorted(self.workers.items()):
            out.append((self._eps(), self._ready(w, role, False)))
        return out

    def _ready(self, w: int, role: Role, overlap: bool) -> Make:
        def make(now: float) -> lp.Event:
            self.serving[w] = role
            return lp.WorkerReady(now, w, role, overlap=overlap, gpus=2)

        return make

    def _task_turns(self, tid: str) -> int:
        base = tid.split("-r")[0]
        return 1 + _h(base) % self.turns

    def _tokens(self, tid: str, turn: int) -> int:
        return 20 + _h(tid.split("-r")[0], turn) % 60

    # ------------------------------------------------------------------ commands
    def react(self, cmd: lp.Command, now: float) -> list[Reaction]:
        k = type(cmd)
        if k is lp.StartStep:
            return [(self._eps(), self._started(r.trajectory)) for r in cmd.trajectories]
        if k is lp.RouteTurn or k is lp.Resubmit:
            return self._submit(cmd.trajectory, cmd.worker, now, "first")
        if k is lp.RouteDecode:
            return self._submit(cmd.trajectory, cmd.worker, now, "decode")
        if k is lp.ReturnOverlap:
            # the agents take a while to act on the return: until then the workers would still take turns
            out: list[Reaction] = [
                (self.return_s / 2 + self._eps(), partial(self.take_away, w, why="return"))
                for w in sorted(self.overlap)
            ]
            out.append((self.return_s + self._eps(), lambda n: lp.ReturnConfirmed(n)))
            return out
        if k is lp.Train:
            return [(self.train_s + self._eps(), partial(lp.TrainingDone, step=cmd.step, loss=0.5))]
        if k is lp.PublishWeights:
            return [(self.sync_s + self._eps(), partial(lp.WeightsPublished, version=cmd.version))]
        if k is lp.EmitSignal and cmd.signal is Signal.TRAINING_FINISHED:
            return [(self.activation_s + self._eps(), self._ready(w, r, True)) for w, r in sorted(self.overlap.items())]
        if k is lp.Abort:
            self.inflight.pop(cmd.trajectory, None)
            if cmd.replacement is not None:
                return [(self._eps(), self._started(cmd.replacement.trajectory))]
        return []

    def _started(self, tid: str) -> Make:
        def make(now: float) -> lp.Event:
            self.turn_of[tid] = 0
            return lp.TrajectoryStarted(now, tid, prompt_tokens=50)

        return make

    def _submit(self, tid: str, w: int, now: float, kind: str) -> list[Reaction]:
        if w not in self.serving:  # gone before the request got there
            return [(self._eps(), lambda n: lp.TurnInterrupted(n, tid, w))]
        turn = self.turn_of[tid]
        left = self._tokens(tid, turn) - self.kept.get(tid, 0)
        req = Request(tid, w, now, left, kind, gen=self.seq)
        self.inflight[tid] = req
        role = self.serving[w]
        if role is Role.PREFILL:
            return [(self.prefill_s + self._eps(), self._prefilled(req))]
        dur = (self.prefill_s if kind == "first" else 0.0) + left * self.token_s + self._eps()
        return [(dur, self._generated(req))]

    def _prefilled(self, req: Request) -> Make:
        def make(now: float) -> lp.Event | None:
            if self.inflight.get(req.tid) is not req:
                return None
            return lp.Prefilled(now, req.tid, req.worker, prefilled_tokens=40)

        return make

    def _generated(self, req: Request) -> Make:
        def make(now: float) -> lp.Event | None:
            if self.inflight.get(req.tid) is not req:
                return None
            del self.inflight[req.tid]
            self.kept.pop(req.tid, None)
            version = 0 if req.worker == self.stale_engine else None
            self.generated_by[req.tid].add(req.worker)
            return lp.TurnGenerated(
                now,
                req.tid,
                req.worker,
                req.tokens,
                prefilled_tokens=40 if req.kind == "first" else 0,
                weight_version=version,
            )

        return make

    def after(self, ev: lp.Event) -> list[Reaction]:
        """The world's own follow-ups: a generated turn goes to the environment."""
        if type(ev) is lp.TurnGenerated:
            tid = ev.trajectory
            turn = self.turn_of[tid]
            done = turn + 1 >= self._task_turns(tid)
            self.turn_of[tid] = turn + 1

            def env(now: float, tid: str = tid, done: bool = done) -> lp.Event:
                return lp.EnvStepped(now, tid, self.env_s, done, reward=float(_h(tid) % 2), observation_tokens=30)

            return [((0.0 if done else self.env_s) + self._eps(), env)]
        return []

    # ------------------------------------------------------------------ faults
    def take_away(self, w: int, now: float, why: str) -> list[Reaction]:
        """The worker stops serving at once (preemption / return): its requests come back partial."""
        role = self.serving.pop(w, None)
        out: list[Reaction] = [(self._eps(), lambda n: lp.WorkerGone(n, w, why))]
        for tid, req in sorted(self.inflight.items()):
            if req.worker != w:
                continue
            del self.inflight[tid]
            decoding = now - req.start - (self.prefill_s if req.kind == "first" else 0.0)
            done = 0 if role is Role.PREFILL else int(round(max(0.0, decoding) / self.token_s, 6))
            done = max(0, min(done, req.tokens - 1))
            self.kept[tid] = self.kept.get(tid, 0) + done
            out.append((self._eps(), partial(lp.TurnInterrupted, trajectory=tid, worker=w, generated_tokens=done)))
        return out


# ====================================================================== clocks
def run_heap(
    world: ToyWorld, config: lp.LoopConfig, script: list[tuple[float, Callable[[float], list[Reaction]]]], until: float
) -> tuple[lp.RolloutLoop, list[tuple[float, lp.Command]]]:
    """The simulator's kind of clock: a heap of (time, seq) events."""
    loop = lp.RolloutLoop(config)
    heap: list[tuple[float, int, Make]] = []
    seq = [0]
    now = [0.0]
    cmds: list[tuple[float, lp.Command]] = []

    def push(delay: float, make: Make) -> None:
        seq[0] += 1
        heapq.heappush(heap, (round(now[0] + delay, 6), seq[0], make))

    def dispatch(cmd: lp.Command) -> None:
        cmds.append((round(now[0], 4), cmd))
        for d, m in world.react(cmd, now[0]):
            push(d, m)

    feeder = lp.Feeder(loop, dispatch)
    for d, m in world.start():
        push(d, m)
    for t, f in script:
        push(t, _injector(f, push))
    while heap:
        t, _, make = heapq.heappop(heap)
        if t > until:
            break
        now[0] = t
        ev = make(t)
        if ev is None:
            continue
        if isinstance(ev, list):
            _inject(ev, push)
            continue
        for d, m in world.after(ev):
            push(d, m)
        feeder.feed(ev)
    return loop, cmds


def _inject(reactions: list[Reaction], push: Callable[[float, Make], None]) -> None:
    for d, m in reactions:
        push(d, m)
    return None


def _injector(fault: Callable[[float], list[Reaction]], push: Callable[[float, Make], None]) -> Callable[[float], None]:
    """A scripted fault as a scheduled event: at its time, the reactions it answers go on the clock."""

    def make(now: float) -> None:
        _inject(fault(now), push)

    return make


async def run_asyncio(
    world: ToyWorld, config: lp.LoopConfig, script: list[tuple[float, Callable[[float], list[Reaction]]]], until: float
) -> tuple[lp.RolloutLoop, list[tuple[float, lp.Command]]]:
    """The live driver's clock: the asyncio event loop (under looptime in tests)."""
    from agents.driver import AsyncLoopRunner

    loop = lp.RolloutLoop(config)
    cmds: list[tuple[float, lp.Command]] = []
    runner: AsyncLoopRunner

    def schedule(delay: float, make: Make) -> None:
        def fire(now: float) -> lp.Event | None:
            ev = make(now)
            if isinstance(ev, list):
                _inject(ev, schedule)
                return None
            if ev is not None:
                for d, m in world.after(ev):
                    schedule(d, m)
            return ev

        runner.later(delay, fire)

    def dispatch(cmd: lp.Command) -> None:
        cmds.append((round(runner.now(), 4), cmd))
        for d, m in world.react(cmd, runner.now()):
            schedule(d, m)

    runner = AsyncLoopRunner(loop, dispatch)
    for d, m in world.start():
        schedule(d, m)
    for t, f in script:
        runner.later(t, _injector(f, schedule))
    await asyncio.sleep(until)
    return loop, cmds
