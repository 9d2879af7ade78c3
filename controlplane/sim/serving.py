"""The simulated world's serving: trajectories' turns on the units' engines, KV links and environments.

A turn's prompt goes to a colocated or prefill worker (reusing its cached prefix on its home worker unless
KV pressure evicted it, or the worker's memory was re-partitioned, or new weights flushed it); a prefilled
request's KV cache crosses a serialised link to the decode worker the loop picks; an interrupted request
keeps its generated prefix; the environment's tool latency separates turns. What happened is reported to
the loop (`TrajectoryStarted`, `Prefilled`, `TurnGenerated`, `TurnInterrupted`, `EnvStepped`).
"""

from __future__ import annotations

from controlplane.core import loop as lp
from controlplane.core import telemetry as tm
from controlplane.core.batching import Request, prefill_records
from controlplane.core.state import Role
from controlplane.core.workload import Trajectory
from controlplane.sim.units import DRAINING, EV_ENV, EV_KV, EV_WAKE, GONE, INACTIVE, SERVING, Slot, WorldState


class Serving(WorldState):
    """Trajectories and their requests on the world's units."""

    def start_batch(self, cmd: lp.StartStep, batch: list[Trajectory], t: float) -> None:
        self.batch = batch
        for ref, traj in zip(cmd.trajectories, batch):
            traj.tid = ref.trajectory
            self.trajs[traj.tid] = traj
        for traj in batch:
            traj.start_s = t
            self.begin_turn(traj, t)
            self.feed(lp.TrajectoryStarted(t, traj.tid, traj.turns[0].new_prompt_tokens))

    def abort(self, cmd: lp.Abort, t: float) -> None:
        """A trajectory dropped by the loop (staleness): the same task starts again from its first turn."""
        old = self.trajs.pop(cmd.trajectory)
        old.done = True
        self.unhome(old)
        if cmd.replacement is not None:
            new = Trajectory(tid=cmd.replacement.trajectory, step=old.step, group=old.group, turns=old.turns)
            self.trajs[new.tid] = new
            self.batch[self.batch.index(old)] = new
            new.start_s = t
            self.begin_turn(new, t)
            self.feed(lp.TrajectoryStarted(t, new.tid, new.turns[0].new_prompt_tokens))

    def begin_turn(self, traj: Trajectory, t: float) -> None:
        spec = traj.turns[traj.turn]
        self.grow(traj, spec.new_prompt_tokens)
        traj.prompt_total += spec.new_prompt_tokens
        traj.turn_start_s = t

    def submit_first(self, tid: str, wid: int, t: float) -> None:
        """RouteTurn / Resubmit: the turn's prompt (and any kept prefix) to a colocated or prefill worker."""
        traj = self.trajs[tid]
        slot = self.by_wid.get(wid)
        if slot is None or slot.state != SERVING:  # it stopped serving before the request got there
            self.feed(lp.TurnInterrupted(t, tid, wid))
            return
        w = slot.worker
        if traj.home != slot.sid:
            self.unhome(traj)
            traj.home = slot.sid
            w.homed_ctx += traj.context
        cached = (
            traj.cached_len
            if (traj.cached_on == slot.sid and traj.cached_gen == w.gen and traj.cached_epoch == self.cache_epoch)
            else 0
        )
        if cached:
            # Prefix cache under KV pressure: running requests pin their KV; the cached prefixes of
            # the trajectories homed here share what is left (LRU over many waiting trajectories
            # keeps about that fraction of each resident).
            free_kv = w.kv_capacity - w.kv_used
            demand = max(1, w.homed_ctx)
            resident = 1.0 if demand <= free_kv else max(0.0, free_kv / demand)
            cached = min(int(cached * self.prefix_reuse * resident), traj.context)
        req = Request(
            traj,
            traj.context - cached,
            cached,
            traj.context,
            traj.turns[traj.turn].generated_tokens - traj.generated_in_turn,
            arrive_s=t,
        )
        traj.where = slot.sid
        traj.prefilled_in_turn += req.compute
        traj.prefilled_total += req.compute
        w.submit_prompt(req)
        self.kick(slot, t)

    def submit_decode(self, cmd: lp.RouteDecode, t: float) -> None:
        req = self._kv.pop(cmd.trajectory)
        slot = self.by_wid.get(cmd.worker)
        if slot is None or slot.state != SERVING:
            self.feed(lp.TurnInterrupted(t, cmd.trajectory, cmd.worker))
            return
        req.arrive_s = t
        req.traj.where = slot.sid
        slot.worker.submit_decode(req)
        self.kick(slot, t)

    def unhome(self, traj: Trajectory) -> None:
        if traj.home is not None and traj.home in self.slots:
            old = self.slots[traj.home].worker
            old.homed_ctx = max(0, old.homed_ctx - traj.context)
        traj.home = None

    def grow(self, traj: Trajectory, tokens: int) -> None:
        traj.context += tokens
        if traj.home is not None:
            self.slots[traj.home].worker.homed_ctx += tokens

    def kick(self, slot: Slot, t: float) -> None:
        w = slot.worker
        if w.seg is None:
            end = w.plan(t)
            if end is not None:
                self.push(end, EV_WAKE, slot.sid, w.version)
        else:
            end = w.interrupt(t)
            if end is not None:
                w.version += 1
                self.push(end, EV_WAKE, slot.sid, w.version)

    def on_wake(self, sid: int, version: int, t: float) -> None:
        slot = self.slots.get(sid)
        if slot is None or slot.worker.version != version:
            return
        w = slot.worker
        prefilled, done, seg = w.finish()
        n = len(w.running) + len(done)
        observe = self.observe
        hw = slot.hardware if self.mixed else ""  # engine records name their chip on a mixed pool
        if seg.kind == "decode" or (seg.kind == "prefill" and w.role is Role.COLOCATED and n):
            self._iter_sample += 1
            if seg.k >= 16 or self._iter_sample % 16 == 0:  # a sample is plenty for the A, b fit
                observe(
                    tm.decode_iteration(
                        time_s=t,
                        worker=slot.wid,
                        hardware=hw,
                        running_batch=n,
                        duration_s=seg.dt if seg.kind == "decode" else (seg.end_s - seg.t0 - seg.prefill_s) / seg.k,
                    )
                )
        if seg.kind == "prefill":
            for rec in prefill_records(seg, time_s=t, worker=slot.wid, hardware=hw):
                observe(rec)
        for req in done:
            self.turn_done(req, t, slot)
        for req in prefilled:  # prefill role: hand the KV to a decode worker
            start = max(t, w.link_free_s)
            dur = req.ctx0 * self.kv_bytes / self.link_bw(slot)
            w.link_free_s = start + dur
            req.traj.cached_on = slot.sid
            req.traj.cached_gen = w.gen
            req.traj.cached_epoch = self.cache_epoch
            req.traj.cached_len = req.ctx0
            req.traj.where = -1
            self.push(start + dur, EV_KV, req, (slot.sid, w.gen, slot.wid))
            observe(
                tm.kv_transfer(
                    time_s=start + dur,
                    worker=slot.wid,
                    hardware=hw,
                    tokens=req.ctx0,
                    kv_bytes=int(req.ctx0 * self.kv_bytes),
                    duration_s=dur,
                )
            )
        if w.seg is not None or slot.worker is not w or slot.state in (GONE, INACTIVE):
            return  # re-planned by a nested kick or taken away meanwhile
        if slot.state == DRAINING and slot.after_drain is not None and not w.running and not w.pq and not w.joinq:
            self.drained(slot, t)
            return
        end = w.plan(t)
        if end is not None:
            self.push(end, EV_WAKE, slot.sid, w.version)
        elif slot.state == DRAINING and slot.after_drain is not None:
            self.drained(slot, t)

    def on_kv(self, req: Request, src: tuple[int, int, int], t: float) -> None:
        """The KV cache arrived: the loop picks the decode worker (or re-prefills if the sender vanished)."""
        sid, gen, wid = src
        traj = req.traj
        if self.slots[sid].worker.gen != gen:
            traj.where = None
            self.feed(lp.TurnInterrupted(t, traj.tid, wid, 0, req.compute))
            return
        self._kv[traj.tid] = req
        self.feed(lp.Prefilled(t, traj.tid, wid, req.compute))
        self._kv.pop(traj.tid, None)  # not picked up: the loop re-prefills

    def credit(self, traj: Trajectory, generated: int) -> None:
        traj.generated_in_turn += generated
        traj.generated_total += generated
        self.grow(traj, generated)
        self.traj_generated += generated

    def requeue(self, req: Request, generated: int, t: float, slot: Slot) -> None:
        """An interrupted request: keep its generated prefix; the loop resumes the rest elsewhere."""
        traj = req.traj
        self.credit(traj, generated)
        traj.interruptions += 1
        traj.where = None
        wid = slot.wid if slot.wid is not None else -1
        prefilled = 0 if slot.role is Role.DECODE else req.compute  # a decode request's prefill was counted
        dec = max(0.0, t - req.join_s) if req.join_s >= 0 else 0.0
        req.join_s = -1.0
        if traj.generated_in_turn >= traj.turns[traj.turn].generated_tokens:
            self.feed(lp.TurnGenerated(t, traj.tid, wid, generated, prefilled, decode_s=dec))
            self.complete_turn(traj, t)
        else:
            self.feed(lp.TurnInterrupted(t, traj.tid, wid, generated, prefilled, decode_s=dec))

    def evict(self, slot: Slot, t: float, keep_cache: bool) -> None:
        w = slot.worker
        for req, g in w.evict(t):
            self.requeue(req, g, t, slot)
        if not keep_cache:
            w.gen += 1

    def turn_done(self, req: Request, t: float, slot: Slot) -> None:
        traj = req.traj
        self.credit(traj, req.remaining)
        if slot.role is Role.COLOCATED:
            traj.cached_on = slot.sid
            traj.cached_gen = slot.worker.gen
            traj.cached_epoch = self.cache_epoch
            traj.cached_len = traj.context
        traj.where = None
        dec = max(0.0, t - req.join_s) if req.join_s >= 0 else 0.0
        self.feed(
            lp.TurnGenerated(
                t,
                traj.tid,
                slot.wid if slot.wid is not None else -1,
                req.remaining,
                req.compute if slot.role is Role.COLOCATED else 0,
                decode_s=dec,
            )
        )
        self.complete_turn(traj, t)

    def complete_turn(self, traj: Trajectory, t: float) -> None:
        """The environment runs the turn's tool call; the last turn ends the trajectory."""
        spec = traj.turns[traj.turn]
        traj.turn += 1
        traj.generated_in_turn = 0
        traj.prefilled_in_turn = 0
        if traj.turn >= len(traj.turns):
            traj.done = True
            traj.end_s = t
            self.unhome(traj)
            self.feed(lp.EnvStepped(t, traj.tid, 0.0, True, 0.0))
            return
        traj.env_time_s += spec.env_latency_s
        self.push(t + spec.env_latency_s, EV_ENV, traj)

    def on_env(self, traj: Trajectory, t: float) -> None:
        if traj.done or self.trajs.get(traj.tid) is not traj:
            return  # aborted meanwhile
        self.begin_turn(traj, t)
        self.feed(
            lp.EnvStepped(
                t,
                traj.tid,
                traj.turns[traj.turn - 1].env_latency_s,
                False,
                observation_tokens=traj.turns[traj.turn].new_prompt_tokens,
            )
        )
