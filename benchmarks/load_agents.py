"""Load generator for bench_load.py: emulated node agents in this process, over real websockets, speaking the
real agent link (register, then heartbeats reporting two workers, and telemetry every few beats).

Reads a JSON spec on stdin: {"urls": [...], "agents": [[name, token, [worker ids]], ...], "offset": i,
"period": s, "duration": s, "probe_every": k, "change_every": k, "job": name} (see `main` for the handshake);
writes one JSON line of results on stdout.

With "reconcile": true in the spec (bench_plan_scale.py) an agent reports its desired state instead of a fixed
pair of workers: every desired worker running in its role and activity at the weights the job allows, idle,
sent in a heartbeat at once after each desired state (the real agent heartbeats as soon as a reconcile changed
something); "slots" and "pool" set what it registers, "slow": {name: delay s} delays a node's reports (a
negative delay: it never reports a change), and the results count the desired states each node got after the
go line ("desired_counts"). A {"stop": true} line on stdin ends the run.

With "storm": true (bench_load.py --storm) every agent connects at a uniform moment within one second of the
spec, with no cap on handshakes in flight, and keeps its link as the product's node agent does: a link that
closes or fails is reconnected with the jittered exponential backoff of `agents.reconnect` (0.2 s doubling to
RECONNECT_BACKOFF_MAX_S, at least as long as a failed attempt took; a handshake given up after
HANDSHAKE_TIMEOUT_S), and re-registers; a desired state with a newer epoch than its socket's (its lease
was lost) is adopted and heartbeated at. A {"storm": t} line makes every agent whose link is down connect again
within one second of t (the bench restarted Daphne). The results carry timestamps (registrations, dropped
links, lease-lost notices, refused heartbeats) and the heartbeats sent per second, which the bench counts
per window; no "READY" line is written.

Measured here, per heartbeat of a probing agent (every `probe_every`-th agent): heartbeat sent -> lease
renewed. The link answers nothing to a heartbeat, so right after it the agent sends a frame the server
refuses at once (`{"type": "probe"}`: unknown message type); a consumer handles its socket's frames one at a
time, in order, so that error reply comes back only once the heartbeat was handled (lease renewed, or
refused). Every `change_every`-th agent reports its workers idle and busy in turn, one heartbeat each (a
report the database must store: a count that moves while busy is no change to it; its dashboard delta is
timed by bench_load.py against the send times written here). With `busy`, the others' in-flight counts move
every beat while they stay busy (a loaded cluster's reports).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector, WSMsgType

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout: agents.*
from agents.node.session import RECONNECT_BACKOFF_MAX_S
from agents.reconnect import HANDSHAKE_TIMEOUT_S, LINK_ERRORS, failed_delay

TAIL_S = 10.0  # heartbeats go on this long after the measured window
CONNECTS_AT_ONCE = 16  # registrations in flight per generator process


def fixed_report(workers: list[int], generation: int, *, inflight: int = 1) -> list[dict[str, Any]]:
    """A node's report without "reconcile": its workers running colocated and active, `inflight` each."""
    return [
        {
            "worker_id": w,
            "role": "colocated",
            "activity": "active",
            "state": "running",
            "weight_version": 0,
            "endpoint": "",
            "inflight": inflight,
            "generation": generation,
            "devices": [i],
        }
        for i, w in enumerate(workers)
    ]


