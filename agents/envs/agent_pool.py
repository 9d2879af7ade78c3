"""Agent functions (`agent_function: "module:function"`) in their own worker processes, off the driver's core.

In the driver's process the agent's openai SDK took a third of the driver's CPU (py-spy,
`benchmarks/bench_gateway_job.py`): building requests, parsing answers, httpx. Here a small pool of
long-lived processes (`python -m agents.envs.agent_pool module:function`) each imports the function once
and runs many trajectories concurrently on its own event loop, with one shared httpx client under every
trajectory's `AsyncOpenAI`. They reach the driver only through the job's gateway over HTTP, as an agent
command does; the driver hands each trajectory's session key and task over the process's stdin.

The protocol is newline-delimited JSON (never pickle), driver → process on stdin:
  {"op": "run", "id": "7", "base_url": "http://…/v1", "key": "…", "task": {…}}
  {"op": "cancel", "id": "7"}                   # the trajectory was aborted: its coroutine is cancelled
and process → driver on the process's original stdout (the function's own prints go to stderr):
  {"op": "ready"}                               # the function is imported
  {"op": "fatal", "reason": "…"}                # it could not be: the process exits
  {"op": "result", "id": "7", "ok": true, "value": 0.5}
  {"op": "result", "id": "7", "ok": false, "reason": "the agent function raised …traceback tail…"}
A process that dies fails its running trajectories with the reason (the driver resamples them) and the
pool starts a new one for the next trajectory. The end of stdin (the driver stopped) ends the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import signal
import sys
import traceback
from typing import Any

TAIL_CHARS = 2048
LINE_LIMIT = 64 << 20  # a task is one JSON line: at most the task file's size


def traceback_tail(exc: BaseException) -> str:
    """The last lines of `exc`'s traceback: what a failed trajectory's reason shows."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    return text[-TAIL_CHARS:]


def function_failed(exc: BaseException) -> str:
    return f"the agent function raised {exc!r}\n{traceback_tail(exc)}"


