"""One engine worker process: the engine behind an authenticated HTTP data plane.

`python -m agents.worker --engine torch|emulated|vllm --role colocated --port 0` with the shared
secret in env `PEARL_WORKER_SECRET` (given by the agent at spawn; the worker refuses to start
without one, on loopback too; `--host` is loopback unless its agent is reached from other hosts,
whose address it then binds: every call still needs the secret or the job's token). Prints one line
`PEARL_WORKER_READY {"port": ..., "pid": ...}` when it serves. Partial outputs of in-flight
requests are journaled to `<state-dir>/inflight.json` so that if the process dies, its agent
reports them instead of losing them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import ClientError, ClientSession, ClientTimeout, web

from agents import dataplane as dp
from agents.engines.base import Engine, EngineError, EngineNotFound
from agents.process import die_with_parent, orphaned, serve_until_signal, visible_devices
from controlplane.core import telemetry as tm
from controlplane.core.wire import ErrorReply, WireError

JOURNAL_PERIOD_S = 0.2
AUTHENTICATED = web.RequestKey("authenticated", bool)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, message: str) -> web.Response:
    return _json(dp.DATA_PLANE.dump(ErrorReply(detail=message)), status=status)


def _json(data: Any, status: int = 200) -> web.Response:
    """A JSON response, encoded with orjson: token lists of tens of thousands of ids, every turn."""
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


class WorkerServer:
    # what the job's rollout driver may call with the job's data-plane token (the rest is the agent's)
    DRIVER_VERBS = frozenset({"/generate", "/prefill", "/decode", "/abort", "/stats", "/health"})

    def __init__(self, engine: Engine, secret: str, *, state_dir: Path | None = None, job_token: str = "") -> None:
        if not secret:
            raise ValueError("a worker secret is required (fail closed)")
        self.engine = engine
        self.secret = secret
        self.job_token = job_token
        self.state_dir = state_dir
        self.epoch = 0
        self._session: ClientSession | None = None
        self._journal_task: asyncio.Task | None = None
        self._last_journal = b""
        self.app = web.Application(client_max_size=dp.MAX_REQUEST_BYTES, middlewares=[self._errors, self._auth])
        r = self.app.router
        r.add_post("/generate", self.generate)
        r.add_post("/prefill", self.prefill)
        r.add_post("/decode", self.decode)
        r.add_get("/kv/{handle}", self.kv)
        r.add_post("/abort", self.abort)
        r.add_post("/drain", self.drain)
        r.add_post("/resume", self.resume)
        r.add_post("/sleep", self.sleep)
        r.add_post("/wake", self.wake)
        r.add_post("/weights", self.weights)
        r.add_post("/role", self.role)
        r.add_get("/stats", self.stats)
        r.add_get("/health", self.health)
        r.add_get("/telemetry", self.telemetry)
        r.add_get("/inflight", self.inflight)
        self.app.on_startup.append(self._startup)
        self.app.on_cleanup.append(self._cleanup)

    # ---- plumbing
    async def _startup(self, _app: web.Application) -> None:
        await self.engine.start()
        self._session = ClientSession(timeout=ClientTimeout(total=300))
        if self.state_dir is not None:
            self._journal_task = asyncio.create_task(self._journal_loop())

    async def _cleanup(self, _app: web.Application) -> None:
        if self._journal_task:
            self._journal_task.cancel()
        await self.engine.shutdown()
        if self._session:
            await self._session.close()

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except WireError as exc:
            return _error(400, str(exc))
        except EngineError as exc:
            return _error(exc.status, str(exc))
        except web.HTTPException as exc:
            if exc.status >= 400 and exc.content_type != "application/json":
                return _error(exc.status, exc.reason or "error")
            raise

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get(dp.AUTH_HEADER, "")
        presented = header[7:].encode() if header.startswith("Bearer ") else b""
        ok = bool(presented) and secrets.compare_digest(presented, self.secret.encode())
        if (
            not ok
            and self.job_token
            and request.path in self.DRIVER_VERBS
            and secrets.compare_digest(presented, self.job_token.encode())
        ):
            ok = True
        if not ok and not (request.path.startswith("/kv/") and dp.KV_TOKEN_HEADER in request.headers):
            return _error(401, "missing or bad worker secret")
        request[AUTHENTICATED] = ok
        return await handler(request)

    async def _body(self, request: web.Request, cls: type) -> Any:
        if request.content_length is not None and request.content_length > dp.MAX_REQUEST_BYTES:
            return _error(413, f"body larger than {dp.MAX_REQUEST_BYTES} bytes")
        raw = await request.read()  # aiohttp enforces client_max_size (413) even with a lying Content-Length
        try:
            data = dp.DATA_PLANE.decode(raw or b"{}")
        except WireError as exc:
            raise WireError(f"body is not JSON: {exc}") from exc
        return dp.DATA_PLANE.parse(data, cls)

    def _fence(self, request: web.Request) -> None:
        """Control verbs may carry the agent's epoch; an older one than seen is a stale command."""
        raw = request.headers.get(dp.EPOCH_HEADER)
        if raw is None:
            return
        try:
            epoch = int(raw)
        except ValueError as exc:
            raise WireError("bad epoch header") from exc
        if epoch < self.epoch:
            raise EngineError(f"stale epoch {epoch} < {self.epoch}", 409)
        self.epoch = epoch

    def _prompt(self, req: dp.GenerateRequest) -> list[int]:
        tokens = req.prompt_tokens or (self.engine.tokenizer.encode(req.prompt) if req.prompt else [])
        if not tokens:
            raise WireError("empty prompt")
        if len(tokens) > dp.MAX_PROMPT_TOKENS:
            raise WireError(f"prompt longer than {dp.MAX_PROMPT_TOKENS} tokens")
        vocab = getattr(self.engine, "vocab_size", 2**31)
        if max(tokens) >= vocab:
            raise WireError(f"token id {max(tokens)} outside the vocabulary ({vocab})")
        return tokens

    # ---- data plane
    async def generate(self, request: web.Request) -> web.Response:
        req = await self._body(request, dp.GenerateRequest)
        if isinstance(req, web.Response):
            return req
        self.engine.admit("generate", req.min_weight_version)
        return _json(dp.DATA_PLANE.dump(await self.engine.generate(req, self._prompt(req))))

    async def prefill(self, request: web.Request) -> web.Response:
        req = await self._body(request, dp.GenerateRequest)
        if isinstance(req, web.Response):
            return req
        self.engine.admit("prefill", req.min_weight_version)
        return _json(dp.DATA_PLANE.dump(await self.engine.prefill(req, self._prompt(req))))

    async def decode(self, request: web.Request) -> web.Response:
        req = await self._body(request, dp.DecodeRequest)
        if isinstance(req, web.Response):
            return req
        self.engine.admit("decode", req.min_weight_version)
        t0 = time.perf_counter()
        data = await self._pull_kv(req)
        dt = time.perf_counter() - t0
        if not getattr(self.engine, "reports_kv_transfer", False):  # vLLM reports NIXL's own bytes and seconds
            self.engine.telemetry.append(
                tm.kv_transfer(
                    time_s=time.time(),
                    job=req.job or self.engine.job,
                    worker=self.engine.worker_id,
                    kv_bytes=len(data),
                    duration_s=dt,
                )
            )
        return _json(dp.DATA_PLANE.dump(await self.engine.decode(req, data)))

    async def _pull_kv(self, req: dp.DecodeRequest) -> bytes:
        """The decode worker PULLS the cache from the prefill worker (as vLLM's NIXL path does)."""
        assert self._session is not None
        url = f"{req.kv_url.rstrip('/')}/kv/{req.handle}"
        try:
            async with self._session.get(url, headers={dp.KV_TOKEN_HEADER: req.kv_token}) as resp:
                if resp.status == 404:
                    raise EngineNotFound(f"unknown KV handle {req.handle!r} at {req.kv_url}")
                if resp.status != 200:
                    raise EngineError(f"KV pull from {req.kv_url} failed: HTTP {resp.status}", 502)
                if (resp.content_length or 0) > dp.MAX_KV_BYTES:
                    raise EngineError("KV cache too large", 413)
                try:
                    return await dp.read_capped(resp.content, dp.MAX_KV_BYTES)
                except WireError as exc:
                    raise EngineError(f"KV cache too large: {exc}", 413) from exc
        except ClientError as exc:
            raise EngineError(f"KV pull from {req.kv_url} failed: {exc}", 502) from exc

    async def kv(self, request: web.Request) -> web.Response:
        token = None if request.get(AUTHENTICATED) else request.headers.get(dp.KV_TOKEN_HEADER, "")
        data = self.engine.pull_kv(request.match_info["handle"], token)
        return web.Response(body=data, content_type="application/octet-stream")

    async def abort(self, request: web.Request) -> web.Response:
        req = await self._body(request, dp.AbortRequest)
        if isinstance(req, web.Response):
            return req
        result = await self.engine.abort(req.request_id)
        if result is None:
            raise EngineNotFound(f"no in-flight request {req.request_id!r}")
        return _json(dp.DATA_PLANE.dump(result))

    # ---- control verbs (from the agent)
    async def drain(self, request: web.Request) -> web.Response:
        self._fence(request)
        req = await self._body(request, dp.DrainRequest)
        if isinstance(req, web.Response):
            return req
        aborted, in_time = await self.engine.drain(req.mode, req.timeout_s)
        return _json(dp.DATA_PLANE.dump(dp.DrainResult(aborted=aborted, finished_in_time=in_time)))

    async def resume(self, request: web.Request) -> web.Response:
        self._fence(request)
        self.engine.resume()
        return await self.health(request)

    async def sleep(self, request: web.Request) -> web.Response:
        self._fence(request)
        req = await self._body(request, dp.SleepRequest)
        if isinstance(req, web.Response):
            return req
        await self.engine.sleep(req.level)
        return await self.health(request)

    async def wake(self, request: web.Request) -> web.Response:
        self._fence(request)
        await self.engine.wake()
        return await self.health(request)

    async def role(self, request: web.Request) -> web.Response:
        self._fence(request)
        req = await self._body(request, dp.SetRoleRequest)
        if isinstance(req, web.Response):
            return req
        self.engine.set_role(req.role)
        return await self.health(request)

    async def weights(self, request: web.Request) -> web.Response:
        self._fence(request)
        req = await self._body(request, dp.LoadWeightsRequest)
        if isinstance(req, web.Response):
            return req
        from agents.worker_client import fetch_weights

        assert self._session is not None
        version, data = await fetch_weights(self._session, req.url, req.version, req.token)
        if version < self.engine.weight_version:
            raise EngineError(f"refusing to go back from weight version {self.engine.weight_version} to {version}", 409)
        if version != self.engine.weight_version:
            await self.engine.load_weights(version, data)
        return await self.health(request)

    # ---- observation
    async def stats(self, request: web.Request) -> web.Response:
        return _json(dp.DATA_PLANE.dump(self.engine.stats(self.epoch)))

    async def health(self, request: web.Request) -> web.Response:
        e = self.engine
        return _json(
            dp.DATA_PLANE.dump(
                dp.Health(
                    ok=True,
                    worker_id=e.worker_id,
                    role=e.role,
                    state=e.state,
                    weight_version=e.weight_version,
                    pid=os.getpid(),
                    devices=visible_devices(),
                    sleep_mode=getattr(e, "sleep_mode", "pause"),
                )
            )
        )

    async def telemetry(self, request: web.Request) -> web.Response:
        return _json(dp.DATA_PLANE.dump(dp.TelemetryRecords(self.engine.take_telemetry())))

    async def inflight(self, request: web.Request) -> web.Response:
        return _json(dp.DATA_PLANE.dump(dp.InflightRequests(self.engine.inflight())))

    async def _journal_loop(self) -> None:
        assert self.state_dir is not None
        path = self.state_dir / "inflight.json"
        period = JOURNAL_PERIOD_S
        while True:
            await asyncio.sleep(period)
            t0 = time.perf_counter()
            self.write_journal(path)
            # keep journaling under ~5% of the loop even with thousands of long sequences
            period = max(JOURNAL_PERIOD_S, 20 * (time.perf_counter() - t0))

    def write_journal(self, path: Path, inflight: list[dict[str, Any]] | None = None) -> None:
        entries = orjson.dumps(self.engine.inflight() if inflight is None else inflight)
        if entries == self._last_journal:  # nothing progressed: the file on disk says the same
            return
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(b'{"pid": %d, "time": %r, "inflight": %b}' % (os.getpid(), time.time(), entries))
        os.replace(tmp, path)
        self._last_journal = entries


