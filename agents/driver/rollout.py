"""The rollout driver proper: core's RL loop carried out against the job's workers, trainer and link.

`RolloutDriver` is the live `CommandSink` of the loop (`controlplane.core.loop.sink`): it turns what the
control plane pushes (the serving workers, the weight version, the return, the decisions) into the loop's
events, carries out each command (episodes: `agents.driver.episodes`; the update: the trainer; signals:
the link), and reports progress, telemetry and checkpoints, level-triggered.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aiohttp import ClientSession

from agents import dataplane as dp
from agents.crash import crash_point
from agents.driver.clock import AsyncLoopRunner
from agents.driver.episodes import Episode, EpisodeRunner
from agents.driver.journal import JournaledTrajectory, RecordJournal, TurnJournal
from agents.worker_client import UNREACHABLE, TrainerClient, WorkerCallError, WorkerClient
from controlplane.core import driver_link as dl
from controlplane.core import loop as lp
from controlplane.core.context import Signal
from controlplane.core.loop import Event, RolloutLoop
from controlplane.core.loop.state import DRIVER_RESTARTED
from controlplane.core.state import Configuration, Mode, Role

log = logging.getLogger("pearl.driver")
T = TypeVar("T")
# How often the loop's checkpoint may be written to the control plane's database at most: a restarted
# driver redoes at most this much of its trajectories' progress (turns resume from kept prefixes).
CHECKPOINT_EVERY_S = 2.0


class Reports(Protocol):
    """Where the driver's reports go: the driver link (`agents.driver.link.ControlLink`)."""

    async def send(self, msg: Any) -> None: ...


