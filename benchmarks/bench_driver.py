"""The rollout driver's cost per turn at B·G up to 1,024 concurrent trajectories (issue 22, item 4).

    .venv/bin/python benchmarks/bench_driver.py [--trajectories 64,128,256,512,1024] [--group 16]
        [--turns 8] [--workers 4] [--warmup 3] [--duration 10] [--instrument] [--http-only]
        [--py-spy DIR] [--json out.json]

Three kinds of process, so the driver's one core is measured alone (each is pinned, when the machine has
more than one CPU: the driver on CPU 0, the rest on the others):
  * the driver: the real `agents.driver` (`run_driver`: driver link, `RolloutDriver`, core's loop and router,
    `WorkerClient` over aiohttp), with one benchmark environment registered (`bench-turns`: `--turns` turns of
    a short context, no tool latency, so the driver's own work is all there is);
  * a stand-in control plane and trainer (aiohttp: `/ws/driver/` speaking `core.driver_link`, parsing every
    report as the real consumer does; `/samples` and `/step` answering at once, the weight version pushed);
  * `--workers` stand-in engine workers, each a bare asyncio HTTP/1.1 server answering `/generate` at once
    (the data plane's JSON, `max_tokens` tokens).

Per trajectory count: turns/s, the driver's process CPU per turn (user + system, `getrusage`) and what one core
of it would route (1 / CPU per turn). With `--instrument`, the CPU (thread time) of the driver's synchronous
parts per turn: the loop (state machine, of which the router), telemetry (records to JSON, their reports'
encoding), checkpoints (the loop's state and its report's encoding), progress; the rest is HTTP (aiohttp and
the worker client), asyncio and the episodes. `--http-only` measures the HTTP part alone: the same turns'
requests through `WorkerClient` from as many concurrent callers, without the loop. `--py-spy DIR` records a
profile of the driver (py-spy, `--format raw`: collapsed stacks) per trajectory count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOKEN = "bench-token"
JOB = "bench"
PROMPT = 64  # first prompt tokens
OBSERVATION = 16  # tokens an environment step appends
RESPONSE = 16  # tokens a turn generates


# ---------------------------------------------------------------- stand-in engine worker (its own process)
def _generated(body: bytes) -> bytes:
    import orjson

    req = orjson.loads(body)
    n = int(req.get("sampling", {}).get("max_tokens", RESPONSE))
    return orjson.dumps(
        {
            "request_id": req["request_id"],
            "tokens": [65] * n,
            "logprobs": [-0.5] * n,
            "finish_reason": "length",
            "prompt_len": len(req.get("prompt_tokens", ())),
            # the weights the turn asked for at least: no trajectory goes stale here
            "weight_version": int(req.get("min_weight_version", 0)),
        }
    )


class _StubHTTP(asyncio.Protocol):
    """HTTP/1.1 keep-alive, Content-Length bodies, every POST answered 200 with a generation result."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.tr: Any = transport
        self.buf = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            at = head.find(b"content-length:")
            n = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
            if len(self.buf) < end + 4 + n:
                return
            body = bytes(self.buf[end + 4 : end + 4 + n])
            del self.buf[: end + 4 + n]
            out = _generated(body) if head.startswith(b"post") else b"{}"
            self.tr.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(out), out)
            )