async def serve(args: argparse.Namespace, secret: str) -> None:
    from agents.engines import build_engine

    engine = build_engine(
        args.engine,
        model=args.model,
        worker_id=args.worker_id,
        role=args.role,
        job=args.job,
        hardware=args.hardware,
        time_factor=args.time_factor,
        tp=args.tp,
        threads=args.threads,
        interference=args.interference,
    )
    state_dir = Path(args.state_dir) if args.state_dir else None
    if state_dir:
        state_dir.mkdir(parents=True, exist_ok=True)
    server = WorkerServer(engine, secret, state_dir=state_dir, job_token=os.environ.get("PEARL_JOB_TOKEN", ""))
    runner, port, stop = await serve_until_signal(server.app, args.host, args.port)
    if state_dir:
        (state_dir / "endpoint.json").write_text(json.dumps({"port": port, "pid": os.getpid()}))
    print("PEARL_WORKER_READY " + json.dumps({"port": port, "pid": os.getpid()}), flush=True)
    await stop.wait()
    # graceful: stop admitting, let in-flight work finish briefly, abort the rest with partials; an
    # orphan (its agent died) aborts at once: nobody will route to it again, the journal keeps the partials
    alone = orphaned()
    aborted, _ = await engine.drain("abort" if alone else "wait", args.drain_timeout)
    if state_dir:
        if server._journal_task:  # the periodic journal must not overwrite the final one
            server._journal_task.cancel()
        (state_dir / "aborted.json").write_text(json.dumps([dp.DATA_PLANE.dump(a) for a in aborted]))
        server._last_journal = b""
        # an orphan's drain answer reached no agent: its journal keeps the partials for the next one
        server.write_journal(state_dir / "inflight.json", [dp.DATA_PLANE.dump(a) for a in aborted] if alone else None)
    await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m agents.worker", description=__doc__)
    p.add_argument("--engine", choices=["torch", "emulated", "vllm"], default="emulated")
    p.add_argument("--role", choices=list(dp.ROLES), default="colocated")
    p.add_argument("--worker-id", type=int, default=0)
    p.add_argument("--model", default="tiny")
    p.add_argument("--job", default="")
    p.add_argument("--hardware", default="H800")
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--time-factor", type=float, default=1.0)
    p.add_argument(
        "--interference",
        type=float,
        default=1.0,
        help="emulated engine: prefill next to running decodes costs this x its roofline time",
    )
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--state-dir", default="")
    p.add_argument("--drain-timeout", type=float, default=10.0)
    p.add_argument(
        "--insecure-public",
        action="store_true",
        help="accepted for old launchers; a non-loopback --host is allowed because every call needs the secret",
    )
    args = p.parse_args(argv)
    secret = os.environ.get("PEARL_WORKER_SECRET", "")
    if not secret:  # fail closed, on loopback too: only the agent and the job's driver may call a worker
        sys.exit("PEARL_WORKER_SECRET is not set: refusing to serve without auth")
    die_with_parent()
    asyncio.run(serve(args, secret))


if __name__ == "__main__":
    main()
