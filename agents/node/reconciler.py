"""The node agent's reconciler: the workers (and rollout drivers) it supervises, converged to the desired
state (level-triggered: recomputed from desired and observed on every desired state and every
`RECONCILE_PERIOD_S`), what it observes of them, and crash supervision (a crashed worker is reported with
the partial outputs its journal kept, then restarted with backoff)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from agents import dataplane as dp
from agents.node.config import AgentConfig
from agents.process import WorkerProcess, spawn_child, spawn_worker, stop_group
from agents.worker_client import WorkerCallError, WorkerClient
from controlplane.core import agent_link as link
from controlplane.core import telemetry as tm
from controlplane.core.state import Activity, Role

log = logging.getLogger("pearl.agent")

RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
RECONCILE_PERIOD_S = 2.0
STOP_GRACE_S = 15.0  # SIGTERM -> SIGKILL for a worker being retired (it drained already; this is its shutdown)
WEIGHTS_WATCH_S = 0.25  # how often a node with trainers checks them for newly published weights
PREEMPTION_MARGIN_S = 2.0  # a preempted node's workers are gone this long before the deadline (at most a fifth of it)


def partials(entries: list[dict[str, Any]], worker_id: int) -> list[dict[str, Any]]:
    """Aborted requests as a fault reports them: tokens and log-probs (the output itself), without the
    decoded text (any bytes a model produced, NUL included, which no database stores; the tokens say it)."""
    return [
        {k: v for k, v in r.items() if k != "text"} | {"finish_reason": "abort", "worker_id": worker_id}
        for r in entries[: link.MAX_ABORTED]
    ]


@dataclass
class Managed:
    """One worker the agent supervises: its desired spec, its process and what was last observed."""

    desired: link.DesiredWorker
    proc: WorkerProcess | None = None
    client: WorkerClient | None = None
    state: str = "starting"  # starting | running | draining | stopped | failed
    role: str = ""
    activity: str = "inactive"
    weight_version: int = 0
    generation: int = 0
    inflight: int = 0
    restarts: int = 0
    next_start: float = 0.0
    stopping: bool = False
    engine_state: str = ""  # running | draining | sleeping (as the worker reports it)
    pulled_for: int = -1  # desired generation at which the latest weights were last pulled
    activation_s: float | None = None  # how long the last wake took (for the toggle record)
    held_version: int | None = None  # a trainer's weight version as it last answered (None: not yet)
    devices: list[int] = field(default_factory=list)  # what the worker process says it is pinned to
    converging: asyncio.Task[None] | None = None  # its convergence in the reconcile pass now running
    abandoned: bool = False  # its start was given up: the desired state no longer wants it (`abandon_starts`)

    def observed(self) -> link.ObservedWorker:
        return link.ObservedWorker(
            worker_id=self.desired.worker_id,
            role=Role(self.role or self.desired.role),
            activity=Activity(self.activity),
            state=self.state,
            weight_version=self.weight_version,
            endpoint=self.proc.endpoint if self.proc and self.state != "stopped" else "",
            inflight=self.inflight,
            generation=self.generation,
            devices=self.devices if self.proc else [],
        )


@dataclass
class DriverProcess:
    """A job's rollout driver (`python -m agents.driver`) run by this agent, in its own process group,
    dying with the agent (a restarted agent starts it again; the driver resumes from its checkpoint)."""

    job: str
    restarts: int = 0
    next_start: float = 0.0
    proc: asyncio.subprocess.Process | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc is not None else None

    async def start(self, control_plane: str, token: str, time_factor: float, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        args = [
            sys.executable,
            "-m",
            "agents.driver",
            "--control-plane",
            control_plane,
            "--job",
            self.job,
            "--time-factor",
            str(time_factor),
            "--state-dir",  # its turn journal, kept across its restarts on this node
            str(log_dir / self.job),
        ]
        with open(log_dir / f"{self.job}.log", "ab") as out:
            self.proc = await spawn_child(args, {"PEARL_DRIVER_TOKEN": token}, stdout=out, stderr=out)

    async def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        await stop_group(self.proc, timeout_s)


class Reconciler:
    """The reconciling half of `NodeAgent` (a mixin: the session holds the state it shares, set in
    `NodeAgent.__init__`): reads `desired` and `epoch`, reports through `send`."""

    cfg: AgentConfig
    epoch: int
    desired: link.DesiredState | None
    workers: dict[int, Managed]
    drivers: dict[str, DriverProcess]
    weights_rotate_s: float
    pending_telemetry: list[dict[str, Any]]
    stopping: asyncio.Event
    _kick: asyncio.Event
    _beat: asyncio.Event
    _http: ClientSession | None
    _reconcile_lock: asyncio.Lock
    _asking: dict[tuple[str, int], asyncio.Task[None]]  # questions to workers still out (`_ask`)

    def send(self, message: Any) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ observation
    def _reachable(self) -> list[Managed]:
        return [m for m in self.workers.values() if m.client is not None and m.state not in ("stopped", "failed")]

    async def _ask(
        self, verb: str, ms: list[Managed], ask: Callable[[Managed], Coroutine[Any, Any, None]], within: float
    ) -> None:
        """Ask each worker of `ms` (`ask`), side by side, waiting at most `within` seconds. What waits here is
        the node's heartbeat, i.e. its lease: a worker busy past `within` (a role change, a training step, a
        starved CPU) answers into a later beat, and is not asked again while its question is out."""
        tasks = []
        for m in ms:
            key = (verb, m.desired.worker_id)
            task = self._asking.get(key)
            if task is None or task.done():
                task = self._asking[key] = asyncio.create_task(ask(m))
            tasks.append(task)
        if tasks:
            await asyncio.wait(tasks, timeout=within)
        self._asking = {k: t for k, t in self._asking.items() if not t.done()}

    async def _ask_trainer(self, m: Managed) -> None:
        """The weight version the trainer holds now (`held_version`; unchanged if it did not answer)."""
        with contextlib.suppress(Exception):
            m.held_version = (await m.client.health()).weight_version  # type: ignore[union-attr]

    async def _trainer_published(self) -> bool:
        """A trainer on this node holds a newer weight version than last reported: the rollout driver
        and the workers that pull wait for the control plane to hear of it, so it is not left to the
        next periodic heartbeat (seconds of idle rollout per update)."""
        trainers = [m for m in self._reachable() if m.desired.role == Role.TRAINING]
        await self._ask("health", trainers, self._ask_trainer, WEIGHTS_WATCH_S)
        return any(m.held_version is not None and m.held_version > m.weight_version for m in trainers)

    async def _observe(self, within: float) -> None:
        """Every worker's state, asked side by side, for at most `within` seconds (`_ask`): on a busy node
        the heartbeat (which confirms a return against its deadline) waits for the slowest answer, not for
        the sum of them, and never for a worker that does not answer."""

        async def one(m: Managed) -> None:
            assert m.client is not None
            with contextlib.suppress(Exception):
                s = await m.client.stats()
                m.role, m.weight_version, m.engine_state = s.role, s.weight_version, s.state
                m.inflight = s.running_batch + s.waiting
                m.activity = "inactive" if s.state == "sleeping" else m.activity

        reachable = self._reachable()
        trainers = [m for m in reachable if m.desired.role == Role.TRAINING]
        await asyncio.gather(
            self._ask("health", trainers, self._ask_trainer, within),
            self._ask("stats", [m for m in reachable if m.desired.role != Role.TRAINING], one, within),
        )
        for m in trainers:
            m.weight_version = m.weight_version if m.held_version is None else m.held_version

    async def _collect_telemetry(self, within: float) -> list[dict[str, Any]]:
        """The rollout workers' telemetry records and the agent's own, waiting at most `within` seconds for
        the workers (`_ask`): records that come later go with the next beat."""

        async def records(m: Managed) -> None:
            with contextlib.suppress(Exception):
                self.pending_telemetry.extend((await m.client.telemetry()).records)  # type: ignore[union-attr]

        rollout = [
            m for m in self._reachable() if m.state in ("running", "draining") and m.desired.role != Role.TRAINING
        ]
        await self._ask("telemetry", rollout, records, within)
        out, self.pending_telemetry = self.pending_telemetry, []
        return out

    # ------------------------------------------------------------ reconciliation
    async def _reconcile_loop(self) -> None:
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), RECONCILE_PERIOD_S)
            self._kick.clear()
            try:
                before = [m.observed() for m in self.workers.values()]
                await self.reconcile()
                if before != [m.observed() for m in self.workers.values()]:
                    self._beat.set()  # the control plane confirms transition steps by what we report
            except Exception:  # keep reconciling; the next pass recomputes from scratch
                log.exception("reconcile failed")

    async def reconcile(self) -> None:
        async with self._reconcile_lock:
            ds = self.desired
            if ds is None:
                return
            if ds.status in ("draining", "gone") or ds.preemption_deadline is not None:
                timeout, by = self.cfg.drain_timeout_s, None
                if ds.preemption_deadline is not None:
                    # the workers' processes are gone by `by`, a margin before the deadline; their drain
                    # ends a second before that, leaving the rest for their own shutdown
                    left = max(0.0, ds.preemption_deadline - time.time())
                    by = ds.preemption_deadline - min(PREEMPTION_MARGIN_S, 0.2 * left)
                    timeout = max(0.0, min(timeout, by - time.time() - 1.0))
                await self.shutdown_workers(timeout, by=by)
                for retired in self.workers.values():
                    retired.generation = ds.generation
                return
            await self._reconcile_drivers(ds)
            wanted = {w.worker_id: w for w in ds.workers}
            # the workers no longer wanted retire side by side: a lend's end stops several at once
            gone = [w for w in self.workers if w not in wanted]
            outcomes = await asyncio.gather(
                *(self._retire(self.workers[wid], self.cfg.drain_timeout_s) for wid in gone), return_exceptions=True
            )
            for wid, r in zip(gone, outcomes, strict=True):
                if isinstance(r, BaseException):  # the next pass tries again
                    log.error("worker %s did not retire: %r", wid, r)
                else:
                    del self.workers[wid]
            for wid, spec in wanted.items():
                m = self.workers.get(wid)
                # a worker retired by a drain that was taken back (a preemption notice cancelled, the node
                # returned to service) is wanted again: it starts afresh on its slot
                changed = {} if m is None else self._identity_change(m.desired, spec)
                if m is None or m.state == "stopped" or changed:
                    if m is not None:  # a restart in place: say why (an operator asks when a worker's pid changed)
                        why = "its drain was taken back" if m.state == "stopped" else f"{changed} (old, new)"
                        log.warning("worker %s starts afresh at generation %s: %s", wid, ds.generation, why)
                    if m is not None and m.state != "stopped":
                        await self._retire(m, self.cfg.drain_timeout_s)
                    m = self.workers[wid] = Managed(desired=spec)
                m.desired = spec
            # the node's workers converge side by side: returning eight borrowed workers at Training Begin
            # takes one worker's time, not eight
            tasks: list[asyncio.Task[None]] = []
            for wid in wanted:
                m = self.workers[wid]
                m.converging = asyncio.create_task(self._converge(m, ds))
                tasks.append(m.converging)
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for wid, r in zip(wanted, results):
                if isinstance(r, Exception):
                    log.error("worker %s did not converge: %r", wid, r)

    @staticmethod
    def _identity_change(old: link.DesiredWorker, new: link.DesiredWorker) -> dict[str, tuple[Any, Any]]:
        """What changed of what is fixed for a worker's life: G_w, engine, model, job and whether it trains (a role
        change within rollout is not). Field names and (old, new) values only: a desired worker carries secrets."""
        a, b = (
            {"gpus": w.gpus, "engine": w.engine, "model": w.model, "job": w.job, "training": w.role == Role.TRAINING}
            for w in (old, new)
        )
        return {k: (a[k], b[k]) for k in a if a[k] != b[k]}

    def abandon_starts(self, ds: link.DesiredState) -> None:
        """On a new desired state: a worker still starting (its process, its first weights) that `ds` no longer
        wants, or on a node told to drain or leave, is given up at once, its process killed, rather than
        started to the end and then retired. The reconcile pass that runs a start holds every later change
        back, and a start can outlast a deadline: the owner's Training Begin taking a lent GPU back
        (`services.workers.return_borrowed` stops a worker that was not running yet), a preemption notice."""
        leaving = ds.status in ("draining", "gone") or ds.preemption_deadline is not None
        wanted = set() if leaving else {w.worker_id for w in ds.workers}
        for wid, m in self.workers.items():
            task = m.converging
            if wid not in wanted and m.state == "starting" and not m.abandoned and task is not None and not task.done():
                m.abandoned = True
                task.cancel()

    async def _converge(self, m: Managed, ds: link.DesiredState) -> None:
        """`_converge_once`; a start given up (`abandon_starts`) ends here with its process gone, reported
        stopped at once (the next pass retires it)."""
        try:
            await self._converge_once(m, ds)
        except asyncio.CancelledError:
            if not m.abandoned:
                raise
            m.stopping = True  # not a crash: the monitor leaves it alone
            if m.proc is not None:
                await m.proc.stop(0.0)  # it never served: nothing to drain or journal
            m.state, m.inflight = "stopped", 0
            log.info("worker %s: start abandoned (no longer wanted here)", m.desired.worker_id)
            self._beat.set()

    async def _converge_once(self, m: Managed, ds: link.DesiredState) -> None:
        spec = m.desired
        if m.proc is not None and m.proc.proc.returncode is not None:
            return  # it died: the monitor reports the crash (with its partial outputs), then restarts it
        if m.proc is None:
            if time.monotonic() < m.next_start:
                return
            if not await self._start(m):
                return
        assert m.client is not None
        try:
            if spec.role == Role.TRAINING:
                m.state, m.role, m.activity = "running", "training", spec.activity.value
                m.generation = ds.generation
                return
            epoch = self.epoch
            if m.role != spec.role.value:
                await m.client.set_role(dp.SetRoleRequest(spec.role.value), epoch=epoch)
                m.role = spec.role.value
            if spec.activity == Activity.INACTIVE and m.engine_state != "sleeping":
                # deactivate (return to the trainer, against its deadline): abort in-flight work at once,
                # then sleep. The partial outputs go back to their callers, which resume them elsewhere
                # from their prefixes, and are reported here as well; waiting for long decodes to finish
                # would spend the return deadline on turns another worker can carry on.
                t0 = time.perf_counter()
                await self._drain(m, dp.DrainRequest("abort", 0.0), "deactivation", epoch)
                await m.client.sleep(dp.SleepRequest(1), epoch=epoch)
                m.engine_state, m.inflight = "sleeping", 0
                if m.activation_s is not None:  # one borrow + return observed: T_toggle sample
                    # in the job's clock, as every other record: an emulated engine runs `time_factor` times real time
                    scale = self.cfg.time_factor if spec.engine == "emulated" else 1.0
                    self.pending_telemetry.append(
                        tm.toggle(
                            time_s=time.time(),
                            job=spec.job,
                            worker=spec.worker_id,
                            activation_s=m.activation_s / scale,
                            return_s=(time.perf_counter() - t0) / scale,
                        ).to_json()
                    )
                    m.activation_s = None
            elif (
                spec.activity == Activity.TRANSITIONING
                and m.activity == Activity.ACTIVE.value
                and m.engine_state == "running"
            ):
                # drain (a role change or a removal is coming): stop admitting; running requests finish
                # within the drain timeout or go back to their callers with their partial outputs
                await self._drain(m, dp.DrainRequest("wait", self.cfg.drain_timeout_s), "the drain", epoch)
                m.engine_state, m.activity, m.inflight = "draining", Activity.TRANSITIONING.value, 0
            elif spec.activity == Activity.ACTIVE and m.engine_state in ("sleeping", "draining", ""):
                t0 = time.perf_counter()
                was_asleep = m.engine_state == "sleeping"
                await m.client.wake(epoch=epoch)
                await m.client.resume(epoch=epoch)
                m.engine_state = "running"
                if was_asleep:
                    m.activation_s = time.perf_counter() - t0
            if spec.activity == Activity.INACTIVE:
                # asleep (a returned or never-borrowed overlap worker): it pulls weights when it is lent
                # again, not on every change to its node, which would hold up a return's report
                m.state, m.generation = "running", ds.generation
                m.activity = Activity.INACTIVE.value
                return
            if spec.weights_url and (m.weight_version < spec.min_weight_version or m.pulled_for < ds.generation):
                # pull-based and lazy: the latest version, once per desired generation, or until
                # the worker reaches the job's min_weight_version
                m.pulled_for = ds.generation
                try:
                    pull = dp.LoadWeightsRequest(spec.weights_url, 0, spec.weights_token)
                    m.weight_version = (await m.client.load_weights(pull, epoch=epoch)).weight_version
                except WorkerCallError as exc:
                    log.warning("worker %s: weight pull failed: %s", spec.worker_id, exc)
            if m.weight_version < spec.min_weight_version:
                m.state = "starting"  # never serve with weights older than the job allows
                return
            m.activity = spec.activity.value if spec.activity != Activity.TRANSITIONING else m.activity
            m.state = "running"
            m.generation = ds.generation
        except WorkerCallError as exc:
            log.warning("worker %s: %s", spec.worker_id, exc)
        except OSError as exc:
            log.warning("worker %s unreachable: %s", spec.worker_id, exc)

    async def _start(self, m: Managed) -> bool:
        spec = m.desired
        assert self._http is not None
        # per job: a trainer resumes from its own job's checkpoints only, never another job's that reused a worker id
        state_dir = self.cfg.state_dir / "jobs" / (spec.job or "-") / f"worker-{spec.worker_id}"
        training = spec.role == Role.TRAINING
        engine = spec.engine or self.cfg.engine
        extra: list[str] = ["--tp", str(max(1, len(spec.gpus)))]  # G_w's size is the TP degree
        env: dict[str, str] = {
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in spec.gpus),  # slot i is GPU i
            "PEARL_JOB_TOKEN": spec.dataplane_token,
        }  # the job's rollout driver calls it with this
        if (
            self.cfg.advertise_address != "127.0.0.1"
        ):  # vLLM's NIXL handshake: on the address peers reach (port 0: free)
            env["PEARL_NIXL_SIDE_CHANNEL"] = f"{self.cfg.advertise_address}:0"
        if training:
            extra += ["--weights-dir", str(state_dir / "weights"), "--ckpt-dir", str(state_dir / "ckpt")]
            env |= {"PEARL_WEIGHTS_KEY": spec.weights_key, "PEARL_WEIGHTS_ROTATE_S": str(self.weights_rotate_s)}
            if spec.checkpoint_dir:  # Hugging Face checkpoints the user takes home (issue 36)
                extra += ["--export-dir", spec.checkpoint_dir, "--export-every", str(spec.checkpoint_every)]
                extra += ["--export-keep", str(spec.checkpoint_keep)]
            if spec.init_from:
                extra += ["--init-from", spec.init_from]
        elif self.cfg.interference != 1.0:
            extra += ["--interference", str(self.cfg.interference)]
        m.state = "starting"
        try:
            m.proc = await spawn_worker(
                worker_id=spec.worker_id,
                engine=engine if engine in ("torch", "emulated", "vllm") else self.cfg.engine,
                role="colocated" if training else spec.role.value,
                state_dir=state_dir,
                model=spec.model,
                job=spec.job,
                hardware=self.cfg.hardware,
                time_factor=self.cfg.time_factor,
                module="agents.trainer" if training else "agents.worker",
                extra=extra,
                env_extra=env,
                secret=self.cfg.dataplane_secret or None,
                bind=self.cfg.bind_address,
                advertise=self.cfg.advertise_address,
            )
            health = await WorkerClient(m.proc.endpoint, m.proc.secret, self._http).health()
            if sorted(health.devices) != sorted(
                spec.gpus
            ):  # the binding holds in the process, not only in the database
                await m.proc.stop(2.0)
                raise RuntimeError(f"worker runs on devices {health.devices}, not its slots {spec.gpus}")
            m.devices = sorted(health.devices)
        except Exception as exc:
            m.state = "failed"
            m.restarts += 1
            m.next_start = time.monotonic() + RESTART_BACKOFF_S[min(m.restarts, len(RESTART_BACKOFF_S) - 1)]
            log.warning("worker %s failed to start: %s", spec.worker_id, exc)
            self.send(
                link.Fault(
                    epoch=self.epoch, worker_id=spec.worker_id, kind="crashed", detail=f"start failed: {exc}"[:4000]
                )
            )
            return False
        m.client = WorkerClient(m.proc.endpoint, m.proc.secret, self._http)
        m.role = "training" if training else spec.role.value
        m.engine_state, m.weight_version, m.pulled_for = "running", 0, -1
        return True

    async def _drain(self, m: Managed, req: dp.DrainRequest, by_what: str, epoch: int, by: float | None = None) -> None:
        """Drain `m`'s engine and report the partial outputs it aborted (they went back to their callers, which
        resume them elsewhere from their prefixes) as one `drained` fault. `by` (wall clock) bounds the wait
        for the drain's answer."""
        assert m.client is not None
        call = m.client.drain(req, epoch=epoch)
        res = await (call if by is None else asyncio.wait_for(call, max(0.0, by - time.time())))
        if res.aborted:
            wid = m.desired.worker_id
            self.send(
                link.Fault(
                    epoch=self.epoch,
                    worker_id=wid,
                    kind="drained",
                    detail=f"{len(res.aborted)} requests aborted by {by_what}",
                    aborted=partials([dp.DATA_PLANE.dump(r) for r in res.aborted], wid),
                )
            )

    async def _retire(self, m: Managed, timeout_s: float, by: float | None = None) -> None:
        """Drain (partials go back to the callers and are reported), then stop the process. `by` (wall
        clock, a preemption's deadline less a margin) bounds the whole: the drain's answer is not awaited
        past it, and the process group gets SIGKILL at it, however slow a loaded worker is to shut down."""
        m.stopping = True
        if m.client and m.proc and m.proc.proc.returncode is None and m.desired.role != Role.TRAINING:
            m.state = "draining"
            with contextlib.suppress(Exception):
                await self._drain(m, dp.DrainRequest("wait", timeout_s), "the drain", self.epoch, by)
        if m.proc:
            await m.proc.stop(STOP_GRACE_S if by is None else max(0.0, min(STOP_GRACE_S, by - time.time())))
        m.state = "stopped"

    async def shutdown_workers(self, timeout_s: float, by: float | None = None) -> None:
        ms = list(self.workers.values())
        await asyncio.gather(
            *[self._retire(m, timeout_s, by) for m in ms if m.state != "stopped"], return_exceptions=True
        )
        await asyncio.gather(*[d.stop() for d in self.drivers.values()], return_exceptions=True)
        self.drivers.clear()

    # ------------------------------------------------------------ rollout drivers
    async def _reconcile_drivers(self, ds: link.DesiredState) -> None:
        """Run the drivers the control plane placed here; restart one that died (with backoff)."""
        wanted = {d.job: d for d in ds.drivers}
        for job in [j for j in self.drivers if j not in wanted]:
            await self.drivers.pop(job).stop()
        for job, spec in wanted.items():
            d = self.drivers.get(job)
            if d is not None and d.running:
                continue
            if d is not None and time.monotonic() < d.next_start:
                continue
            if d is not None:
                self.send(
                    link.Fault(
                        epoch=self.epoch,
                        worker_id=0,
                        kind="driver_restarted",
                        detail=f"the rollout driver of job {job} exited with {d.returncode}; restarting",
                    )
                )
            restarts = d.restarts + 1 if d is not None else 0
            d = self.drivers[job] = DriverProcess(job=job, restarts=restarts)
            await d.start(self.cfg.control_plane, spec.token, self.cfg.time_factor, self.cfg.state_dir / "drivers")
            d.next_start = time.monotonic() + RESTART_BACKOFF_S[min(restarts, len(RESTART_BACKOFF_S) - 1)]

    # ------------------------------------------------------------ crash supervision
    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            for m in list(self.workers.values()):
                if m.proc is None or m.stopping or m.proc.proc.returncode is None:
                    continue
                await self.handle_crash(m)

    async def handle_crash(self, m: Managed) -> None:
        assert m.proc is not None
        rc = m.proc.proc.returncode
        journal = m.proc.state_dir / "inflight.json"
        aborted: list[dict[str, Any]] = []
        with contextlib.suppress(Exception):
            data = json.loads(journal.read_text())
            if data.get("pid") == m.proc.pid:
                aborted = partials(data["inflight"], m.desired.worker_id)
            journal.unlink()
        await m.proc.reap()
        log.warning(
            "worker %s (pid %s) exited with %s; %d requests aborted", m.desired.worker_id, m.proc.pid, rc, len(aborted)
        )
        self.send(
            link.Fault(
                epoch=self.epoch,
                worker_id=m.desired.worker_id,
                kind="crashed",
                detail=f"pid {m.proc.pid} exited with {rc}",
                aborted=aborted,
            )
        )
        m.restarts += 1
        m.proc, m.client, m.state = None, None, "failed"
        m.next_start = time.monotonic() + RESTART_BACKOFF_S[min(m.restarts - 1, len(RESTART_BACKOFF_S) - 1)]
        # restart (level-triggered: the reconciler starts it again once the backoff has passed)
        await asyncio.sleep(max(0.0, m.next_start - time.monotonic()))
        if self.desired is not None and m.desired.worker_id in self.workers and not self.stopping.is_set():
            await self.reconcile()
            if m.proc is not None:
                self.send(
                    link.Fault(
                        epoch=self.epoch,
                        worker_id=m.desired.worker_id,
                        kind="restarted",
                        detail=f"restarted as pid {m.proc.pid} (restart #{m.restarts})",
                    )
                )