async def worker_main() -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(_StubHTTP, "127.0.0.1", 0, backlog=2048)
    print(f"READY {server.sockets[0].getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


# ---------------------------------------------------------------- stand-in control plane and trainer
async def control_plane_main(args: argparse.Namespace) -> None:
    from aiohttp import WSMsgType, web

    from controlplane.core import driver_link as dl
    from controlplane.core.context import Signal
    from controlplane.core.state import Role

    endpoints = args.endpoints.split(",")
    job = dl.JobView(
        name=JOB,
        environment="bench-turns",
        model="qwen3-8b",
        engine="emulated",
        batch_size=args.batch,
        group_size=args.group,
        max_staleness=1,
        max_trajectory_tokens=32768,
        return_deadline_s=30.0,
    )
    workers = [dl.RoutableWorker(i, Role.COLOCATED, e) for i, e in enumerate(endpoints)]
    state: dict[str, Any] = {"version": 0, "training": False, "port": 0}
    sockets: list[web.WebSocketResponse] = []
    stats: dict[str, list[int]] = {}  # message type -> [count, bytes]

    def cluster() -> dl.ClusterView:
        return dl.ClusterView(
            workers, state["version"], state["training"], 0, trainer=f"http://127.0.0.1:{state['port']}"
        )

    async def push() -> None:
        frame = json.dumps(dl.DRIVER_LINK.dump(cluster()))
        for ws in sockets:
            await ws.send_str(frame)

    async def driver_ws(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.Response(status=403)
        ws = web.WebSocketResponse(max_msg_size=dl.MAX_CHECKPOINT_BYTES * 2)
        await ws.prepare(request)
        sockets.append(ws)
        async for raw in ws:
            if raw.type != WSMsgType.TEXT:
                continue
            msg = dl.DRIVER_LINK.parse(
                json.loads(raw.data), dl.DRIVER_MESSAGES
            )  # as the real consumer parses every report
            s = stats.setdefault(msg.type, [0, 0])
            s[0] += 1
            s[1] += len(raw.data)
            if isinstance(msg, dl.Hello):
                await ws.send_str(json.dumps(dl.DRIVER_LINK.dump(dl.Welcome(job, cluster(), TOKEN))))
            elif isinstance(msg, dl.SignalReport) and msg.signal in (Signal.TRAINING_BEGIN, Signal.TRAINING_FINISHED):
                state["training"] = msg.signal is Signal.TRAINING_BEGIN
                await push()
            elif isinstance(msg, dl.UpdateRequest):
                await ws.send_str(json.dumps(dl.DRIVER_LINK.dump(dl.UpdateGranted(msg.step))))
        sockets.remove(ws)
        Path(args.stats).write_text(json.dumps(stats))
        return ws

    async def samples(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"accepted": 1})

    async def step(request: web.Request) -> web.Response:
        body = await request.json()
        state["version"] = max(state["version"], int(body["step"]) + 1)
        await push()
        n = len(body["trajectories"])
        return web.json_response(
            {"version": state["version"], "step": {"loss": 0.0, "mean_reward": 0.5, "accepted": n}}
        )

    app = web.Application(client_max_size=64 << 20)
    app.router.add_get("/ws/driver/", driver_ws)
    app.router.add_post("/samples", samples)
    app.router.add_post("/step", step)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(f"READY {state['port']}", flush=True)
    await asyncio.Event().wait()


# ---------------------------------------------------------------- the driver process
def _register_env(turns: int) -> None:
    from agents.envs import Environment, Turn, register

    class BenchTurns(Environment):
        """`turns` turns, a short context, no tool latency: all that is left is the driver's own work."""

        def __init__(self, *, task: int, member: int = 0, **_: object) -> None:
            self.k = 0
            self.member = member

        async def reset(self) -> Turn:
            return Turn([1] * PROMPT, max_tokens=RESPONSE)

        async def step(self, response: list[int]) -> Turn:
            self.k += 1
            if self.k >= turns:
                return Turn([], done=True, reward=float(self.member % 2))
            return Turn([2] * OBSERVATION, max_tokens=RESPONSE)

    register("bench-turns", BenchTurns)


class Sections:
    """CPU (thread time) spent in named synchronous sections of the driver, wrapped around methods."""

    def __init__(self) -> None:
        self.t: dict[str, list[float]] = {}

    def wrap(self, owner: Any, name: str, section: str | Any) -> None:
        fn = getattr(owner, name, None)
        if fn is None:  # not in this version of the driver
            return
        clock, t = time.thread_time, self.t

        def timed(*a: Any, **kw: Any) -> Any:
            key = section if isinstance(section, str) else section(*a)
            t0 = clock()
            try:
                return fn(*a, **kw)
            finally:
                s = t.setdefault(key, [0, 0.0])
                s[0] += 1
                s[1] += clock() - t0

        import inspect

        static = isinstance(inspect.getattr_static(owner, name), staticmethod)
        setattr(owner, name, staticmethod(timed) if static else timed)

    def snapshot(self) -> dict[str, list[float]]:
        return {k: list(v) for k, v in self.t.items()}

    def watch_gc(self) -> None:
        """The garbage collector's pauses, as section `gc` (they land on whatever allocates)."""
        import gc

        clock, t, started = time.thread_time, self.t, [0.0]

        def callback(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                started[0] = clock()
            else:
                s = t.setdefault(f"gc{info['generation']}", [0, 0.0])
                s[0] += 1
                s[1] += clock() - started[0]

        gc.callbacks.append(callback)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _measure(driver: Any, args: argparse.Namespace, sections: Sections | None) -> None:
    await asyncio.sleep(args.warmup)
    Path(args.stats + ".start").write_text("")  # for a profiler to start now
    t0, c0, n0 = time.monotonic(), _cpu(), driver.turns
    s0 = sections.snapshot() if sections else {}
    await asyncio.sleep(args.duration)
    t1, c1, n1 = time.monotonic(), _cpu(), driver.turns
    s1 = sections.snapshot() if sections else {}
    turns = max(1, n1 - n0)
    out = {
        "trajectories": args.batch,
        "turns": n1 - n0,
        "wall_s": t1 - t0,
        "cpu_s": c1 - c0,
        "turns_per_s": (n1 - n0) / (t1 - t0),
        "cpu_us_per_turn": (c1 - c0) / turns * 1e6,
        "steps": driver.loop.step,
        "sections_us_per_turn": {
            k: (v[1] - s0.get(k, [0, 0.0])[1]) / turns * 1e6 for k, v in s1.items() if v[0] > s0.get(k, [0, 0.0])[0]
        },
        "sections_calls_per_turn": {
            k: (v[0] - s0.get(k, [0, 0.0])[0]) / turns for k, v in s1.items() if v[0] > s0.get(k, [0, 0.0])[0]
        },
    }
    Path(args.stats).write_text(json.dumps(out))
    driver.stop()


def driver_main(args: argparse.Namespace) -> None:
    import agents.driver.link as lk
    from agents.driver.rollout import RolloutDriver
    from controlplane.core import telemetry as tm

    _register_env(args.turns)
    sections = Sections() if args.instrument else None
    if sections is not None:
        from controlplane.core import driver_link as dl
        from controlplane.core.loop import RolloutLoop
        from controlplane.core.router import Router

        sections.watch_gc()
        sections.wrap(RolloutLoop, "handle", "loop")
        sections.wrap(Router, "pick_first", "router")
        sections.wrap(RolloutDriver, "telemetry", "telemetry")
        sections.wrap(RolloutDriver, "_checkpoint_due", "checkpoint")
        sections.wrap(RolloutLoop, "checkpoint", "checkpoint:encode")
        sections.wrap(lk.ControlLink, "encode", lambda msg: f"wire:{msg.type}")
        sections.wrap(dl, "dump", lambda msg: f"wire-dump:{msg.type}")

    class BenchDriver(RolloutDriver):
        turns = 0

        def telemetry(self, cmd: Any) -> None:
            if cmd.record.kind is tm.RecordKind.TURN:
                self.turns += 1
            super().telemetry(cmd)

        async def run(self) -> None:
            task = asyncio.ensure_future(_measure(self, args, sections))
            try:
                await super().run()
            finally:
                task.cancel()

    lk.RolloutDriver = BenchDriver  # type: ignore[misc]
    asyncio.run(lk.run_driver(args.control_plane, JOB, TOKEN))


async def http_only_main(args: argparse.Namespace) -> None:
    """The turns' requests alone: `batch` callers, each a trajectory's turns through `WorkerClient`."""
    from agents import dataplane as dp
    from agents.worker_client import WorkerClient, session

    endpoints = args.endpoints.split(",")
    done = [0]
    stop = asyncio.Event()

    async def caller(i: int, http: Any) -> None:
        client = WorkerClient(endpoints[i % len(endpoints)], TOKEN, http)
        while not stop.is_set():
            context = [1] * PROMPT
            for k in range(args.turns):
                req = dp.GenerateRequest(
                    request_id=f"t{i}-{k}",
                    prompt_tokens=context,
                    sampling=dp.SamplingParams(max_tokens=RESPONSE, temperature=1.0, seed=i),
                    job=JOB,
                )
                res = await client.generate(req)
                context = context + list(res.tokens) + [2] * OBSERVATION
                done[0] += 1

    class Counter:
        loop = type("L", (), {"step": 0})()

        @property
        def turns(self) -> int:
            return done[0]

        def stop(self) -> None:
            stop.set()

    async with session() as http:
        tasks = [asyncio.ensure_future(caller(i, http)) for i in range(args.batch)]
        await _measure(Counter(), args, None)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# ---------------------------------------------------------------- the harness
def _spawn(argv: list[str], cpus: set[int] | None) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, *argv], stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True
    )
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("READY"):
        proc.kill()
        raise RuntimeError(f"{argv[0]} did not start: {line!r}")
    return proc, int(line.split()[1])