class RolloutDriver(EpisodeRunner):
    """Carries out the loop's commands against environments, engine workers, the trainer and the link."""

    def __init__(
        self,
        job: dl.JobView,
        *,
        link: Reports,
        token: str,
        time_factor: float = 1.0,
        checkpoint: dict[str, Any] | None = None,
        http: ClientSession | None = None,
        state_dir: Path | None = None,
    ) -> None:
        self.job = job
        self.link = link
        self.token = token
        self.time_factor = time_factor
        # an emulated job's engines, environments and trainer run `time_factor` times real time: its loop
        # clock (turn and step times, telemetry) is in model seconds, as the profile and the simulator are
        self.scale = time_factor if job.engine == "emulated" else 1.0
        self.http = http
        cfg = lp.LoopConfig(
            batch_size=job.batch_size,
            group_size=job.group_size,
            max_staleness=job.max_staleness,
            # the return is the control plane's and the agents' (real seconds, whatever the engines emulate):
            # its deadline in the loop's clock
            return_deadline_s=job.return_deadline_s / self.scale,
            job=job.name,
            dispatch=job.dispatch,
            dispatch_cap=job.dispatch_cap,
        )
        self.loop = RolloutLoop.restore(cfg, checkpoint) if checkpoint else RolloutLoop(cfg)
        self.restored = bool(checkpoint)
        # the loop's times (a step's start, a trajectory's turns) are seconds since the job's loop first
        # started; a restarted driver goes on from the wall-clock epoch kept in the checkpoint
        self.epoch = float((checkpoint or {}).get("clock_epoch", time.time()))
        self.runner: AsyncLoopRunner | None = None
        self.episodes: dict[str, Episode] = {}
        self.workers: dict[int, dl.RoutableWorker] = {}
        self.clients: dict[str, WorkerClient] = {}
        self.cluster: dl.ClusterView | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        self.records: list[dict[str, Any]] = []  # telemetry records not yet sent
        self.waiting_return = False
        self.waiting_version: int | None = None
        self.pending_train: lp.Train | None = None
        self.training_signal: dl.SignalReport | None = None  # the last Training Begin / Finished sent
        self.done = asyncio.Event()
        self._checkpointed: dict[str, Any] | None = None
        self._decision_seen = -1
        self._checkpoint_sent_at = float("-inf")
        self._last_progress: tuple[int, int] | None = None
        self._unreported: list[tuple[int, Any]] = []  # (step, TrajectorySummary) not yet sent
        self._trained_reports: list[dl.TrainedReport] = []  # sent once the trajectories' own reports are
        # a restarted driver's recovery: the finished trajectories the trainer holds (durable before the old
        # driver counted them), each taken as finished once instead of run again; and the replacements of
        # trajectories the old driver left unfinished (their records say `rerun`)
        self.recovered: dict[str, dp.BufferedTrajectory] = {}
        self.reruns: set[str] = set()
        # the turn journal (`agents.driver.journal`) of a built-in environment's trajectories, in the driver's
        # state directory; a restarted driver continues what its predecessor journaled (records `resumed`)
        agent_job = job.environment == "agent"
        self.journal = TurnJournal(state_dir / "journal") if state_dir is not None and not agent_job else None
        # and the records of its finished trajectories not reported yet (`RecordJournal`), so that the audit
        # lists a trajectory that became durable at the trainer just before a crash
        self.kept = RecordJournal(state_dir / "records") if state_dir is not None and not agent_job else None
        self.journaled: dict[str, JournaledTrajectory] = {}
        self.resumed: set[str] = set()
        self.ended: dict[str, tuple[int, dict[str, Any]]] = {}  # a built-in job's ended trajectories' records
        self.trained: list[dict[str, Any]] = []  # per update: step, loss, reward, correct (for tests / logs)
        if job.environment == "agent" and job.agent:  # bring your own agent: the job's gateway and agent runner
            from agents.envs.agent import configure

            configure({"model": job.model, **job.agent})

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> None:
        self.runner = AsyncLoopRunner(
            self.loop, lp.Dispatcher(self), elapsed_s=max(0.0, time.time() - self.epoch) / self.scale, scale=self.scale
        )
        flusher = asyncio.create_task(self._flush_forever())
        if self.cluster is not None:
            self.on_cluster(self.cluster)
        if self.restored:
            await self._recover()
            self._reassert_training_state()
        elif self.journal is not None:  # a job starting afresh continues nothing a driver before it left
            self.journal.prune(set())
        self.runner.feed(lp.Start(self.runner.now()))
        try:
            await self.done.wait()
        finally:
            flusher.cancel()
            for t in list(self.tasks):
                t.cancel()
            for ep in list(self.episodes.values()):
                await ep.env.aclose("the job stopped")
            await self._flush()

    def stop(self) -> None:
        self.done.set()

    async def _recover(self) -> None:
        """Before a restored loop resumes: ask the trainer which finished trajectories it holds for the steps
        not trained yet, and feed each one the loop still has live as `TrajectoryRecovered` (finished, not
        run again); the rest of them are recovered if the loop starts them again under their ids (a step the
        checkpoint did not show started, a replacement it did not show made). Without an answer the loop
        resumes as before: every unfinished trajectory reruns.

        Then the turn journal: an unfinished trajectory the old driver journaled continues from its last
        finished turn when the loop makes its replacement (`abort`, DRIVER_RESTARTED) or makes it again under
        its id (`_begin`); the others rerun from their prompt. An agent job's trajectories always rerun: their
        state is the agent process's, which died with the driver (`AgentEnvironment`)."""
        self._load_journal()
        try:
            held = await self._trainer_call("samples", lambda trainer: trainer.buffered())
        except RuntimeError as exc:
            log.error("resumed without recovery (the trainer did not list its samples): %s", exc)
            return
        self.recovered = {b.trajectory: b for b in held.trajectories if b.step >= self.loop.trained_next}
        self._report_kept(set(self.recovered))
        for tid in set(self.journaled) & set(self.recovered):  # finished after all: the trainer's copy wins
            self.journaled.pop(tid)
            self._journal_remove(tid)
        live = [tid for tid in self.loop.trajs if tid in self.recovered]
        for tid in live:
            self._recover_one(tid)
        log.info("resumed: %d finished trajectories recovered (%d held)", len(live), len(held.trajectories))

    def _report_kept(self, held: set[str]) -> None:
        """The records the old driver kept but had not reported: those of trajectories the trainer holds are
        reported now (they finished before the crash; the audit lists them), the others are dropped (their
        samples never reached the trainer: they run again and report their own)."""
        if self.kept is None:
            return
        kept = self.kept.load()
        for tid, (step, record) in kept.items():
            if tid in held:
                self.ended[tid] = (step, record)
            else:
                self.kept.drop(tid)
        log.info("resumed: %d kept records reported again", sum(1 for t in kept if t in held))

    def _load_journal(self) -> None:
        """What the old driver journaled of the steps not trained yet (the rest is removed)."""
        if self.journal is None:
            return
        loaded = self.journal.load()
        self.journaled = {t: j for t, j in loaded.items() if j.step >= self.loop.trained_next and j.turns}
        self.journal.prune(set(self.journaled))
        log.info("resumed: %d trajectories journaled with finished turns", len(self.journaled))

    def _journal_remove(self, tid: str) -> None:
        if self.journal is not None:
            self.journal.remove(tid)

    def _recover_one(self, tid: str) -> None:
        b = self.recovered.pop(tid)
        self._feed(lp.TrajectoryRecovered(self._now(), tid, b.reward, b.weight_version, turns=b.turns))

    def _begin(self, ref: lp.TrajectoryRef, step: int, lost: str | None = None) -> bool:
        """A trajectory the loop made (`lost`: the old driver's trajectory it replaces): recovered if the
        trainer holds it finished, resumed if the old driver journaled it (or what it replaces) with finished
        turns, else its episode starts from its prompt. True if it did not start from its prompt."""
        if ref.trajectory in self.recovered:
            log.info("%s finished before the restart (its samples are at the trainer): recovered", ref.trajectory)
            self._recover_one(ref.trajectory)
            return True
        j = self.journaled.pop(lost or ref.trajectory, None)
        if j is not None and j.step == step and self._resume_episode(ref, step, j):
            self.resumed.add(ref.trajectory)
            return True
        if j is not None:
            self._journal_remove(j.trajectory)
        self._start_episode(ref, step)
        return False

    def _reassert_training_state(self) -> None:
        """A restored loop says again where its trainer handshake is, before anything it resumes asks for.

        The control plane takes signals at once but the checkpoint every CHECKPOINT_EVERY_S, so after a
        crash its job may be past the checkpoint (a Training Finished taken, the checkpoint still mid-update)
        or behind it. The restored loop's handshake is the truth: Training Begin while it is returning,
        training or publishing (an update asked for is granted only after it), else Training Finished. Both
        are idempotent at the control plane (`progress.report_signal`); it is also what a lost socket
        resends (`resend_unacknowledged`). Without it the restarted driver of issue 34 asked for its update
        twice a second for good, each refused for want of a Training Begin."""
        signal = Signal.TRAINING_BEGIN if self.loop.training_active else Signal.TRAINING_FINISHED
        log.info("resumed: training state %s (%s)", self.loop.trainer, signal)
        self.emit_signal(lp.EmitSignal(signal, self.loop.remaining))

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
            log.info(
                "cluster: workers %s, weights v%d, training %s, borrowed %d",
                sorted((w, str(v.role)) for w, v in new.items()),
                view.weight_version,
                view.training_active,
                view.borrowed,
            )
        for wid, w in self.workers.items():
            if wid not in new or new[wid].role != w.role or new[wid].endpoint != w.endpoint:
                self._feed(lp.WorkerGone(now, wid, "stop"))
        for wid, w in new.items():
            old = self.workers.get(wid)
            if old is None or old.role != w.role or old.endpoint != w.endpoint:
                self._feed(lp.WorkerReady(now, wid, Role(w.role), overlap=w.overlap, gpus=w.gpus, rate=w.rate))
        self.workers = new
        if len(self.clients) > len(new):  # clients of endpoints gone (a restarted worker serves on a new port)
            live = {w.endpoint for w in new.values()}
            self.clients = {e: c for e, c in self.clients.items() if e in live}
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
            self._feed(
                lp.Decided(
                    now,
                    signal,
                    config if config is not None and config.total > 0 else None,
                    d.predicted_makespan_s or None,
                    d.reconfigured,
                )
            )
        if view.stopped:
            self.stop()

    def resend_unacknowledged(self) -> None:
        """Resend what a dead socket (or a control plane that lost its database) may have swallowed and
        no level-triggered report carries: the training state's last signal, then an update request not
        granted yet. Both are idempotent at the control plane; without them a Training Begin or an update
        request sent into a partition the socket had not noticed yet left the step waiting for good
        (seen in tests/multihost)."""
        resend: list[Any] = [] if self.training_signal is None else [self.training_signal]
        if self.pending_train is not None:
            resend.append(dl.UpdateRequest(self.pending_train.step))
        if resend:
            self._spawn(self._send_in_order(resend), "resend after reconnect")

    async def _send_in_order(self, msgs: list[Any]) -> None:
        for msg in msgs:
            await self.link.send(msg)

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
        report = dl.SignalReport(cmd.signal, cmd.remaining)
        if cmd.signal == Signal.TRAINING_BEGIN:
            crash_point("driver.before_training_begin")
        if cmd.signal in (Signal.TRAINING_BEGIN, Signal.TRAINING_FINISHED):
            self.training_signal = report
        self._spawn(self.link.send(report), "signal")

    def start_step(self, cmd: lp.StartStep) -> None:
        log.info(
            "step %d starts with weights v%d (%d trajectories)", cmd.step, cmd.weight_version, len(cmd.trajectories)
        )
        for ref in cmd.trajectories:
            self._begin(ref, cmd.step)
        done = self.loop.trained_next  # a step left without an update (nothing to train) sends no Train: its
        gone: dict[int, list[str]] = {}
        for tid in [t for t, ep in self.episodes.items() if ep.step < done and t not in self.loop.trajs]:
            gone.setdefault(self.episodes.pop(tid).step, []).append(tid)  # let go here, not by `_train`
        for step, tids in gone.items():  # their groups were dropped: no update took them
            self._audit_trained(step, self.loop.version, [], tids)

    def return_overlap(self, cmd: lp.ReturnOverlap) -> None:
        self.waiting_return = True
        if self.cluster is not None:
            self.on_cluster(self.cluster)

    def train(self, cmd: lp.Train) -> None:
        log.info(
            "update for step %d requested (%d groups; %d trajectories of groups too small dropped)",
            cmd.step,
            len(cmd.groups),
            len(cmd.dropped),
        )
        self.pending_train = cmd
        self._spawn(self.link.send(dl.UpdateRequest(cmd.step)), "update request")

    def publish_weights(self, cmd: lp.PublishWeights) -> None:
        self.waiting_version = cmd.version
        if self.cluster is not None:
            self.on_cluster(self.cluster)

    def abort(self, cmd: lp.Abort) -> None:
        ep = self.episodes.pop(cmd.trajectory, None)
        if ep is not None:  # its environment learns why first (an agent's record keeps the loop's reason)
            self._spawn(ep.env.aclose(cmd.reason), f"close {cmd.trajectory}")
        if ep is not None and ep.task is not None:
            ep.task.cancel()
        restarted = cmd.reason == DRIVER_RESTARTED
        if not restarted:  # stale, failed or given up: its prefix is not continued
            self._journal_remove(cmd.trajectory)
        if cmd.replacement is not None:
            step = int(cmd.trajectory.split("-")[0][1:])
            # the old driver's, lost with it: continued from its journaled turns, else run again from its prompt
            if not self._begin(cmd.replacement, step, cmd.trajectory if restarted else None) and restarted:
                self.reruns.add(cmd.replacement.trajectory)

    # ------------------------------------------------------------------ training
    async def _train(self, cmd: lp.Train) -> None:
        """The update of the batch: its trajectories' samples are at the trainer already; training a
        step is idempotent there (a restarted driver asking again gets the version it published)."""
        tids = [t for g in cmd.groups for t in g]
        req = dp.StepRequest(
            step=cmd.step,
            trajectories=tids,
            dropped=list(cmd.dropped),
            training_gpus=self.job.training_gpus,
            version=cmd.weight_version,  # the update is of these weights: a trainer elsewhere refuses it
        )
        res = await self._trainer_call("step", lambda trainer: trainer.update_step(req))
        crash_point("driver.after_update")
        stats = res.step or {}
        if res.missing:
            log.error("the trainer lacked the samples of %d trajectories of step %d", len(res.missing), cmd.step)
        for tid in (*tids, *cmd.dropped):
            self.episodes.pop(tid, None)
        if self.journal is not None:  # trained: nothing of the step is continued any more
            self.journal.remove_step(cmd.step)
        missing = set(res.missing)  # committed: the records of what it consumed say `trained` now, not before
        self._audit_trained(cmd.step, res.version, [t for t in tids if t not in missing], list(cmd.dropped))
        self._audit_trained(cmd.step, res.version, [], sorted(missing), "not trained: the trainer lacked its samples")
        loss = float(stats.get("loss", 0.0))
        self.trained.append(
            {
                "step": cmd.step,
                "loss": loss,
                "reward": float(stats.get("mean_reward", 0.0)),
                "samples": int(stats.get("accepted", 0)),
            }
        )
        log.info(
            "step %d trained: version %s, loss %.4f, mean reward %.3f",
            cmd.step,
            res.version,
            loss,
            float(stats.get("mean_reward", 0.0)),
        )
        self._feed(lp.TrainingDone(self._now(), cmd.step, loss=loss, missing=len(res.missing)))

    async def _submit_samples(self, req: dp.SubmitSamples) -> None:
        await self._trainer_call("samples", lambda trainer: trainer.submit_samples(req))

    async def _trainer_call(self, verb: str, call: Callable[[TrainerClient], Awaitable[T]]) -> T:
        """Call the job's trainer (`TrainerClient`), waiting for one (a restarted trainer comes back on a new
        endpoint, which the next cluster view carries)."""
        assert self.http is not None
        for attempt in range(600):
            trainer = self.cluster.trainer if self.cluster else ""
            if trainer:
                try:
                    return await call(TrainerClient(trainer, self.token, self.http))
                except WorkerCallError as exc:
                    if exc.status not in (401, 502, 503):  # 401: a port reused by another process
                        raise RuntimeError(f"trainer /{verb}: {exc}") from exc
                except UNREACHABLE as exc:
                    log.warning("trainer /%s unreachable (%r); retrying", verb, exc)
            await asyncio.sleep(min(2.0, 0.1 * (attempt + 1)))
        raise RuntimeError(f"trainer /{verb}: no trainer answered")

    # ------------------------------------------------------------------ reports
    async def _flush(self) -> None:
        if self.records:
            records, self.records = self.records, []
            for i in range(0, len(records), dl.MAX_RECORDS):
                await self.link.send(dl.TelemetryReport(records[i : i + dl.MAX_RECORDS]))
        await self._report_trajectories()
        loop = self.loop
        progress = (max(0, loop.step), loop.remaining)
        if progress != self._last_progress and loop.step >= 0:
            self._last_progress = progress
            await self.link.send(dl.ProgressReport(*progress))
        state = self._checkpoint_due()
        if state is not None:
            await self.link.send(dl.CheckpointReport(state))
            self._checkpointed, self._checkpoint_sent_at = state, time.monotonic()

    def _checkpoint_due(self) -> dict[str, Any] | None:
        """The loop's checkpoint if one is due and differs from the last one sent (level-triggered). The
        loop re-encodes only the trajectories that changed, and unchanged records are the same objects
        as in the last one, so the comparison skips them by identity: the cost follows the changes."""
        if time.monotonic() - self._checkpoint_sent_at < CHECKPOINT_EVERY_S:
            return None
        state = self.loop.checkpoint() | {"clock_epoch": self.epoch}
        return state if state != self._checkpointed else None

    def _finished(self, ep: Episode) -> None:
        """A built-in environment's trajectory the loop counted as finished: its record, reported with the
        next flush (an agent job's records are its agent runner's)."""
        t = self.loop.trajs.get(ep.tid)
        if self.job.environment == "agent" or t is None or t.state is not lp.TrajState.DONE:
            return
        self.ended[ep.tid] = (ep.step, self._record(ep))

    def _record(self, ep: Episode) -> dict[str, Any]:
        from agents.driver.trajectories import episode_record

        return episode_record(ep.samples, ep.reward, tokens=not self._synthetic_tokens())

    async def _keep_record(self, ep: Episode) -> None:
        if self.kept is not None:
            await asyncio.to_thread(self.kept.keep, ep.tid, ep.step, self._record(ep))

    def _keeps_records(self) -> bool:
        return self.job.environment != "agent" or bool(self.job.agent)

    async def _report_trajectories(self) -> None:
        """The trajectories that ended since the last flush, summarised per step (the job page's browser and
        the steps' audit); an agent job's runner's records, or the driver's own of a built-in environment's,
        taken as they are reported, so they do not pile up."""
        if not self._keeps_records():
            return
        from agents.driver.trajectories import reports, step_of, summarize

        if self.job.environment == "agent":
            from agents.envs.agent import runner

            records = runner().records
            ended = [(step_of(name, max(0, self.loop.step)), name, records.pop(name)) for name in list(records)]
        else:
            ended = [(step, name, record) for name, (step, record) in self.ended.items()]
            self.ended.clear()
        for step, name, record in ended:  # listed as they end; `trained` comes with the update (TrainedReport)
            record["rerun"] = name in self.reruns
            record["resumed"] = name in self.resumed
            self.reruns.discard(name)
            self.resumed.discard(name)
            self._unreported.append((step, summarize(name, record)))
        while self._unreported:
            batch = reports(self._unreported)
            sent = 0
            for msg in batch:
                await self.link.send(msg)  # a failure keeps the rest for the next flush
                sent += len(msg.trajectories)
                done = {(msg.step, t.name) for t in msg.trajectories}
                self._unreported = [(s, t) for s, t in self._unreported if (s, t.name) not in done]
                if self.kept is not None:
                    for _, name in done:
                        self.kept.drop(name)
            if not sent:
                break
        while self._trained_reports and not self._unreported:  # after the records they mark
            await self.link.send(self._trained_reports[0])
            self._trained_reports.pop(0)

    def _audit_trained(
        self, step: int, version: int, trained: list[str], untrained: list[str], reason: str = ""
    ) -> None:
        """Queue what a step's committed update consumed (and left out, and why) for the trajectory records
        (agent jobs'), in reports of at most MAX_TRAJECTORIES names, sent after the records themselves."""
        if not self._keeps_records() or not (trained or untrained):
            return
        if untrained and not reason:
            reason = self._dropped_reason(step)
        n = dl.MAX_TRAJECTORIES
        for i in range(0, max(len(trained), len(untrained)), n):
            left_out = untrained[i : i + n]
            self._trained_reports.append(
                dl.TrainedReport(step, version, trained[i : i + n], left_out, reason if left_out else "")
            )

    def _dropped_reason(self, step: int) -> str:
        st = self.loop.steps.get(step)
        keep = min(2, self.job.group_size)
        given_up = st.given_up if st is not None else 0
        return (
            f"not trained: its group was dropped (fewer than {keep} members left; {given_up} member(s) of the"
            " step gave up)"
        )

    async def _flush_forever(self, every_s: float = 0.5) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self._flush()
            except Exception as exc:  # the link reconnects; reports are level-triggered and resent
                log.warning("driver: report failed: %r", exc)
