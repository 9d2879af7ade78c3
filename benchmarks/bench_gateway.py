"""The gateway's overhead per turn against calling the worker data plane directly (issue 19).

    .venv/bin/python benchmarks/bench_gateway.py [--sessions 1,64,1024] [--turns 3] [--time-factor 0.02]
        [--max-tokens 16] [--min-tokens N] [--tool-seconds 0] [--json out.json]

Three processes: an engine worker (`python -m agents.worker`, emulated engine, so a turn costs little
CPU), the gateway (this process, as in a rollout driver) and the load generator (its own process, so its
client CPU is not the gateway's). For each concurrency level the load generator runs the same shape of
trajectories twice, side by side in one run: straight to the worker's `/generate` with the context as
token ids (what the driver does for a built-in environment), then as OpenAI chat sessions through the
gateway (messages in, ChatML-templated, tokens accounted). Reported per turn, p50 / p95:
  * client latency direct vs through the gateway, and their difference;
  * the gateway's overhead paired per request: the client's latency less the response's
    `Server-Timing: engine;dur=` (the gateway's wait on the worker), i.e. everything the gateway adds to a
    turn (the extra loopback hop, its parsing, templating, accounting and encoding, and any queueing in its
    process) without the worker's queueing spread, which swamps the direct−gateway difference at 1,024;
  * the gateway's own time per turn, measured inside it: the handler's time minus the time awaiting the
    worker (parsing, templating, token accounting, response encoding);
  * CPU milliseconds per turn of each process (load generator, gateway, worker), from their own CPU clocks:
    where a closed loop of N sessions spends its time. Whichever process is at one core's worth of CPU sets
    the turns/s, and then a turn's latency is N / (turns/s) (Little's law), whatever its own work.
`--min-tokens N` draws each turn's length uniformly from [N, max-tokens] (seeded by session and turn, the
same in both modes; the emulated engine samples exactly the tokens asked for), as an agent's turns vary:
with every turn the same length, sequences admitted together finish together and their answers reach the
gateway and the load generator in bursts. `--tool-seconds T` gives each session an agent's tool time
between its turns (uniform in [0.5, 1.5]·T) and a start spread over [0, T], neither counted in a turn's
latency: with `--time-factor 1` and turns of ~200 tokens this is the agentic regime (decode of seconds,
tools of about a second), where 1,024 sessions ask about a hundred turns a second of the emulated H800,
not the thousands a second of a closed loop of 16-token turns at a 0.02 time factor.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.gateway import SECRET, WorkerProc  # noqa: E402 (after the path)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ---------------------------------------------------------------- the load generator (its own process)
async def loadgen(args: argparse.Namespace) -> None:
    import orjson
    from aiohttp import ClientSession, ClientTimeout, TCPConnector

    from agents.driver.link import collect_less
    from agents.gateway.app import SERVER_TIMING_HEADER
    from agents.gateway.chat import ByteChatFormat

    collect_less(args.sessions)  # the instrument's own collector pauses are not the gateway's
    fmt = ByteChatFormat()
    keys = json.loads(Path(args.keys).read_text()) if args.keys else []
    lat: list[float] = []
    engine: list[float] = []  # the gateway's Server-Timing engine;dur, seconds, per turn (gateway mode)
    first: list[bool] = []  # the session's first turn (its connection is opened with it)

    def length(i: int, t: int) -> int:
        lo = args.min_tokens or args.max_tokens
        return random.Random(i * 1000 + t + 7).randint(min(lo, args.max_tokens), args.max_tokens)

    async def tool(i: int, t: int) -> None:
        if args.tool_seconds > 0:
            rng = random.Random(i * 1000 + t)
            await asyncio.sleep(args.tool_seconds * (rng.random() if t < 0 else 0.5 + rng.random()))

    async with ClientSession(timeout=ClientTimeout(total=600), connector=TCPConnector(limit=0)) as http:

        async def direct(i: int) -> None:
            msgs = [{"role": "user", "content": f"session {i}: what is 2+3?"}]
            context = fmt.render(msgs, None)
            await tool(i, -1)
            for t in range(args.turns):
                if t:
                    await tool(i, t)
                body = {
                    "request_id": f"d{i}-{t}",
                    "prompt_tokens": context,
                    "sampling": {
                        "max_tokens": length(i, t),
                        "temperature": 1.0,
                        "seed": i * 100 + t,
                        "stop_at_eos": True,
                    },
                }
                t0 = time.perf_counter()
                async with http.post(
                    f"{args.url}/generate",
                    data=orjson.dumps(body),
                    headers={"Authorization": f"Bearer {SECRET}", "Content-Type": "application/json"},
                ) as r:
                    res = orjson.loads(await r.read())
                lat.append(time.perf_counter() - t0)
                context = (
                    context
                    + res["tokens"]
                    + fmt.closing(res["tokens"])
                    + fmt.delta([{"role": "user", "content": f"turn {t}: go on"}], None)
                )

        async def gateway(i: int) -> None:
            msgs = [{"role": "user", "content": f"session {i}: what is 2+3?"}]
            await tool(i, -1)
            for t in range(args.turns):
                if t:
                    await tool(i, t)
                body = {"model": "tiny", "messages": msgs, "max_tokens": length(i, t), "seed": i * 100 + t}
                t0 = time.perf_counter()
                async with http.post(
                    f"{args.url}/v1/chat/completions",
                    data=orjson.dumps(body),
                    headers={"Authorization": f"Bearer {keys[i]}", "Content-Type": "application/json"},
                ) as r:
                    res = orjson.loads(await r.read())
                lat.append(time.perf_counter() - t0)
                first.append(t == 0)
                if r.status != 200:
                    raise RuntimeError(res)
                engine.append(float(r.headers[SERVER_TIMING_HEADER].split(";dur=")[1]) / 1e3)
                msgs = [*msgs, res["choices"][0]["message"], {"role": "user", "content": f"turn {t}: go on"}]

        run = direct if args.mode == "direct" else gateway
        t0 = time.perf_counter()
        await asyncio.gather(*(run(i) for i in range(args.sessions)))
        wall = time.perf_counter() - t0
    out = {"latencies": lat, "engine": engine, "first": first, "wall_s": wall, "cpu_s": time.process_time()}
    print(json.dumps(out))


def proc_cpu_s(pid: int) -> float:
    """A process's user + system CPU seconds (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the gateway process
