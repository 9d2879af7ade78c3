"""The rollout driver's episodes: one trajectory's environment and its turns on engine workers.

An episode is one trajectory: an `agents.envs.Environment` (chosen by the job's `environment`, see
`agents.envs.register` for plugging a new kind in) gives the first prompt on `reset()` and the next
observation, or the reward, on `step(response)`; between the two, the turn is generated on the engine
worker the loop routed it to (colocated, or prefill → KV hand-off → decode) through the one worker
client (`agents.worker_client`). What happened goes back to the loop as events (`TrajectoryStarted`,
`Prefilled`, `TurnGenerated`, `TurnInterrupted`, `EnvStepped`); a finished trajectory's samples go to the
trainer before the loop counts it as finished.

A built-in environment's episode is journaled turn by turn (`agents.driver.journal`): a restarted driver
continues it from its last finished turn, its environment restored from the journaled snapshot and its prefix's
samples (tokens, log-probs as sampled, weights) taken from the journal, rather than running it again.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import ClientSession

from agents import dataplane as dp
from agents.crash import crash_point
from agents.dataplane import MAX_NEW_TOKENS
from agents.driver.journal import JournaledTrajectory, JournaledTurn, TurnJournal
from agents.envs import Environment, EnvironmentFailed, make_env
from agents.worker_client import UNREACHABLE, WorkerCallError, WorkerClient
from controlplane.core import driver_link as dl
from controlplane.core import loop as lp
from controlplane.core.state import Role

log = logging.getLogger("pearl.driver")
T = TypeVar("T")
RETRY_REFUSED_S = 0.2  # a worker that refuses (weights being pulled, draining) is asked again this much later
# a worker that is gone, or whose answer is not the result it should be (TypeError: other fields)
_FAILED: tuple[type[BaseException], ...] = (*UNREACHABLE, TypeError)


class WorkerUnavailable(RuntimeError):
    """The worker refused or is gone: the turn is interrupted and routed again."""


@dataclass
class Episode:
    """A trajectory's runtime side: its environment, the context so far and the turn in progress."""

    tid: str
    step: int
    group: int
    env: Environment
    context: list[int] = field(default_factory=list)
    budget: int = 16  # response tokens allowed this turn
    temperature: float = 1.0
    kept: list[int] = field(default_factory=list)  # tokens of this turn generated before an interruption
    kept_logprobs: list[float] = field(default_factory=list)
    kept_workers: list[int] = field(default_factory=list)  # the workers that produced `kept` (and its KV), in order
    version: int = 0  # oldest weights that produced any of its tokens
    new_tokens: int = 0  # prompt tokens appended for this turn (ΔL)
    samples: list[dict[str, Any]] = field(default_factory=list)  # one per finished turn
    pd: tuple[int, dp.PrefillResult] | None = None  # (prefill worker, its result) while the KV waits for decode
    attempt: int = 0
    task: asyncio.Task[None] | None = None
    reward: float = 0.0
    info: dict[str, float] = field(default_factory=dict)
    resumed: bool = False  # continued from a journaled prefix after the driver restarted
    journaled: bool = False  # its turns are journaled (its environment can be snapshotted)


