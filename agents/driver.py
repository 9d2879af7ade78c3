"""The rollout driver (one per job, the paper's Pipeline Scheduler): core's RL loop on asyncio.

`python -m agents.driver --control-plane http://cp:8000 --job NAME` (token in `PEARL_DRIVER_TOKEN`)
connects to the driver link (`/ws/driver/`), restores the loop from the control plane's checkpoint,
and runs it: environments (`agents.envs`) produce prompts and rewards, engine workers generate turns
(colocated, or prefill → KV hand-off → decode), the trainer trains each collected batch. The
control plane pushes the serving workers and the weight version (level-triggered) and answers the
loop's elastic signals by re-planning; the driver reports progress, telemetry and checkpoints.

`AsyncLoopRunner` is the asyncio clock for `controlplane.core.loop.RolloutLoop`, as the simulator's
heap is its virtual clock: events are stamped with the event loop's time and fed through the same
`Feeder`, so for the same events both drivers see the same commands.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import sys
import time
import zlib
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import orjson

from agents.dataplane import MAX_NEW_TOKENS
from controlplane.core import driver_link as dl
from controlplane.core import loop as lp
from controlplane.core.loop import Command, Event, Feeder, RolloutLoop
from controlplane.core.context import Signal
from controlplane.core.state import Configuration, Mode, Role

log = logging.getLogger("pearl.driver")
# How often the loop's checkpoint may be written to the control plane's database at most: a restarted
# driver redoes at most this much of its trajectories' progress (turns resume from kept prefixes).
CHECKPOINT_EVERY_S = 2.0


class AsyncLoopRunner:
    """Feeds a RolloutLoop from asyncio callbacks and tasks; commands go to `dispatch` in order."""

    def __init__(self, loop: RolloutLoop, dispatch: Callable[[Command], None], *, elapsed_s: float = 0.0,
                 scale: float = 1.0) -> None:
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


# ============================================================================ the driver
@dataclass
class Episode:
    """A trajectory's runtime side: its environment, the context so far and the turn in progress."""

    tid: str
    step: int
    group: int
    env: Any
    context: list[int] = field(default_factory=list)
    budget: int = 16  # response tokens allowed this turn
    temperature: float = 1.0
    kept: list[int] = field(default_factory=list)  # tokens of this turn generated before an interruption
    kept_logprobs: list[float] = field(default_factory=list)
    version: int = 0  # oldest weights that produced any of its tokens
    new_tokens: int = 0  # prompt tokens appended for this turn (ΔL)
    samples: list[dict[str, Any]] = field(default_factory=list)  # one per finished turn
    pd: tuple[int, Any] | None = None  # (prefill worker, PrefillResult) while the KV waits for a decode worker
    attempt: int = 0
    task: asyncio.Task[None] | None = None
    reward: float = 0.0
    info: dict[str, float] = field(default_factory=dict)


