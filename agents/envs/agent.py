"""Bring your own agent: an external agent (a command, or an async Python function) as a PEARL environment.

Each trajectory is one run of the agent against the job's OpenAI-compatible gateway (`agents.gateway`):
the agent only sets `OPENAI_BASE_URL` / `OPENAI_API_KEY`, and its requests become the trajectory's turns.
`reset()` starts the agent and waits for its first request (the first prompt); `step(response)` answers
the pending request with the tokens the policy sampled and waits for the agent's next request (the new
messages' template tokens are the observation) or its end (the reward). So the rollout loop, the PD
router, borrowing, preemption resume and the staleness bound stay PEARL's: the driver samples every turn.

The job spec (`environment: agent`):
  agent_command: ["python", "my_agent.py"]  # argv, run in agent_workdir, in its own process group; or
  agent_function: "module:function"          # async (client: openai.AsyncOpenAI, task: dict) -> reward
  agent_isolation: process                   # agent_function: a pool of worker processes (default) or inline
  agent_processes: 0                         # the pool's processes at most (0: up to half the cores, max 4)
  tasks: "tasks.jsonl" | [{...}, ...]         # one JSON object per task (GRPO runs group_size runs of each)
  agent_timeout_s: 600                        # wall clock per trajectory
  agent_concurrency: 64                       # agents running at once
  agent_max_attempts: 3                       # failed runs per group member before the failure is final
The agent's environment has OPENAI_BASE_URL, OPENAI_API_KEY, PEARL_TASK (the task's JSON) and
PEARL_REWARD_URL. The reward is a POST of {"reward": r} to that URL or the agent's last stdout line
{"reward": r}. An agent function runs, by default, in a small pool of long-lived worker processes
(`agents.envs.agent_pool`: the function imported once per process, many trajectories on its event loop,
talking to the driver only through the gateway), so the SDK's CPU is not the driver's; `agent_isolation:
inline` runs it on the driver's event loop instead (for debugging). An agent that exits non-zero, raises,
times out or ends without a reward is a *failed* trajectory (`AgentFailed`: counted, kept with its stderr
tail or traceback, resampled by the driver), never a silent zero reward. Resampled, but not forever: a
group member (the loop's batch slot `s<step>-t<i>`, whatever its replacement suffix) that failed
`agent_max_attempts` times is given up (`AgentGaveUp`, a *final* failure): its reason says so, the driver
logs it as an error, no agent is run for the member again, and the loop takes the member out of its step's
batch: the step trains its group's surviving members, a group left with fewer than 2 is dropped (both
counted in the step's STEP record and on the job page), so one
broken task never stalls its job.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import json
import logging
import math
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from agents.envs.agent_pool import AgentFunctionError, AgentPool, AgentProcessDied, function_failed
from agents.envs.base import Environment, EnvironmentFailed, Turn, register
from agents.gateway.app import Gateway, serve
from agents.gateway.backends import BackendUnavailable, DriverBackend, Generation, Pending
from agents.gateway.chat import ChatFormat, load_format
from agents.gateway.sessions import Session, SessionStore
from controlplane.core.agent_spec import AgentSpec, SpecError, validate_agent_spec

log = logging.getLogger("pearl.agent_env")
TAIL_BYTES = 4096
MAX_TASK_FILE_BYTES = 64 << 20
SECRETS = (
    "PEARL_AGENT_TOKEN",
    "PEARL_DATAPLANE_SECRET",
    "PEARL_DRIVER_TOKEN",
    "PEARL_WORKER_SECRET",
    "PEARL_JOB_TOKEN",
)


class AgentFailed(EnvironmentFailed):
    """The agent's run is a failed trajectory: the driver counts it and resamples (never a zero reward)."""

    def __init__(self, reason: str, stderr_tail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.stderr_tail = stderr_tail


class AgentGaveUp(AgentFailed):
    """A group member's last allowed attempt failed: final, no agent runs for the member again."""

    final = True


def member_of(trajectory: str) -> str:
    """The group member a trajectory is an attempt of: the loop's `s<step>-t<i>` without `-r<n>`."""
    return re.sub(r"-r\d+$", "", trajectory)


def _read_task_file(path: str) -> str:
    p = Path(path)
    if p.stat().st_size > MAX_TASK_FILE_BYTES:
        raise ValueError(f"larger than {MAX_TASK_FILE_BYTES} bytes")
    return p.read_text(encoding="utf-8")


def validate_spec(spec: dict[str, Any]) -> AgentSpec:
    """The agent fields of a job spec, with the task file read and the workdir checked here."""
    return validate_agent_spec(spec, read_file=_read_task_file, is_dir=os.path.isdir)


class AgentRunner:
    """One per job: the gateway (served lazily on the driver's event loop), the tasks, the agents' bound."""

    def __init__(self, spec: AgentSpec, fmt: ChatFormat | None = None) -> None:
        self.spec = spec
        self.fmt = fmt or load_format(spec.model)
        self.backend = DriverBackend(spec.model)
        self.gateway = Gateway(
            self.fmt, self.backend, sessions=SessionStore(max_sessions=1 << 20, ttl_s=spec.timeout_s + 60)
        )
        self._serving: asyncio.Task[Any] | None = None
        self._runner: Any = None
        self._slots: asyncio.Semaphore | None = None
        self.live: set[AgentEnvironment] = set()
        self.records: dict[str, dict[str, Any]] = {}  # trajectory -> its record (status, reward, tokens, ...)
        self.failed = 0
        self.done = 0
        self.attempts: dict[str, int] = {}  # group member -> failed attempts
        self.gave_up: dict[str, str] = {}  # group member -> its final failure
        self.stopping = asyncio.Event()
        self._function: Any = None
        self._http: Any = None  # one httpx client for every agent function's AsyncOpenAI (see `_call_function`)
        self.pool: AgentPool | None = None  # agent_function, agent_isolation "process": its worker processes
        self._starting = asyncio.Lock()

    async def start(self) -> None:
        async with self._starting:  # once: the trajectories of a step reset concurrently
            if self._runner is None:
                await self._start()

    async def _start(self) -> None:
        if self._runner is None:
            self._runner, _ = await serve(self.gateway, self.spec.host, self.spec.port)
            self._slots = asyncio.Semaphore(self.spec.concurrency)
            if self.spec.function and self.spec.isolation == "inline":
                mod, name = self.spec.function.split(":")
                self._function = getattr(importlib.import_module(mod), name)
            elif self.spec.function:
                self.pool = AgentPool(
                    self.spec.function,
                    size=pool_size(self.spec),
                    workdir=self.spec.workdir,
                    env=agent_environ(),
                    timeout_s=self.spec.timeout_s,
                )

    async def stop(self) -> None:
        """The job stops: every running agent is ended, the gateway closed."""
        self.stopping.set()
        for env in list(self.live):
            await env.aclose("the job stopped")
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self.pool is not None:
            await self.pool.close()
            self.pool = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def env(self, *, task: int, member: int = 0, **_: Any) -> AgentEnvironment:
        return AgentEnvironment(self, self.spec.tasks[task % len(self.spec.tasks)], f"task{task}-m{member}")


class AgentEnvironment(Environment):
    """One run of the agent = one trajectory; see the module docstring.

    Not resumable after a driver crash (`snapshot` stays None): the trajectory's state is the agent process's
    own (its program counter, its Python objects, its tool sandbox), which died with the driver, and a new agent
    cannot be made to be where the old one was. A restarted driver reruns it from its task (record `rerun`)."""

    stop_at_eos = True  # a turn ends at the template's end of turn, as the agent's answer does
    temperature = 1.0

    def __init__(self, runner: AgentRunner, task: dict[str, Any], name: str) -> None:
        self.runner = runner
        self.task = task
        self.trajectory = name
        self.session: Session | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.agent: asyncio.Future[Any] | None = None  # the process watch, the inline call or the pool run
        self.pending: Pending | None = None
        self.context: list[int] = []  # what the driver holds for this trajectory
        self._replace: list[int] | None = None
        self._sampled: tuple[list[float], int, list[int]] | None = None
        self._deadline = 0.0
        self._stdout: collections.deque[str] = collections.deque(maxlen=64)
        self._stderr = bytearray()
        self._holding_slot = False
        self._why: str | None = None  # the first reason the trajectory was ended for
        self.status = "running"

    # ---- the driver's side
    async def reset(self) -> Turn:
        r = self.runner
        await r.start()
        final = r.gave_up.get(member_of(self.trajectory))
        if final is not None:  # out of attempts: no agent runs again for it (the loop leaves it out)
            raise AgentGaveUp(final)
        assert r._slots is not None
        await r._slots.acquire()  # bounded concurrency: waits before the trajectory's session starts
        self._holding_slot = True
        r.live.add(self)
        self.session = r.gateway.open(self.trajectory, self.task)
        self.session.backend_state = asyncio.Queue()
        self._deadline = time.monotonic() + r.spec.timeout_s
        try:
            await self._launch()
            nxt = await self._next()
        except BaseException:
            await self.aclose("aborted")
            raise
        if nxt is None:
            await self._fail_if_raised()
            await self._fail("the agent ended before its first request")
        assert nxt is not None
        self.context = list(nxt.prompt)
        return Turn(list(nxt.prompt), max_tokens=nxt.sampling.max_tokens)

    def observe(self, logprobs: list[float], weight_version: int, workers: list[int]) -> None:
        """The driver's sampled turn details (called before `step`)."""
        self._sampled = (list(logprobs), weight_version, list(workers))

    def take_context(self) -> list[int] | None:
        """A context that replaces the driver's (the agent rewrote its history: a fork), once."""
        ctx, self._replace = self._replace, None
        return ctx

    async def step(self, response: list[int]) -> Turn:
        pending, self.pending = self.pending, None
        if pending is None:
            raise AgentFailed("a turn was sampled with no request pending")
        lps, version, workers = self._sampled or ([0.0] * len(response), self.runner.backend.version, [])
        self._sampled = None
        if len(lps) != len(response):
            lps = (lps + [0.0] * len(response))[: len(response)]
        finish = "stop" if response and response[-1] in self.runner.fmt.stop_ids else "length"
        if not pending.answer.done():
            pending.answer.set_result(Generation(list(response), lps, finish, version, workers))
        self.context += list(response)
        try:
            nxt = await self._next()
        except BaseException:
            await self.aclose("aborted")
            raise
        if nxt is not None:
            if nxt.prompt[: len(self.context)] == self.context and len(nxt.prompt) > len(self.context):
                obs = nxt.prompt[len(self.context) :]
            else:  # history rewritten (or the answer cut at a stop string): the driver's context is replaced
                self._replace, obs = list(nxt.prompt), []
            self.context = list(nxt.prompt)
            return Turn(obs, max_tokens=nxt.sampling.max_tokens)
        reward = await self._reward()
        s = self.session
        assert s is not None
        info = {"turns": float(len(s.turns)), "forks": float(s.tokens.forks)}
        self._finish("done", reward=reward)
        return Turn([], done=True, reward=reward, info=info)

    # ---- the agent's side
    def _env_vars(self) -> dict[str, str]:
        s = self.session
        assert s is not None
        base = self.runner.gateway.base_url
        return agent_environ() | {
            "OPENAI_BASE_URL": f"{base}/v1",
            "OPENAI_API_KEY": s.key,
            "PEARL_TASK": json.dumps(self.task),
            "PEARL_REWARD_URL": f"{base}/sessions/{s.key}/reward",
        }

    async def _launch(self) -> None:
        spec = self.runner.spec
        if spec.command:
            self.proc = await asyncio.create_subprocess_exec(
                *spec.command,
                cwd=spec.workdir or None,
                env=self._env_vars(),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
            self.agent = asyncio.ensure_future(self._watch(self.proc))
        elif self.runner.pool is not None:
            s = self.session
            assert s is not None
            try:
                self.agent = await self.runner.pool.run(f"{self.runner.gateway.base_url}/v1", s.key, self.task)
            except AgentProcessDied as exc:
                self._stderr += exc.stderr_tail.encode()
                await self._fail(exc.reason)
        else:
            self.agent = asyncio.ensure_future(self._call_function())

    async def _watch(self, proc: asyncio.subprocess.Process) -> int:
        async def lines(stream: Any) -> None:
            async for raw in stream:
                self._stdout.append(raw.decode("utf-8", "replace").rstrip("\n"))

        async def errs(stream: Any) -> None:
            while chunk := await stream.read(1 << 14):
                self._stderr += chunk
                del self._stderr[:-TAIL_BYTES]

        await asyncio.gather(lines(proc.stdout), errs(proc.stderr))
        return await proc.wait()

    async def _call_function(self) -> Any:
        """The agent function with its own AsyncOpenAI client (its session's key) over the runner's one
        httpx client: a client of its own per trajectory would build an SSL context and open a connection
        each time, which py-spy showed as most of the driver's CPU per trajectory (bench_gateway_job.py)."""
        from openai import AsyncOpenAI, DefaultAsyncHttpxClient

        s, r = self.session, self.runner
        assert s is not None
        if r._http is None:
            r._http = DefaultAsyncHttpxClient(timeout=r.spec.timeout_s)
        client = AsyncOpenAI(
            base_url=f"{r.gateway.base_url}/v1", api_key=s.key, max_retries=0, http_client=r._http
        )  # not closed here: closing it would close the shared httpx client
        return await r._function(client, self.task)

    async def _next(self) -> Pending | None:
        """The agent's next request, or None once it has ended (fails on the wall-clock limit)."""
        s = self.session
        assert s is not None and self.agent is not None
        get = asyncio.ensure_future(s.backend_state.get())
        try:
            done, _ = await asyncio.wait(
                {get, self.agent},
                timeout=max(0.0, self._deadline - time.monotonic()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            if not get.done():
                get.cancel()
        if get in done:
            self.pending = get.result()
            return self.pending
        if not done:
            await self._fail(f"the agent ran past its wall-clock limit ({self.runner.spec.timeout_s:g} s)")
        return None

    async def _fail_if_raised(self) -> None:
        """A function agent that raised (or whose pool process died) fails with that reason."""
        if self.agent is not None and self.agent.done() and not self.agent.cancelled() and self.agent.exception():
            await self._reward()

    async def _reward(self) -> float:
        assert self.agent is not None and self.session is not None
        try:
            result = self.agent.result()
        except AgentFunctionError as exc:  # raised in a pool process: the reason carries its traceback tail
            await self._fail(exc.reason)
        except AgentProcessDied as exc:
            self._stderr += exc.stderr_tail.encode()
            await self._fail(exc.reason)
        except Exception as exc:
            await self._fail(function_failed(exc))
        if self.runner.spec.command:
            if result != 0:
                await self._fail(f"the agent exited with status {result}")
            if self.session.reward is not None:
                return self.session.reward
            last = next((ln for ln in reversed(self._stdout) if ln.strip()), "")
            try:
                r = json.loads(last).get("reward")
            except (ValueError, AttributeError):
                r = None
        else:
            r = self.session.reward if result is None else result
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
            await self._fail(
                'the agent ended without a reward (POST {"reward": r} to PEARL_REWARD_URL or print it'
                " as the last line of stdout)"
            )
        return float(r)

    async def _fail(self, reason: str) -> None:
        tail = self._stderr.decode("utf-8", "replace")
        r, member = self.runner, member_of(self.trajectory)
        n = r.attempts[member] = r.attempts.get(member, 0) + 1
        cls = AgentFailed
        if n >= r.spec.max_attempts:
            cls = AgentGaveUp
            reason = f"{reason} [attempt {n} of {r.spec.max_attempts} for {member}: final, not resampled again]"
            r.gave_up[member] = reason
            log.error("agent trajectory %s gave up: %s", member, reason)
        self._finish("failed", reason=reason, stderr=tail, attempt=n, final=cls is AgentGaveUp)
        await self.aclose("failed")
        raise cls(reason, tail)

    def _finish(self, status: str, **extra: Any) -> None:
        if self.status != "running":
            return
        self.status = status
        r = self.runner
        if status == "failed":
            r.failed += 1
        elif status == "done":
            r.done += 1
        rec = self.session.record() if self.session is not None else {}
        r.records[self.trajectory] = rec | {"status": status, "task": self.task} | extra
        if self.session is not None:
            r.gateway.close(self.session)
            # requests the environment never took are answered now (503), not left open: an open one
            # holds the gateway's shutdown at the job's stop for aiohttp's 60 s grace
            queue: asyncio.Queue[Pending] = self.session.backend_state
            while not queue.empty():
                waiting = queue.get_nowait().answer
                if not waiting.done():
                    waiting.set_exception(BackendUnavailable(f"trajectory {self.trajectory} has ended ({status})"))
        if self._holding_slot and r._slots is not None:
            r._slots.release()
            self._holding_slot = False
        r.live.discard(self)

    async def aclose(self, why: str = "aborted") -> None:
        """End the agent (its whole process group) and its session; its trajectory is over."""
        if self._why is None:
            self._why = why
        if self.pending is not None and not self.pending.answer.done():
            self.pending.answer.cancel()
        if self.proc is not None and self.proc.returncode is None:
            for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    await asyncio.wait_for(self.proc.wait(), wait)
                    break
                except TimeoutError:
                    continue
        if self.agent is not None and not self.agent.done():
            self.agent.cancel()
        if self.status == "running":
            self._finish("aborted", reason=self._why)


def agent_environ() -> dict[str, str]:
    """The driver's environment without its secrets: what an agent (process or pool process) inherits."""
    return {k: v for k, v in os.environ.items() if k not in SECRETS}


def pool_size(spec: AgentSpec) -> int:
    """The pool's processes: `agent_processes`, or up to half the cores (at most 4: each runs many
    trajectories), never more than the agents that may run at once."""
    n = spec.processes or max(1, min(4, (os.cpu_count() or 2) // 2))
    return max(1, min(n, spec.concurrency))


_RUNNER: AgentRunner | None = None


def configure(spec: AgentSpec | dict[str, Any], fmt: ChatFormat | None = None) -> AgentRunner:
    """Set this process's agent job (the driver does, from the job spec) and return its runner."""
    global _RUNNER
    _RUNNER = AgentRunner(spec if isinstance(spec, AgentSpec) else validate_spec(spec), fmt)
    return _RUNNER


def runner() -> AgentRunner:
    if _RUNNER is None:
        raise RuntimeError("environment 'agent' is not configured (agents.envs.agent.configure(spec))")
    return _RUNNER


def _factory(*, task: int, member: int = 0, **kw: Any) -> AgentEnvironment:
    return runner().env(task=task, member=member, **kw)


register("agent", _factory)

__all__ = [
    "AgentEnvironment",
    "AgentFailed",
    "AgentGaveUp",
    "AgentRunner",
    "AgentSpec",
    "SpecError",
    "configure",
    "runner",
    "validate_spec",
]