def run_one(args: argparse.Namespace, batch: int, tmp: Path) -> dict[str, Any]:
    ncpu = os.cpu_count() or 1
    driver_cpus, other_cpus = ({0}, set(range(1, ncpu))) if ncpu > 1 and not args.no_pin else (None, None)
    procs: list[subprocess.Popen[Any]] = []
    try:
        ports = []
        for _ in range(args.workers):
            p, port = _spawn(["worker"], other_cpus)
            procs.append(p)
            ports.append(port)
        endpoints = ",".join(f"http://127.0.0.1:{p}" for p in ports)
        stats, cp_stats = tmp / f"driver-{batch}.json", tmp / f"cp-{batch}.json"
        common = [f"--batch={batch}", f"--group={args.group}", f"--turns={args.turns}", f"--endpoints={endpoints}"]
        common += [f"--warmup={args.warmup}", f"--duration={args.duration}", f"--stats={stats}"]
        if args.http_only:
            cmd = [sys.executable, __file__, "http", *common]
        else:
            cp, cp_port = _spawn(["cp", *common, f"--stats={cp_stats}"], other_cpus)
            procs.append(cp)
            cmd = [sys.executable, __file__, "driver", *common, f"--control-plane=http://127.0.0.1:{cp_port}"]
            if args.instrument:
                cmd.append("--instrument")
        drv = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
        procs.append(drv)
        if driver_cpus:
            os.sched_setaffinity(drv.pid, driver_cpus)
        spy = None
        if args.py_spy:
            out = Path(args.py_spy) / f"driver-{batch}{'-http' if args.http_only else ''}.txt"
            spy_bin = Path(sys.executable).parent / "py-spy"
            while not Path(f"{stats}.start").exists() and drv.poll() is None:
                time.sleep(0.05)
            spy_args = ["record", "-p", str(drv.pid), "-d", str(int(args.duration)), "-r", "200", "--format", "raw"]
            spy = subprocess.Popen(
                [str(spy_bin), *spy_args, "-o", str(out), "--nonblocking"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        drv.wait(timeout=args.warmup + args.duration + 120)
        if spy is not None:
            spy.wait(timeout=60)
        result: dict[str, Any] = json.loads(stats.read_text())
        if drv.returncode != 0:
            raise RuntimeError(f"the driver exited with {drv.returncode}")
        time.sleep(0.3)  # the control plane writes its counts when the driver's socket closes
        if cp_stats.exists():
            result["reports"] = json.loads(cp_stats.read_text())
        return result
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def harness(args: argparse.Namespace) -> None:
    sizes = [int(x) for x in args.trajectories.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for b in sizes:
            r = run_one(args, b, Path(d))
            rows.append(r)
            sec = r.get("sections_us_per_turn", {})
            ck = r.get("reports", {}).get("checkpoint", [0, 0])
            print(
                f"B·G={b:5d}  {r['turns_per_s']:7.0f} turns/s  {r['cpu_us_per_turn']:6.0f} µs CPU/turn "
                f"(one core: {1e6 / max(1e-9, r['cpu_us_per_turn']):5.0f} turns/s)  steps {r['steps']}"
                + (f"  checkpoints {ck[0]} × {ck[1] / max(1, ck[0]) / 1024:.0f} KiB" if ck[0] else ""),
                flush=True,
            )
            if sec:
                print("        " + "  ".join(f"{k} {v:.1f}" for k, v in sorted(sec.items())) + "  (µs/turn)")
    report = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
        "args": vars(args),
        "rows": rows,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", nargs="?", default="harness", choices=["harness", "worker", "cp", "driver", "http"])
    p.add_argument("--trajectories", default="64,128,256,512,1024")
    p.add_argument("--group", type=int, default=16)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--instrument", action="store_true")
    p.add_argument("--http-only", action="store_true")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--py-spy", default="")
    p.add_argument("--json", default="")
    # the sub-processes'
    p.add_argument("--batch", type=int, default=0)
    p.add_argument("--endpoints", default="")
    p.add_argument("--stats", default="")
    p.add_argument("--control-plane", default="")
    args = p.parse_args()
    if args.role == "worker":
        asyncio.run(worker_main())
    elif args.role == "cp":
        asyncio.run(control_plane_main(args))
    elif args.role == "driver":
        driver_main(args)
    elif args.role == "http":
        asyncio.run(http_only_main(args))
    else:
        harness(args)


if __name__ == "__main__":
    main()