def describe_exit(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exited with status {rc}"


class AgentProcessDied(Exception):
    """The pool process running the trajectory died (or could not import the function)."""

    def __init__(self, reason: str, stderr_tail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.stderr_tail = stderr_tail


class AgentFunctionError(Exception):
    """The agent function raised in its pool process; `reason` carries the traceback tail."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ------------------------------------------------------------------ the driver's side
class PoolProcess:
    """One worker process and the trajectories it runs."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.running: dict[str, asyncio.Future[Any]] = {}
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.fatal = ""
        self.stderr = bytearray()
        self.reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, msg: dict[str, Any]) -> None:
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing():
            raise AgentProcessDied("the agent function's worker process is gone")
        stdin.write(json.dumps(msg).encode() + b"\n")


class AgentPool:
    """At most `size` worker processes for one job's agent function; trajectories go to the least loaded."""

    def __init__(self, function: str, *, size: int, workdir: str, env: dict[str, str], timeout_s: float) -> None:
        self.function = function
        self.size = max(1, size)
        self.workdir = workdir
        self.env = env
        self.timeout_s = timeout_s
        self.procs: list[PoolProcess] = []
        self.started = 0  # processes started over the pool's life (restarts included)
        self._ids = 0
        self._closing = False
        self._lock: asyncio.Lock | None = None

    async def _spawn(self) -> PoolProcess:
        paths = [p for p in sys.path if p] + [self.env.get("PYTHONPATH", "")]
        env = self.env | {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agents.envs.agent_pool",
            self.function,
            str(self.timeout_s),
            cwd=self.workdir or None,
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: the job's stop ends whatever it started
            limit=LINE_LIMIT,
        )
        p = PoolProcess(proc)
        p.reader = asyncio.ensure_future(self._read(p))
        self.procs.append(p)
        self.started += 1
        return p

    async def _read(self, p: PoolProcess) -> None:
        async def errs() -> None:
            assert p.proc.stderr is not None
            while chunk := await p.proc.stderr.read(1 << 14):
                p.stderr += chunk
                del p.stderr[:-TAIL_CHARS]

        drain = asyncio.ensure_future(errs())
        assert p.proc.stdout is not None
        try:
            async for raw in p.proc.stdout:
                try:
                    msg = json.loads(raw)
                except ValueError:
                    continue
                op = msg.get("op") if isinstance(msg, dict) else None
                if op == "ready" and not p.ready.done():
                    p.ready.set_result(None)
                elif op == "fatal":
                    p.fatal = str(msg.get("reason", ""))
                elif op == "result":
                    fut = p.running.pop(str(msg.get("id")), None)
                    if fut is None or fut.done():
                        continue
                    if msg.get("ok"):
                        fut.set_result(msg.get("value"))
                    else:
                        fut.set_exception(AgentFunctionError(str(msg.get("reason", "the agent function failed"))))
        finally:
            rc = await p.proc.wait()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(drain, 5.0)
            if p in self.procs:
                self.procs.remove(p)
            tail = p.stderr.decode("utf-8", "replace")
            if p.fatal:
                why = f"the agent function could not be loaded in its worker process: {p.fatal}"
            else:
                why = (
                    f"the agent function's worker process (pid {p.pid}) {describe_exit(rc)}"
                    " while the trajectory ran (the pool starts a new one)"
                )
            if not p.ready.done():
                p.ready.set_exception(AgentProcessDied(why, tail))
                p.ready.exception()  # retrieved: no one may be waiting
            for fut in p.running.values():
                if not fut.done():
                    fut.set_exception(AgentProcessDied(why, tail))
            p.running.clear()

    async def run(self, base_url: str, key: str, task: dict[str, Any]) -> asyncio.Future[Any]:
        """Start one trajectory of the function; the future is its return value (cancel it to abort)."""
        if self._closing:
            raise AgentProcessDied("the job stopped")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one spawn at a time: the pool never outgrows `size`
            alive = [p for p in self.procs if p.proc.returncode is None and not p.fatal]
            if len(alive) < self.size and (not alive or min(len(p.running) for p in alive) > 0):
                p = await self._spawn()
            else:
                p = min(alive, key=lambda q: len(q.running))
            self._ids += 1
            tid = str(self._ids)
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            p.running[tid] = fut
            try:
                p.send({"op": "run", "id": tid, "base_url": base_url, "key": key, "task": task})
            except AgentProcessDied:
                p.running.pop(tid, None)
                raise

        def cancelled(f: asyncio.Future[Any]) -> None:
            if f.cancelled() and p.running.pop(tid, None) is not None:
                with contextlib.suppress(AgentProcessDied, OSError, RuntimeError):
                    p.send({"op": "cancel", "id": tid})

        fut.add_done_callback(cancelled)
        return fut

    async def close(self) -> None:
        """The job stops: every process group is ended (TERM, then KILL)."""
        self._closing = True
        procs, self.procs = list(self.procs), []
        for p in procs:
            if p.proc.stdin is not None:
                p.proc.stdin.close()
        for p in procs:
            for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    await asyncio.wait_for(p.proc.wait(), wait)
                    break
                except TimeoutError:
                    continue
            if p.reader is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(p.reader, 5.0)


# ------------------------------------------------------------------ the worker process's side
async def _serve(function: str, timeout_s: float, out_fd: int) -> None:
    def write(msg: dict[str, Any]) -> None:
        try:
            line = json.dumps(msg)
        except (TypeError, ValueError):  # a return value that is not JSON: reported as its repr (no reward)
            line = json.dumps(msg | {"value": repr(msg.get("value"))})
        os.write(out_fd, line.encode() + b"\n")

    try:
        mod, name = function.split(":")
        fn = getattr(importlib.import_module(mod), name)
    except BaseException as exc:
        write({"op": "fatal", "reason": traceback_tail(exc)})
        return
    from openai import AsyncOpenAI, DefaultAsyncHttpxClient

    http = DefaultAsyncHttpxClient(timeout=timeout_s)
    tasks: dict[str, asyncio.Task[Any]] = {}

    async def one(tid: str, base_url: str, key: str, task: dict[str, Any]) -> None:
        client = AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, http_client=http)
        try:
            value = await fn(client, task)
        except asyncio.CancelledError:
            return
        except BaseException as exc:
            write({"op": "result", "id": tid, "ok": False, "reason": function_failed(exc)})
        else:
            write({"op": "result", "id": tid, "ok": True, "value": value})
        finally:
            tasks.pop(tid, None)

    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    write({"op": "ready"})
    try:
        async for raw in reader:
            msg = json.loads(raw)
            tid = str(msg.get("id"))
            if msg.get("op") == "run":
                tasks[tid] = asyncio.ensure_future(one(tid, msg["base_url"], msg["key"], msg["task"]))
            elif msg.get("op") == "cancel" and tid in tasks:
                tasks[tid].cancel()
    finally:  # the driver closed our stdin (or died): nothing is waiting for the rest
        for t in list(tasks.values()):
            t.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        await http.aclose()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    out_fd = os.dup(1)  # the protocol's channel; fd 1 (print) goes to stderr from here on
    os.dup2(2, 1)
    asyncio.run(_serve(args[0], float(args[1]) if len(args) > 1 else 600.0, out_fd))


if __name__ == "__main__":
    main()