class EpisodeRunner:
    """The episodes part of `RolloutDriver` (a mixin): environments, turns on workers, samples.

    What it needs from the driver is declared here; the driver gives it the serving workers (`workers`,
    from the control plane's pushes), the loop's clock and feed, its task spawner and the trainer."""

    job: dl.JobView
    time_factor: float
    token: str  # the job's data-plane token: what its workers accept
    http: ClientSession | None
    loop: lp.RolloutLoop
    episodes: dict[str, Episode]
    workers: dict[int, dl.RoutableWorker]
    clients: dict[str, WorkerClient]  # endpoint -> its client
    journal: TurnJournal | None  # the driver's turn journal (None: no state directory, or an agent job)

    def _now(self) -> float:
        raise NotImplementedError

    def _feed(self, ev: lp.Event) -> None:
        raise NotImplementedError

    def _spawn(self, coro: Awaitable[Any], name: str = "") -> asyncio.Task[Any]:
        raise NotImplementedError

    async def _submit_samples(self, req: dp.SubmitSamples) -> None:
        raise NotImplementedError

    def _finished(self, ep: Episode) -> None:
        """After the loop took `ep`'s end: the driver's own record of it (where the driver keeps them)."""
        raise NotImplementedError

    async def _keep_record(self, ep: Episode) -> None:
        """Before `ep`'s samples go to the trainer: keep its record durably until it is reported (where the
        driver keeps records on its own disk); nothing by default."""

    # ------------------------------------------------------------------ environments
    def _task_id(self, step: int, group: int) -> int:
        return zlib.crc32(f"{self.job.seed}-{step}-{group}".encode())

    def _make_env(self, ref: lp.TrajectoryRef, step: int) -> Environment:
        """The environment of `ref`'s task and place in the batch (a replacement's is its original's)."""
        job = self.job
        env = make_env(
            job.environment,
            task=self._task_id(step, ref.group),
            member=ref.index % job.group_size,
            seed=job.seed,
            time_factor=self.time_factor,
            max_tokens=job.max_trajectory_tokens,
            group_size=job.group_size,
            step=step,
            group=ref.group,
            batch_size=job.batch_size,
            model=job.model,  # a model directory's environments speak its tokenizer and chat template
        )
        if hasattr(env, "trajectory"):  # an agent's record is kept under the loop's trajectory id (reported)
            env.trajectory = ref.trajectory
        return env

    def _start_episode(self, ref: lp.TrajectoryRef, step: int) -> None:
        env = self._make_env(ref, step)
        ep = Episode(ref.trajectory, step, ref.group, env, temperature=getattr(env, "temperature", 1.0))
        self.episodes[ref.trajectory] = ep
        ep.task = self._spawn(self._reset(ep), f"reset {ep.tid}")

    async def _reset(self, ep: Episode) -> None:
        try:
            turn = await ep.env.reset()
        except EnvironmentFailed as exc:
            self._env_failed(ep, exc)
            return
        ep.context = list(turn.observation)
        ep.budget = turn.max_tokens
        ep.new_tokens = len(turn.observation)
        ep.version = self.loop.version
        if self.journal is not None and ep.env.snapshot() is not None:
            head = JournaledTrajectory(ep.tid, ep.step, list(ep.context), ep.budget, ep.version)
            ep.journaled = await asyncio.to_thread(self.journal.begin, head)
        self._feed(lp.TrajectoryStarted(self._now(), ep.tid, prompt_tokens=len(turn.observation)))

    def _resume_episode(self, ref: lp.TrajectoryRef, step: int, j: JournaledTrajectory) -> bool:
        """Continue the journaled trajectory `j` (the old driver's) as `ref` from its last finished turn: its
        environment restored from the turn's snapshot, its context and samples rebuilt from the journal (the
        log-probs as they were sampled, each turn's weights), the next turn routed by the loop as any other.
        False if the environment cannot take the snapshot (then `ref` starts from its prompt)."""
        env = self._make_env(ref, step)
        try:
            env.restore(j.turns[-1].env)
        except (NotImplementedError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s cannot resume from the journal of %s (%r): rerun", ref.trajectory, j.trajectory, exc)
            return False
        ep = Episode(ref.trajectory, step, ref.group, env, temperature=getattr(env, "temperature", 1.0))
        ep.context, ep.version, ep.resumed = list(j.prompt), j.version, True
        for t in j.turns:
            ep.samples.append(
                {
                    "prompt_tokens": list(ep.context),
                    "completion_tokens": t.response,
                    "logprobs": t.logprobs,
                    "weight_version": t.weight_version,
                    "workers": t.workers,
                }
            )
            ep.context += t.response + t.observation
            ep.version = min(ep.version, t.weight_version)
        ep.budget = max(1, j.turns[-1].max_tokens)
        ep.new_tokens = len(ep.context)  # a fresh request: the engine prefills the whole context
        self.episodes[ref.trajectory] = ep
        if self.journal is not None:  # the journal goes on under the new id (the old one's file is then let go)
            moved = JournaledTrajectory(ref.trajectory, step, j.prompt, j.budget, j.version, list(j.turns))
            ep.journaled = self.journal.begin(moved)
            if j.trajectory != ref.trajectory:
                self.journal.remove(j.trajectory)
        log.info("%s resumed from the journal of %s after %d turns", ref.trajectory, j.trajectory, len(j.turns))
        self._feed(lp.TrajectoryStarted(self._now(), ep.tid, prompt_tokens=len(ep.context)))
        return True

    def _env_failed(self, ep: Episode, exc: EnvironmentFailed) -> None:
        log.warning("trajectory %s failed%s: %s", ep.tid, " (final)" if exc.final else "", exc)
        why = str(exc)[:500] or type(exc).__name__
        self._feed(lp.EnvStepped(self._now(), ep.tid, 0.0, True, failed=why, final=exc.final))

    async def _env_step(
        self, ep: Episode, response: list[int], logprobs: list[float], version: int, workers: list[int]
    ) -> None:
        ep.samples.append(
            {
                "prompt_tokens": list(ep.context),
                "completion_tokens": response,
                "logprobs": logprobs,
                "weight_version": version,
                "workers": workers,
            }
        )
        t0 = self._now()
        ep.env.observe(logprobs, version, workers)
        try:
            turn = await ep.env.step(response)
        except EnvironmentFailed as exc:
            self._env_failed(ep, exc)
            return
        env_s = self._now() - t0
        replaced = ep.env.take_context()  # an agent that rewrote its history: its context from here on
        ep.context = replaced if replaced is not None else ep.context + response + list(turn.observation)
        ep.budget = max(1, turn.max_tokens)
        ep.new_tokens = len(turn.observation)
        if turn.done:
            ep.reward, ep.info = turn.reward, dict(turn.info)
            await self._keep_record(ep)  # its record outlives a crash before it is reported
            # the samples reach the trainer before the loop counts the trajectory as finished: whatever
            # restarts afterwards, a finished trajectory's samples are kept for its step's update
            await self._submit_samples(dp.SubmitSamples(self._samples(ep), train=False, step=ep.step))
            crash_point("driver.trajectory_durable")
            if ep.journaled and self.journal is not None:  # the trainer's copy is the durable one now
                self.journal.remove(ep.tid)
                ep.journaled = False
        elif ep.journaled and self.journal is not None:  # before the next turn is asked for
            state = ep.env.snapshot()
            done = JournaledTurn(response, logprobs, version, workers, list(turn.observation), ep.budget, state or {})
            if state is None or replaced is not None or not await asyncio.to_thread(self.journal.append, ep.tid, done):
                self.journal.remove(ep.tid)  # a gap in the journal: it reruns after a crash rather than resume
                ep.journaled = False
            crash_point("driver.mid_rollout_after_turn")
        self._feed(
            lp.EnvStepped(self._now(), ep.tid, env_s, turn.done, turn.reward, observation_tokens=len(turn.observation))
        )
        if turn.done:
            self._finished(ep)

    def _synthetic_tokens(self) -> bool:
        """An emulated model's tokens are synthetic: only their number means something."""
        return self.job.engine == "emulated" and self.job.model != "tiny"

    def _samples(self, ep: Episode) -> list[dp.TrainSample]:
        """One sample per turn, each with the trajectory's reward (its turns share one advantage). An
        emulated model's samples carry their size instead of their synthetic tokens."""
        counts_only = self._synthetic_tokens()
        out = []
        for s in ep.samples:
            prompt, completion = s["prompt_tokens"], s["completion_tokens"]
            out.append(
                dp.TrainSample(
                    group=f"{ep.step}-{ep.group}",
                    prompt_tokens=[] if counts_only else prompt,
                    completion_tokens=[] if counts_only else completion,
                    logprobs=[] if counts_only else s["logprobs"],
                    reward=ep.reward,
                    weight_version=min(s["weight_version"], ep.version),
                    temperature=ep.temperature,
                    trajectory=ep.tid,
                    token_count=max(1, len(prompt) + len(completion)) if counts_only else 0,
                )
            )
        return out

    # ------------------------------------------------------------------ turns on engine workers
    def _sampling(self, ep: Episode, budget: int) -> dp.SamplingParams:
        ep.attempt += 1
        seed = zlib.crc32(f"{self.job.seed}-{ep.tid}-{len(ep.samples)}-{ep.attempt}".encode())
        # within the data plane's bound: a request over it is refused (400) however often it is resent
        return dp.SamplingParams(
            max_tokens=max(1, min(budget, MAX_NEW_TOKENS)),
            temperature=ep.temperature,
            seed=seed,
            stop_at_eos=getattr(ep.env, "stop_at_eos", False),
        )

    def _client(self, w: dl.RoutableWorker) -> WorkerClient:
        """The worker's client, one per endpoint (it keeps the verbs' parsed URLs)."""
        assert self.http is not None
        client = self.clients.get(w.endpoint)
        if client is None or client.session is not self.http:
            client = self.clients[w.endpoint] = WorkerClient(w.endpoint, self.token, self.http)
        return client

    def _start_turn(self, tid: str, wid: int, min_version: int) -> None:
        ep = self.episodes.get(tid)
        if ep is None:
            return
        ep.task = self._spawn(self._first(ep, wid, min_version), f"turn {tid}")

    async def _first(self, ep: Episode, wid: int, min_version: int) -> None:
        """The turn's prompt (and any kept prefix) on a colocated worker (the whole turn) or a prefill worker."""
        w = self.workers.get(wid)
        if w is None:
            self._feed(lp.TurnInterrupted(self._now(), ep.tid, wid))
            return
        request_id = f"{ep.tid}-{len(ep.samples)}-{ep.attempt}"  # before _sampling counts this attempt
        req = dp.GenerateRequest(
            request_id=request_id,
            prompt_tokens=ep.context + ep.kept,
            sampling=self._sampling(ep, ep.budget - len(ep.kept)),
            min_weight_version=min_version,
            job=self.job.name,
        )
        prefilled = ep.new_tokens if not ep.kept else len(ep.context) + len(ep.kept)
        client = self._client(w)
        try:
            if w.role is Role.PREFILL:
                pre = await _unavailable_on_failure(client.prefill(req))
                ep.pd = (wid, pre)
                self._feed(lp.Prefilled(self._now(), ep.tid, wid, prefilled_tokens=prefilled))
                return
            res = await _unavailable_on_failure(client.generate(req))
        except WorkerUnavailable as exc:
            log.info("turn of %s on worker %s interrupted: %s", ep.tid, wid, exc)
            await asyncio.sleep(RETRY_REFUSED_S)
            self._feed(lp.TurnInterrupted(self._now(), ep.tid, wid))
            return
        await self._generated(ep, wid, res, prefilled)

    async def _decode(self, ep: Episode, cmd: lp.RouteDecode) -> None:
        """The KV hand-off: the decode worker pulls the prefilled KV cache from the prefill worker and decodes."""
        w = self.workers.get(cmd.worker)
        src = self.workers.get(cmd.source)
        if w is None or ep.pd is None or ep.pd[0] != cmd.source:
            self._feed(lp.TurnInterrupted(self._now(), ep.tid, cmd.worker))
            return
        pre = ep.pd[1]
        ep.pd = None
        # the KV is pulled from the prefill worker's endpoint ("" once it left the serving set: the pull fails)
        req = dp.DecodeRequest(
            request_id=f"{ep.tid}-{len(ep.samples)}-{ep.attempt}-d",
            kv_url=src.endpoint if src is not None else "",
            handle=pre.handle,
            kv_token=pre.kv_token,
            sampling=self._sampling(ep, ep.budget - len(ep.kept)),
            min_weight_version=cmd.min_weight_version,
            job=self.job.name,
        )
        try:
            res = await _unavailable_on_failure(self._client(w).decode(req))
        except WorkerUnavailable as exc:
            log.info("decode of %s on worker %s interrupted: %s", ep.tid, cmd.worker, exc)
            await asyncio.sleep(RETRY_REFUSED_S)
            self._feed(lp.TurnInterrupted(self._now(), ep.tid, cmd.worker))
            return
        await self._generated(ep, cmd.worker, res, 0, source=cmd.source)

    async def _generated(
        self, ep: Episode, wid: int, res: dp.GenerationResult, prefilled: int, source: int | None = None
    ) -> None:
        """A worker's answer to the turn (`source`: the prefill worker whose KV it decoded from)."""
        tokens, logprobs = list(res.tokens), list(res.logprobs)
        served = [wid] if source is None else [source, wid]
        ep.version = min(ep.version, res.weight_version)
        if res.finish_reason == "abort":  # drained or returned: keep the prefix, resume elsewhere
            ep.kept += tokens
            ep.kept_logprobs += logprobs
            if tokens:
                ep.kept_workers += served
            self._feed(
                lp.TurnInterrupted(self._now(), ep.tid, wid, generated_tokens=len(tokens), prefilled_tokens=prefilled)
            )
            return
        response, lps = ep.kept + tokens, ep.kept_logprobs + logprobs
        chain = ep.kept_workers + served
        workers = [w for i, w in enumerate(chain) if i == 0 or w != chain[i - 1]]  # each worker once per stretch
        ep.kept, ep.kept_logprobs, ep.kept_workers = [], [], []
        # a resumed episode's prefix may be of older weights than this turn: the loop checks its staleness on them
        version = ep.version if ep.resumed else res.weight_version
        self._feed(
            lp.TurnGenerated(self._now(), ep.tid, wid, len(tokens), prefilled_tokens=prefilled, weight_version=version)
        )
        if self.episodes.get(ep.tid) is not ep:  # the loop ended it on this turn (stale): no answer reaches its agent
            return
        await self._env_step(ep, response, lps, ep.version, workers)


async def _unavailable_on_failure(call: Awaitable[T]) -> T:
    """A worker's refusal or absence, as the one error the driver acts on (the turn is routed again)."""
    try:
        return await call
    except WorkerCallError as exc:
        raise WorkerUnavailable(str(exc)[:300]) from None
    except _FAILED as exc:
        raise WorkerUnavailable(f"{exc!r}") from None
