"""The trainer's data plane over real HTTP, for both trainers: the queue path (`POST /samples` without a
rollout step, `POST /step` without one) and the per-step path answer 2xx with a new weight version.
The queue path once asked the emulated trainer for `config` and `step`, which it lacks (a 500)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession, web

from agents import dataplane as dp
from agents.trainer import EmulatedTrainer, GRPOConfig, GRPOTrainer, TrainerServer
from agents.weights import WeightStore

TOKEN = "trainer-token"


def emulated(tmp_path: Path) -> EmulatedTrainer:
    return EmulatedTrainer(
        model="qwen3-8b",
        hardware="H800",
        tp=1,
        time_factor=1e-4,
        store=WeightStore(tmp_path / "w"),
        ckpt_dir=tmp_path / "ck",
        job="j",
        batch_size=4,
    )


def grpo(tmp_path: Path) -> GRPOTrainer:
    return GRPOTrainer("tiny", GRPOConfig(batch_size=4, max_staleness=10), store=WeightStore(tmp_path / "w"), job="j")


def samples(n: int, *, tokens: bool) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        s = dp.TrainSample(
            group=str(i // 2),
            prompt_tokens=[256, 97] if tokens else [],
            completion_tokens=[98, 99] if tokens else [],
            logprobs=[-5.5, -5.5] if tokens else [],
            reward=float(i % 2),
            weight_version=0,
            trajectory=f"t{i}",
            token_count=0 if tokens else 900,
        )
        out.append(dp.DATA_PLANE.dump(s))
    return out


async def serving(server: TrainerServer) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)  # a free port
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}"


async def post(http: ClientSession, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json=body, headers={dp.AUTH_HEADER: f"Bearer {TOKEN}"}) as r:
        return r.status, await r.json()


@pytest.mark.parametrize("kind", ["emulated", "grpo"])
def test_the_queue_path_trains_a_full_batch_and_on_request(tmp_path: Path, kind: str) -> None:
    trainer = emulated(tmp_path) if kind == "emulated" else grpo(tmp_path)
    tokens = kind == "grpo"

    async def main() -> None:
        runner, base = await serving(TrainerServer(trainer, TOKEN))
        try:
            async with ClientSession() as http:
                status, body = await post(http, base + "/samples", {"samples": samples(4, tokens=tokens)})
                assert status == 200, body
                assert body["step"] is not None and body["version"] == 1 and body["queued"] == 0
                status, body = await post(http, base + "/samples", {"samples": samples(2, tokens=tokens)})
                assert status == 200 and body["step"] is None and body["queued"] == 2  # not a full batch yet
                status, body = await post(http, base + "/step", {"all": True})
                assert status == 200, body
                assert body["version"] == 2 and body["step"]["accepted"] == 2
                status, body = await post(http, base + "/step", {})
                assert status == 200 and body == {"version": 2, "step": None}  # nothing queued
                status, body = await post(http, base + "/samples", {"samples": samples(2, tokens=tokens), "step": 7})
                assert status == 200 and body["buffered"] == 2
                status, body = await post(http, base + "/step", {"step": 7, "training_gpus": 1})
                assert status == 200 and body["version"] == 3 and body["missing"] == []
        finally:
            await runner.cleanup()

    asyncio.run(main())
    assert trainer.version == 3 and trainer.trained_steps == {7: 3}


def test_a_step_trains_its_named_trajectories_or_every_buffered_one_but_the_dropped() -> None:
    from agents.trainer.server import StepBuffer

    buf = StepBuffer(None)
    buf.add(3, [dp.DATA_PLANE.parse(s, dp.TrainSample) for s in samples(3, tokens=True)])
    names = lambda got: sorted(s.trajectory for s in got[0])
    assert names(buf.take(3, ["t0", "t2"])) == ["t0", "t2"]
    assert names(buf.take(3, [], ["t1"])) == ["t0", "t2"]
    assert buf.take(3, [], ["t0", "t1", "t2"]) == ([], [])  # a step whose every group was dropped: nothing
    assert buf.take(3, ["t0", "t9"])[1] == ["t9"]