async def agent(
    session: ClientSession,
    url: str,
    idx: int,
    spec: list[Any],
    cfg: dict[str, Any],
    out: dict[str, Any],
    window: dict[str, float],
    all_registered: asyncio.Event,
    connecting: asyncio.Semaphore,
) -> None:
    name, token, workers = spec
    period = float(cfg["period"])
    reconcile = bool(cfg.get("reconcile"))
    delay = float(cfg.get("slow", {}).get(name, 0.0))
    probe = idx % int(cfg["probe_every"]) == 0
    change = int(cfg["change_every"]) > 0 and idx % int(cfg["change_every"]) == 1
    await connecting.acquire()  # a few handshakes at a time: a storm of them times out on a loaded server
    async with session.ws_connect(
        url, headers={"Authorization": f"Bearer {token}"}, max_msg_size=0, heartbeat=None
    ) as ws:
        await ws.send_json(register_message(name, cfg))
        epoch = generation = 0
        desired: list[dict[str, Any]] = []
        while True:
            msg = await ws.receive_json(timeout=300)
            if msg["type"] == "registered":
                epoch = msg["epoch"]
            elif msg["type"] == "desired_state":
                generation = msg["generation"]
                desired = msg["workers"]
                break
        connecting.release()
        out["registered"] += 1
        if out["registered"] == len(cfg["agents"]):
            all_registered.set()
        pending: list[float] = []  # send times of probes not answered yet

        applied = {"workers": desired, "generation": generation}  # what this agent reports as done

        def report() -> list[dict[str, Any]]:
            if reconcile:
                return [
                    {
                        "worker_id": w["worker_id"],
                        "role": w["role"],
                        "activity": w["activity"],
                        "state": "running",
                        "weight_version": w["min_weight_version"],
                        "endpoint": f"http://127.0.0.1:{20000 + w['worker_id'] % 40000}",
                        "inflight": 0,
                        "generation": applied["generation"],
                        "devices": w["gpus"],
                    }
                    for w in applied["workers"]
                ]
            busy = (beat % 3) + 1 if cfg.get("busy") else 1  # serving: the count moves, the workers stay busy
            return fixed_report(workers, generation, inflight=beat % 2 if change else busy)

        async def confirm(gen: int, workers: list[dict[str, Any]]) -> None:
            """Report a desired state as done (late, for a slow node; never, for a negative delay)."""
            if delay < 0:
                return
            if delay:
                await asyncio.sleep(delay)
            if gen >= applied["generation"]:
                applied["workers"], applied["generation"] = workers, gen
                await ws.send_json({"type": "heartbeat", "epoch": epoch, "generation": gen, "workers": report()})

        confirming: set[asyncio.Task[None]] = set()
        if reconcile:
            await ws.send_json({"type": "heartbeat", "epoch": epoch, "generation": generation, "workers": report()})

        async def reader() -> None:
            nonlocal generation, epoch
            async for m in ws:
                if m.type != WSMsgType.TEXT:
                    break
                d = json.loads(m.data)
                if d.get("type") == "error":
                    if d.get("code") == "bad_message" and "probe" in d.get("message", "") and pending:
                        t = pending.pop(0)
                        if window["start"] <= t < window["end"]:
                            out["renew_s"].append(time.time() - t)
                    else:
                        out["errors"].append(f"{name}: {d.get('code')}: {d.get('message', '')[:80]}")
                elif d.get("type") == "desired_state":
                    nonlocal desired
                    generation, epoch, desired = d["generation"], d["epoch"], d["workers"]
                    if window["start"] < time.time():
                        counts[name] = counts.get(name, 0) + 1
                    if reconcile:
                        task = asyncio.create_task(confirm(generation, desired))
                        confirming.add(task)
                        task.add_done_callback(confirming.discard)

        counts = out["desired_counts"]
        beat = 0
        rd = asyncio.create_task(reader())
        await asyncio.sleep(random.random() * period)
        try:
            # beating on through a tail after the window: its last probes get their answers, and no lease
            # lapses before bench_load.py counts the leases lost (it counts up to when the agents stopped)
            while time.time() < window["end"] + TAIL_S:
                beat += 1
                observed = report()
                t = time.time()
                gen = applied["generation"] if reconcile else generation
                await ws.send_json({"type": "heartbeat", "epoch": epoch, "generation": gen, "workers": observed})
                if window["start"] <= t < window["end"]:
                    out["sent"] += 1
                    if change:
                        out["changed"].append([name, t])
                if probe:
                    pending.append(t)
                    await ws.send_str('{"type": "probe"}')
                if beat % 5 == 0 and not reconcile:
                    await ws.send_json(
                        {
                            "type": "telemetry",
                            "epoch": epoch,
                            "records": [
                                {
                                    "kind": "decode_iteration",
                                    "job": cfg["job"],
                                    "worker": workers[0],
                                    "running_batch": 8,
                                    "duration_s": 0.01 + random.random() / 100,
                                }
                            ],
                        }
                    )
                await asyncio.sleep(period)
        finally:
            rd.cancel()