async def bench(args: argparse.Namespace) -> dict:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector

    from agents.driver.link import collect_less
    from agents.gateway.app import Gateway, serve
    from agents.gateway.backends import WorkerBackend
    from agents.gateway.chat import ByteChatFormat
    from agents.gateway.sessions import SessionStore

    env = dict(os.environ, PYTHONPATH=str(ROOT))  # the load generator's
    wproc = WorkerProc(engine="emulated", time_factor=args.time_factor)
    worker, wurl = wproc.proc, wproc.url
    try:
        results = []
        async with ClientSession(timeout=ClientTimeout(total=600), connector=TCPConnector(limit=0)) as http:
            backend = WorkerBackend([wurl], SECRET, http)
            waits: list[float] = []
            handler: list[float] = []

            class Timed:
                model = "tiny"

                def weight_version(self) -> int:
                    return backend.weight_version()

                async def generate(self, session, prompt, new, sampling):
                    t0 = time.perf_counter()
                    try:
                        return await backend.generate(session, prompt, new, sampling)
                    finally:
                        waits.append(time.perf_counter() - t0)

            class TimedGateway(Gateway):
                async def chat(self, request):
                    t0 = time.perf_counter()
                    try:
                        return await super().chat(request)
                    finally:
                        handler.append(time.perf_counter() - t0)

            gw = TimedGateway(ByteChatFormat(), Timed(), sessions=SessionStore(max_sessions=1 << 16))
            runner, gurl = await serve(gw)
            try:
                for n in args.sessions:
                    collect_less(n)  # the cyclic collector as a rollout driver of n trajectories tunes it
                    row: dict = {"sessions": n, "turns": args.turns}
                    for mode in ("direct", "gateway"):
                        keys_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)  # noqa: SIM115
                        sessions = [gw.open(f"b{n}-{i}") for i in range(n)] if mode == "gateway" else []
                        json.dump([s.key for s in sessions], keys_file)
                        keys_file.close()
                        waits.clear()
                        handler.clear()
                        cpu0, wcpu0 = time.process_time(), proc_cpu_s(worker.pid)
                        proc = await asyncio.create_subprocess_exec(
                            sys.executable,
                            __file__,
                            "--loadgen",
                            "--mode",
                            mode,
                            "--url",
                            wurl if mode == "direct" else gurl,
                            "--sessions",
                            str(n),
                            "--turns",
                            str(args.turns),
                            "--max-tokens",
                            str(args.max_tokens),
                            "--min-tokens",
                            str(args.min_tokens),
                            "--tool-seconds",
                            str(args.tool_seconds),
                            "--keys",
                            keys_file.name,
                            stdout=asyncio.subprocess.PIPE,
                            cwd=str(ROOT),
                            env=env,
                        )
                        out, _ = await proc.communicate()
                        os.unlink(keys_file.name)
                        data = json.loads(out.decode().strip().splitlines()[-1])
                        lat = data["latencies"]
                        row[mode] = {
                            "p50_ms": 1e3 * pct(lat, 0.5),
                            "p95_ms": 1e3 * pct(lat, 0.95),
                            "turns_per_s": len(lat) / data["wall_s"],
                            # CPU per turn, ms: the load generator (its whole process, start-up included),
                            # the gateway (this process; idle in direct mode), the worker
                            "cpu_ms_per_turn": {
                                "loadgen": 1e3 * data["cpu_s"] / len(lat),
                                "gateway": 1e3 * (time.process_time() - cpu0) / len(lat),
                                "worker": 1e3 * (proc_cpu_s(worker.pid) - wcpu0) / len(lat),
                            },
                            "gateway_cpu_share": (time.process_time() - cpu0) / data["wall_s"],
                        }
                        if mode == "gateway":
                            paired = [c - e for c, e in zip(lat, data["engine"])]
                            for name, keep in (("", None), ("_first_turns", True), ("_later_turns", False)):
                                xs = [x for x, f in zip(paired, data["first"]) if keep is None or f == keep]
                                row[f"paired_overhead_ms{name}"] = {
                                    "p50": 1e3 * pct(xs, 0.5),
                                    "p95": 1e3 * pct(xs, 0.95),
                                    "p99": 1e3 * pct(xs, 0.99),
                                }
                            own = [h - w for h, w in zip(handler, waits)]
                            row["gateway_own_ms"] = {
                                "p50": 1e3 * pct(own, 0.5),
                                "p95": 1e3 * pct(own, 0.95),
                                "mean": 1e3 * statistics.fmean(own) if own else float("nan"),
                            }
                            for s in sessions:
                                gw.close(s)
                    row["overhead_ms"] = {
                        "p50": row["gateway"]["p50_ms"] - row["direct"]["p50_ms"],
                        "p95": row["gateway"]["p95_ms"] - row["direct"]["p95_ms"],
                    }
                    results.append(row)
                    print(json.dumps(row), flush=True)
            finally:
                await runner.cleanup()
    finally:
        wproc.stop()
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.python_version()}",
        "time_factor": args.time_factor,
        "max_tokens": args.max_tokens,
        "min_tokens": args.min_tokens or args.max_tokens,
        "tool_seconds": args.tool_seconds,
        "rows": results,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", default="1,64,1024")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--time-factor", type=float, default=0.02, help="the emulated engine's time scale")
    p.add_argument("--max-tokens", type=int, default=16, help="tokens sampled per turn, at most")
    p.add_argument("--min-tokens", type=int, default=0, help="turn lengths uniform in [N, max-tokens] (0: fixed)")
    p.add_argument("--tool-seconds", type=float, default=0.0, help="an agent's mean tool time between turns")
    p.add_argument("--json", default="")
    p.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="direct", help=argparse.SUPPRESS)
    p.add_argument("--url", default="", help=argparse.SUPPRESS)
    p.add_argument("--keys", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.loadgen:
        args.sessions = int(args.sessions)
        asyncio.run(loadgen(args))
        return
    args.sessions = [int(x) for x in args.sessions.split(",")]
    out = asyncio.run(bench(args))
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