class RolloutDriver:
    """Carries out the loop's commands against environments, engine workers, the trainer and the link."""

    def __init__(self, job: dl.JobView, *, link: "ControlLink", token: str, time_factor: float = 1.0,
                 checkpoint: dict[str, Any] | None = None, http: Any = None) -> None:
        self.job = job
        self.link = link
        self.token = token
        self.time_factor = time_factor
        self.http = http
        cfg = lp.LoopConfig(batch_size=job.batch_size, group_size=job.group_size, max_staleness=job.max_staleness,
                            return_deadline_s=job.return_deadline_s, job=job.name)
        self.loop = RolloutLoop.restore(cfg, checkpoint) if checkpoint else RolloutLoop(cfg)
        # the loop's times (a step's start, a trajectory's turns) are seconds since the job's loop first
        # started; a restarted driver goes on from the wall-clock epoch kept in the checkpoint
        self.epoch = float((checkpoint or {}).get("clock_epoch", time.time()))
        self.runner: AsyncLoopRunner | None = None
        self.episodes: dict[str, Episode] = {}
        self.workers: dict[int, dl.WorkerView] = {}
        self.cluster: dl.ClusterView | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        self.records: list[dict[str, Any]] = []  # telemetry records not yet sent
        self.waiting_return = False
        self.waiting_version: int | None = None
        self.pending_train: lp.Train | None = None
        self.done = asyncio.Event()
        self._checkpointed: dict[str, Any] | None = None
        self._decision_seen = -1
        self._checkpoint_sent_at = float("-inf")
        self._last_progress: tuple[int, int] | None = None
        self.trained: list[dict[str, Any]] = []  # per update: step, loss, reward, correct (for tests / logs)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        # an emulated job's engines, environments and trainer run `time_factor` times real time: its loop
        # clock (turn and step times, telemetry) is in model seconds, as the profile and the simulator are
        scale = self.time_factor if self.job.engine == "emulated" else 1.0
        self.runner = AsyncLoopRunner(self.loop, lp.Dispatcher(self), elapsed_s=max(0.0, time.time() - self.epoch) / scale,
                                      scale=scale)
        flusher = asyncio.create_task(self._flush_forever())
        if self.cluster is not None:
            self.on_cluster(self.cluster)
        self.runner.feed(lp.Start(self.runner.now()))
        try:
            await self.done.wait()
        finally:
            flusher.cancel()
            for t in list(self.tasks):
                t.cancel()
            await self._flush()

    def stop(self) -> None:
        self.done.set()

    def _spawn(self, coro: Awaitable[Any], name: str = "") -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)

        def finished(t: asyncio.Task[Any]) -> None:
            self.tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("driver task %s failed: %r", name, t.exception())
        task.add_done_callback(finished)
        return task

    def _now(self) -> float:
        assert self.runner is not None
        return self.runner.now()

    def _feed(self, ev: Event) -> None:
        assert self.runner is not None
        self.runner.feed(ev)

    # ------------------------------------------------------------------ what the control plane pushes
    def on_cluster(self, view: dl.ClusterView) -> None:
        """The serving set changed (or the weights, or the return): tell the loop what differs."""
        self.cluster = view
        if self.runner is None:
            return
        now = self._now()
        new = {w.worker: w for w in view.workers}
        if set(new) != set(self.workers) or view.weight_version != getattr(self, "_seen_version", -1):
            self._seen_version = view.weight_version
            log.info("cluster: workers %s, weights v%d, training %s, borrowed %d", sorted((w, str(v.role)) for w, v in new.items()),
                     view.weight_version, view.training_active, view.borrowed)
        for wid, w in self.workers.items():
            if wid not in new or new[wid].role != w.role or new[wid].endpoint != w.endpoint:
                self._feed(lp.WorkerGone(now, wid, "stop"))
        for wid, w in new.items():
            old = self.workers.get(wid)
            if old is None or old.role != w.role or old.endpoint != w.endpoint:
                self._feed(lp.WorkerReady(now, wid, Role(w.role), overlap=w.overlap, gpus=w.gpus))
        self.workers = new
        if self.waiting_return and view.training_active and view.borrowed == 0:
            self.waiting_return = False
            self._feed(lp.ReturnConfirmed(now))
        if self.waiting_version is not None and view.weight_version >= self.waiting_version:
            v, self.waiting_version = self.waiting_version, None
            self._feed(lp.WeightsPublished(now, v))
        d = view.decision
        if d is not None and d.id != self._decision_seen:
            self._decision_seen = d.id
            try:
                config: Configuration | None = Configuration(Mode(d.mode), d.n_prefill, d.n_decode, d.n_colocated)
            except ValueError:
                config = None
            signal = Signal(d.signal) if d.signal in Signal._value2member_map_ else Signal.PERIODIC
            self._feed(lp.Decided(now, signal, config if config is not None and config.total > 0 else None,
                                  d.predicted_makespan_s or None, d.reconfigured))
        if view.stopped:
            self.stop()

    def on_update_granted(self, step: int) -> None:
        if self.pending_train is not None and self.pending_train.step == step:
            cmd, self.pending_train = self.pending_train, None
            self._spawn(self._train(cmd), f"train {step}")

    # ------------------------------------------------------------------ commands (lp.CommandSink)
    def route_turn(self, cmd: lp.RouteTurn) -> None:
        self._start_turn(cmd.trajectory, cmd.worker, cmd.min_weight_version)

    def resubmit(self, cmd: lp.Resubmit) -> None:
        self._start_turn(cmd.trajectory, cmd.worker, cmd.min_weight_version)

    def route_decode(self, cmd: lp.RouteDecode) -> None:
        ep = self.episodes.get(cmd.trajectory)
        if ep is not None:
            ep.task = self._spawn(self._decode(ep, cmd), f"decode {cmd.trajectory}")

    def telemetry(self, cmd: lp.Telemetry) -> None:
        self.records.append(cmd.record.to_json())

    def progress(self, cmd: lp.Progress) -> None:
        """Progress and the checkpoint are reported by the flusher, from the loop's state."""

    def emit_signal(self, cmd: lp.EmitSignal) -> None:
        log.info("signal %s (R=%d)", cmd.signal, cmd.remaining)
        self._spawn(self.link.send(dl.SignalReport(cmd.signal, cmd.remaining)), "signal")

    def start_step(self, cmd: lp.StartStep) -> None:
        log.info("step %d starts with weights v%d (%d trajectories)", cmd.step, cmd.weight_version, len(cmd.trajectories))
        for ref in cmd.trajectories:
            self._start_episode(ref, cmd.step)

    def return_overlap(self, cmd: lp.ReturnOverlap) -> None:
        self.waiting_return = True
        if self.cluster is not None:
            self.on_cluster(self.cluster)

    def train(self, cmd: lp.Train) -> None:
        log.info("update for step %d requested", cmd.step)
        self.pending_train = cmd
        self._spawn(self.link.send(dl.UpdateRequest(cmd.step)), "update request")

    def publish_weights(self, cmd: lp.PublishWeights) -> None:
        self.waiting_version = cmd.version
        if self.cluster is not None:
            self.on_cluster(self.cluster)

    def abort(self, cmd: lp.Abort) -> None:
        ep = self.episodes.pop(cmd.trajectory, None)
        if ep is not None and ep.task is not None:
            ep.task.cancel()
        if cmd.replacement is not None:
            self._start_episode(cmd.replacement, int(cmd.trajectory.split("-")[0][1:]))

    # ------------------------------------------------------------------ environments
    def _task_id(self, step: int, group: int) -> int:
        return zlib.crc32(f"{self.job.seed}-{step}-{group}".encode())

    def _start_episode(self, ref: lp.TrajectoryRef, step: int) -> None:
        from agents.envs import make_env

        env = make_env(self.job.environment, task=self._task_id(step, ref.group), member=ref.index % self.job.group_size,
                       seed=self.job.seed, time_factor=self.time_factor, max_tokens=self.job.max_trajectory_tokens,
                       group_size=self.job.group_size)
        ep = Episode(ref.trajectory, step, ref.group, env, temperature=getattr(env, "temperature", 1.0))
        self.episodes[ref.trajectory] = ep
        ep.task = self._spawn(self._reset(ep), f"reset {ep.tid}")

    async def _reset(self, ep: Episode) -> None:
        turn = await ep.env.reset()
        ep.context = list(turn.observation)
        ep.budget = turn.max_tokens
        ep.new_tokens = len(turn.observation)
        ep.version = self.loop.version
        self._feed(lp.TrajectoryStarted(self._now(), ep.tid, prompt_tokens=len(turn.observation)))

    async def _env_step(self, ep: Episode, response: list[int], logprobs: list[float], version: int) -> None:
        ep.samples.append({"prompt_tokens": list(ep.context), "completion_tokens": response, "logprobs": logprobs,
                           "weight_version": version})
        t0 = self._now()
        turn = await ep.env.step(response)
        env_s = self._now() - t0
        ep.context += response + list(turn.observation)
        ep.budget = max(1, turn.max_tokens)
        ep.new_tokens = len(turn.observation)
        if turn.done:
            ep.reward, ep.info = turn.reward, dict(turn.info)
            # the samples reach the trainer before the loop counts the trajectory as finished: whatever
            # restarts afterwards, a finished trajectory's samples are kept for its step's update
            await self._trainer_post("samples", {"samples": self._samples(ep), "train": False, "step": ep.step})
        self._feed(lp.EnvStepped(self._now(), ep.tid, env_s, turn.done, turn.reward,
                                 observation_tokens=len(turn.observation)))

    def _samples(self, ep: Episode) -> list[dict[str, Any]]:
        """One sample per turn, each with the trajectory's reward (its turns share one advantage). An
        emulated model's samples carry their size instead of their synthetic tokens."""
        counts_only = self.job.engine == "emulated" and self.job.model != "tiny"
        out = []
        for s in ep.samples:
            sample = {**s, "group": f"{ep.step}-{ep.group}", "reward": ep.reward, "trajectory": ep.tid,
                      "temperature": ep.temperature, "weight_version": min(s["weight_version"], ep.version)}
            if counts_only:
                sample |= {"token_count": max(1, len(s["prompt_tokens"]) + len(s["completion_tokens"])), "prompt_tokens": [],
                           "completion_tokens": [], "logprobs": []}
            out.append(sample)
        return out

    # ------------------------------------------------------------------ engines
    def _sampling(self, ep: Episode, budget: int) -> dict[str, Any]:
        ep.attempt += 1
        seed = zlib.crc32(f"{self.job.seed}-{ep.tid}-{len(ep.samples)}-{ep.attempt}".encode())
        # within the data plane's bound: a request over it is refused (400) however often it is resent
        return {"max_tokens": max(1, min(budget, MAX_NEW_TOKENS)), "temperature": ep.temperature, "seed": seed,
                "stop_at_eos": False}

    def _start_turn(self, tid: str, wid: int, min_version: int) -> None:
        ep = self.episodes.get(tid)
        if ep is None:
            return
        ep.task = self._spawn(self._first(ep, wid, min_version), f"turn {tid}")

    async def _first(self, ep: Episode, wid: int, min_version: int) -> None:
        w = self.workers.get(wid)
        if w is None:
            self._feed(lp.TurnInterrupted(self._now(), ep.tid, wid))
            return
        body = {"request_id": f"{ep.tid}-{len(ep.samples)}-{ep.attempt}", "prompt_tokens": ep.context + ep.kept,
                "sampling": self._sampling(ep, ep.budget - len(ep.kept)), "min_weight_version": min_version,
                "job": self.job.name}
        prefilled = ep.new_tokens if not ep.kept else len(ep.context) + len(ep.kept)
        try:
            if w.role is Role.PREFILL:
                res = await self._call(w, "prefill", body)
                ep.pd = (wid, res)
                self._feed(lp.Prefilled(self._now(), ep.tid, wid, prefilled_tokens=prefilled))
                return
            res = await self._call(w, "generate", body)
        except WorkerUnavailable as exc:
            log.info("turn of %s on worker %s interrupted: %s", ep.tid, wid, exc)
            await asyncio.sleep(0.2)  # a worker that refuses (weights being pulled, draining) is asked again later
            self._feed(lp.TurnInterrupted(self._now(), ep.tid, wid))
            return
        await self._generated(ep, wid, res, prefilled)

    async def _decode(self, ep: Episode, cmd: lp.RouteDecode) -> None:
        w = self.workers.get(cmd.worker)
        src = self.workers.get(cmd.source)
        if w is None or ep.pd is None or ep.pd[0] != cmd.source:
            self._feed(lp.TurnInterrupted(self._now(), ep.tid, cmd.worker))
            return
        pre = ep.pd[1]
        ep.pd = None
        body = {"request_id": f"{ep.tid}-{len(ep.samples)}-{ep.attempt}-d",
                "kv_url": src.endpoint if src is not None else "", "handle": pre["handle"], "kv_token": pre["kv_token"],
                "sampling": self._sampling(ep, ep.budget - len(ep.kept)), "min_weight_version": cmd.min_weight_version,
                "job": self.job.name}
        try:
            res = await self._call(w, "decode", body)
        except WorkerUnavailable as exc:
            log.info("decode of %s on worker %s interrupted: %s", ep.tid, cmd.worker, exc)
            await asyncio.sleep(0.2)
            self._feed(lp.TurnInterrupted(self._now(), ep.tid, cmd.worker))
            return
        await self._generated(ep, cmd.worker, res, 0)

    async def _generated(self, ep: Episode, wid: int, res: dict[str, Any], prefilled: int) -> None:
        tokens, logprobs = list(res["tokens"]), list(res["logprobs"])
        ep.version = min(ep.version, int(res.get("weight_version", ep.version)))
        if res.get("finish_reason") == "abort":  # drained or returned: keep the prefix, resume elsewhere
            ep.kept += tokens
            ep.kept_logprobs += logprobs
            self._feed(lp.TurnInterrupted(self._now(), ep.tid, wid, generated_tokens=len(tokens), prefilled_tokens=prefilled))
            return
        response, lps = ep.kept + tokens, ep.kept_logprobs + logprobs
        ep.kept, ep.kept_logprobs = [], []
        self._feed(lp.TurnGenerated(self._now(), ep.tid, wid, len(tokens), prefilled_tokens=prefilled,
                                    weight_version=int(res.get("weight_version", 0))))
        await self._env_step(ep, response, lps, ep.version)

    async def _call(self, w: dl.WorkerView, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        from aiohttp import ClientError

        try:  # orjson: a turn's body carries its whole context as token ids (tens of thousands)
            async with self.http.post(f"{w.endpoint}/{verb}", data=orjson.dumps(body),
                                      headers={"Authorization": f"Bearer {self.token}",
                                               "Content-Type": "application/json"}) as resp:
                data = orjson.loads(await resp.read())
                if resp.status != 200:
                    raise WorkerUnavailable(f"{w.endpoint}/{verb}: HTTP {resp.status}: {str(data)[:200]}")
                return data
        except (ClientError, asyncio.TimeoutError, OSError, orjson.JSONDecodeError) as exc:
            raise WorkerUnavailable(f"{w.endpoint}/{verb}: {exc!r}") from None

    # ------------------------------------------------------------------ training
    async def _train(self, cmd: lp.Train) -> None:
        """The update of the batch: its trajectories' samples are at the trainer already; training a
        step is idempotent there (a restarted driver asking again gets the version it published)."""
        tids = [t for g in cmd.groups for t in g]
        res = await self._trainer_post("step", {"step": cmd.step, "trajectories": tids,
                                                "training_gpus": self.job.training_gpus})
        stats = (res or {}).get("step") or {}
        if (res or {}).get("missing"):
            log.error("the trainer lacked the samples of %d trajectories of step %d", len(res["missing"]), cmd.step)
        for tid in tids:
            self.episodes.pop(tid, None)
        loss = float(stats.get("loss", 0.0))
        self.trained.append({"step": cmd.step, "loss": loss, "reward": float(stats.get("mean_reward", 0.0)),
                             "samples": int(stats.get("accepted", 0))})
        log.info("step %d trained: version %s, loss %.4f, mean reward %.3f", cmd.step, (res or {}).get("version"), loss,
                 float(stats.get("mean_reward", 0.0)))
        self._feed(lp.TrainingDone(self._now(), cmd.step, loss=loss, missing=len((res or {}).get("missing") or [])))

    async def _trainer_post(self, verb: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST to the job's trainer, waiting for one (a restarted trainer comes back on a new endpoint,
        which the next cluster view carries)."""
        from aiohttp import ClientError

        for attempt in range(600):
            trainer = self.cluster.trainer if self.cluster else ""
            if trainer:
                try:
                    async with self.http.post(f"{trainer}/{verb}", json=body,
                                              headers={"Authorization": f"Bearer {self.token}"}) as resp:
                        if resp.status == 200:
                            return await resp.json()
                        text = await resp.text()
                    if resp.status not in (401, 502, 503):  # 401: a port reused by another process
                        raise RuntimeError(f"trainer /{verb}: HTTP {resp.status}: {text[:500]}")
                except (ClientError, OSError, asyncio.TimeoutError) as exc:
                    log.warning("trainer /%s unreachable (%r); retrying", verb, exc)
            await asyncio.sleep(min(2.0, 0.1 * (attempt + 1)))
        raise RuntimeError(f"trainer /{verb}: no trainer answered")

    # ------------------------------------------------------------------ reports
    async def _flush(self) -> None:
        if self.records:
            records, self.records = self.records, []
            for i in range(0, len(records), dl.MAX_RECORDS):
                await self.link.send(dl.TelemetryReport(records[i:i + dl.MAX_RECORDS]))
        loop = self.loop
        progress = (max(0, loop.step), loop.remaining)
        if progress != self._last_progress and loop.step >= 0:
            self._last_progress = progress
            await self.link.send(dl.ProgressReport(*progress))
        if time.monotonic() - self._checkpoint_sent_at >= CHECKPOINT_EVERY_S:
            state = loop.checkpoint() | {"clock_epoch": self.epoch}
            if state != self._checkpointed:  # level-triggered: whatever changed since the last one that was sent
                await self.link.send(dl.CheckpointReport(state))
                self._checkpointed, self._checkpoint_sent_at = state, time.monotonic()

    async def _flush_forever(self, every_s: float = 0.5) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self._flush()
            except Exception as exc:  # the link reconnects; reports are level-triggered and resent
                log.warning("driver: report failed: %r", exc)


class WorkerUnavailable(RuntimeError):
    """The worker refused or is gone: the turn is interrupted and routed again."""


# ============================================================================ the link
class ControlLink:
    """The driver's side of `/ws/driver/`: reconnects with backoff, resends nothing it need not
    (reports are level-triggered: the next progress and checkpoint supersede a lost one)."""

    def __init__(self, url: str, job: str, token: str, http: Any) -> None:
        base = url.rstrip("/")
        self.ws_url = ("wss://" if base.startswith("https://") else "ws://") + base.split("://", 1)[1] + "/ws/driver/"
        self.job = job
        self.token = token
        self.http = http
        self.ws: Any = None
        self.incarnation = secrets.token_hex(8)
        self.welcome: asyncio.Future[dl.Welcome] = asyncio.get_running_loop().create_future()
        self.driver: RolloutDriver | None = None
        self._ready = asyncio.Event()

    async def send(self, msg: Any) -> None:
        await self._ready.wait()
        await self.ws.send_str(json.dumps(dl.dump(msg), default=str))

    async def run_forever(self) -> None:
        backoff = 0.5
        while True:
            try:
                async with self.http.ws_connect(self.ws_url, headers={"Authorization": f"Bearer {self.token}"},
                                                heartbeat=30, max_msg_size=dl.MAX_CHECKPOINT_BYTES * 2) as ws:
                    self.ws = ws
                    await ws.send_str(json.dumps(dl.dump(dl.Hello(self.job, self.incarnation))))
                    backoff = 0.5
                    async for raw in ws:
                        self._receive(json.loads(raw.data))
            except Exception as exc:
                log.warning("driver link: %r; reconnecting in %.1f s", exc, backoff)
            self._ready.clear()
            self.ws = None
            if self.driver is not None and self.driver.done.is_set():
                return
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    def _receive(self, data: Any) -> None:
        msg = dl.parse_control_message(data)
        if isinstance(msg, dl.Welcome):
            self._ready.set()
            if not self.welcome.done():
                self.welcome.set_result(msg)
            elif self.driver is not None:
                self.driver.on_cluster(msg.cluster)
        elif isinstance(msg, dl.ClusterView):
            if self.driver is not None:
                self.driver.on_cluster(msg)
        elif isinstance(msg, dl.UpdateGranted):
            if self.driver is not None:
                self.driver.on_update_granted(msg.step)
        elif isinstance(msg, dl.ErrorReply):
            log.warning("driver link error: %s %s %s", msg.error, msg.field, msg.detail)
            if msg.error == "not_returned" and self.driver is not None and self.driver.pending_train is not None:
                step = self.driver.pending_train.step  # ask again once the next push shows the return
                asyncio.get_running_loop().call_later(0.5, lambda: asyncio.ensure_future(self.send(dl.UpdateRequest(step))))


async def run_driver(url: str, job: str, token: str, *, time_factor: float = 1.0) -> RolloutDriver:
    from aiohttp import ClientSession, ClientTimeout

    async with ClientSession(timeout=ClientTimeout(total=600)) as http:
        link = ControlLink(url, job, token, http)
        link_task = asyncio.create_task(link.run_forever())
        welcome = await link.welcome
        driver = RolloutDriver(welcome.job, link=link, token=welcome.dataplane_token, time_factor=time_factor,
                               checkpoint=welcome.checkpoint or None, http=http)
        driver.cluster = welcome.cluster
        link.driver = driver
        try:
            await driver.run()
        finally:
            link_task.cancel()
        return driver


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m agents.driver", description=__doc__.split("\n\n")[0])
    p.add_argument("--control-plane", required=True, help="http(s)://host:port of the control plane")
    p.add_argument("--job", required=True)
    p.add_argument("--time-factor", type=float, default=1.0, help="scale of environment (tool) latencies")
    # accepted so an agent can spawn the driver like a worker
    for extra in ("--role", "--worker-id", "--engine", "--hardware", "--state-dir", "--model"):
        p.add_argument(extra, default=None)
    args = p.parse_args(argv)
    token = os.environ.get("PEARL_DRIVER_TOKEN", "")
    if not token:
        sys.exit("PEARL_DRIVER_TOKEN is not set: the driver link needs the job's driver token")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s driver %(levelname)s %(message)s")
    from agents.process import die_with_parent

    die_with_parent()  # an agent's driver stops with its agent (the restarted agent starts it again)
    started = time.monotonic()
    asyncio.run(run_driver(args.control_plane, args.job, token, time_factor=args.time_factor))
    log.info("driver for %s stopped after %.0f s", args.job, time.monotonic() - started)


if __name__ == "__main__":
    main()