def register_message(name: str, cfg: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "register",
        "node": name,
        "pool": cfg.get("pool", "reserved"),
        "hardware": "H800",
        "incarnation": f"load-{os.getpid()}",
        "data_plane": "",
        "slots": [{"index": s, "hardware": "H800", "memory_mb": 81920} for s in range(int(cfg.get("slots", 2)))],
    }


class Storm:
    """What the storm's agents share: the moment of the latest storm (they connect within a second of it) and
    an event set when a new storm is called (it ends the backoff of every agent whose link is down)."""

    def __init__(self) -> None:
        self.at = time.time()
        self.called = asyncio.Event()
        self.stopping = asyncio.Event()

    def call(self, at: float) -> None:
        self.at = at
        self.called.set()
        self.called = asyncio.Event()


async def storm_agent(
    session: ClientSession, url: str, spec: list[Any], cfg: dict[str, Any], out: dict[str, Any], storm: Storm
) -> None:
    """One agent of the storm: connect within a second of the storm, then keep the link as the node agent
    does (`agents.node.session`: register on every connection, heartbeat every period at the epoch it holds,
    adopt a desired state's newer epoch, reconnect with jittered exponential backoff)."""
    name, token, workers = spec
    period = float(cfg["period"])
    delay = 0.2
    called = storm.called
    await asyncio.sleep(max(0.0, storm.at + random.random() - time.time()))
    while not storm.stopping.is_set():
        started = time.monotonic()
        try:
            await storm_session(session, url, name, token, workers, period, cfg, out, storm)
            delay = 0.2
            out["dropped"].append(time.time())
        except LINK_ERRORS as exc:
            delay = failed_delay(delay, time.monotonic() - started, RECONNECT_BACKOFF_MAX_S)
            out["failed"].append(time.time())
            if len(out["errors"]) < 10:
                out["errors"].append(f"{name}: {exc!r}"[:160])
        if storm.stopping.is_set():
            break
        wait = asyncio.ensure_future(called.wait())
        stop = asyncio.ensure_future(storm.stopping.wait())
        await asyncio.wait([wait, stop], timeout=delay * (0.5 + random.random()), return_when=asyncio.FIRST_COMPLETED)
        wait.cancel()
        stop.cancel()
        if called.is_set():  # a new storm: connect within a second of it, whatever the backoff said
            called = storm.called
            delay = 0.2
            await asyncio.sleep(max(0.0, storm.at + random.random() - time.time()))
        else:
            delay = min(RECONNECT_BACKOFF_MAX_S, delay * 2)


async def storm_session(
    session: ClientSession,
    url: str,
    name: str,
    token: str,
    workers: list[int],
    period: float,
    cfg: dict[str, Any],
    out: dict[str, Any],
    storm: Storm,
) -> None:
    """One connection of a storm agent, until it closes (or the run stops)."""
    async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):  # as the node agent's handshake
        ws = await session.ws_connect(url, headers={"Authorization": f"Bearer {token}"}, max_msg_size=0, heartbeat=30)
    async with ws:
        await ws.send_json(register_message(name, cfg))
        state = {"epoch": 0, "generation": 0}
        registered = asyncio.Event()

        async def beat() -> None:
            await registered.wait()
            await asyncio.sleep(random.random() * period)
            while True:
                report = fixed_report(workers, state["generation"])
                await ws.send_json(
                    {"type": "heartbeat", "epoch": state["epoch"], "generation": state["generation"], "workers": report}
                )
                second = str(int(time.time()))
                out["sent_per_s"][second] = out["sent_per_s"].get(second, 0) + 1
                await asyncio.sleep(period)

        beater = asyncio.create_task(beat())
        stop = asyncio.create_task(storm.stopping.wait())
        try:
            while True:
                recv = asyncio.create_task(ws.receive())
                done, _ = await asyncio.wait({recv, stop, beater}, return_when=asyncio.FIRST_COMPLETED)
                if recv not in done:
                    recv.cancel()
                    if beater in done:
                        beater.result()  # a send on a closing link: raise it
                    return
                m = recv.result()
                if m.type != WSMsgType.TEXT:
                    return
                d = json.loads(m.data)
                kind = d.get("type")
                if kind == "registered":
                    state["epoch"] = d["epoch"]
                    out["registered_at"].append([time.time(), name])
                elif kind == "desired_state":
                    if d["epoch"] > state["epoch"] and registered.is_set():
                        out["lease_lost"].append(time.time())  # a new epoch not of this socket's registration
                    state["epoch"] = max(state["epoch"], d["epoch"])
                    state["generation"] = max(state["generation"], d["generation"])
                    registered.set()
                elif kind == "error":
                    out["refused"].append([time.time(), str(d.get("code", ""))])
        finally:
            for t in (beater, stop):
                t.cancel()
            await asyncio.gather(beater, stop, return_exceptions=True)


async def run_storm(cfg: dict[str, Any]) -> None:
    """The storm's agents until a {"stop": true} line; {"storm": t} lines call a new storm. Results on stdout."""
    loop = asyncio.get_running_loop()
    out: dict[str, Any] = {
        "registered_at": [],
        "dropped": [],
        "failed": [],
        "lease_lost": [],
        "refused": [],
        "sent_per_s": {},
        "errors": [],
    }
    storm = Storm()
    urls, offset = cfg["urls"], int(cfg.get("offset", 0))
    async with ClientSession(timeout=ClientTimeout(total=None), connector=TCPConnector(limit=0)) as s:
        tasks = [
            asyncio.create_task(storm_agent(s, urls[(i + offset) % len(urls)], a, cfg, out, storm))
            for i, a in enumerate(cfg["agents"])
        ]
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            msg = json.loads(line) if line.strip() else {"stop": True}
            if msg.get("stop"):
                break
            storm.call(float(msg["storm"]))
        storm.stopping.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
    out["failed_agents"] = sum(1 for d in done if isinstance(d, BaseException))
    out["errors"] += [repr(d)[:120] for d in done if isinstance(d, BaseException)][:5]
    print(json.dumps(out), flush=True)


async def main() -> None:
    """Line 1 on stdin: the spec; "READY" on stdout once every agent registered (they heartbeat from then on);
    line 2 on stdin: {"t_start": wall s}, the start of the measured window; then the results on stdout."""
    loop = asyncio.get_running_loop()
    cfg = json.loads(await loop.run_in_executor(None, sys.stdin.readline))
    if cfg.get("storm"):
        await run_storm(cfg)
        return
    out: dict[str, Any] = {
        "registered": 0,
        "sent": 0,
        "renew_s": [],
        "changed": [],
        "errors": [],
        "desired_counts": {},
    }
    window = {"start": float("inf"), "end": float("inf")}
    urls, offset = cfg["urls"], int(cfg.get("offset", 0))
    all_registered = asyncio.Event()
    connecting = asyncio.Semaphore(CONNECTS_AT_ONCE)
    async with ClientSession(timeout=ClientTimeout(total=None), connector=TCPConnector(limit=0)) as s:
        tasks = [
            asyncio.create_task(
                agent(s, urls[(i + offset) % len(urls)], i + offset, a, cfg, out, window, all_registered, connecting)
            )
            for i, a in enumerate(cfg["agents"])
        ]
        failed = asyncio.ensure_future(asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION))
        await asyncio.wait([asyncio.ensure_future(all_registered.wait()), failed], return_when=asyncio.FIRST_COMPLETED)
        print("READY", flush=True)
        go = json.loads(await loop.run_in_executor(None, sys.stdin.readline))
        window["start"] = float(go["t_start"])
        window["end"] = window["start"] + float(cfg["duration"])
        if cfg.get("reconcile"):  # runs until told to stop
            await loop.run_in_executor(None, sys.stdin.readline)
            window["end"] = time.time()
            for t in tasks:
                t.cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
    out["failed_agents"] = sum(
        1 for d in done if isinstance(d, BaseException) and not isinstance(d, asyncio.CancelledError)
    )
    done = [d for d in done if not isinstance(d, asyncio.CancelledError)]
    out["errors"] = out["errors"][:10] + [repr(d)[:120] for d in done if isinstance(d, BaseException)][:5]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
