"""Trainer -> versioned safetensors snapshots over HTTP -> a torch worker pulls them (pull-based)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestServer

from agents import dataplane as dp
from agents.engines.torch_engine import TorchEngine
from agents.trainer import GRPOConfig, GRPOTrainer, TrainerServer
from agents.weights import WeightStore
from agents.worker import WorkerServer
from agents.worker_client import WorkerCallError, WorkerClient, session
from tests.unit.agents.test_trainer import fixed_batch, weights_hash

AUTH = {"Authorization": "Bearer tok"}


@pytest.fixture
async def stack(tmp_path):
    trainer = GRPOTrainer(
        "tiny", GRPOConfig(lr=1e-2, batch_size=8, max_staleness=100), store=WeightStore(tmp_path / "w")
    )
    engine = TorchEngine()
    tsrv = TestServer(TrainerServer(trainer, "tok").app, host="127.0.0.1")
    wsrv = TestServer(WorkerServer(engine, "wsecret").app, host="127.0.0.1")
    await tsrv.start_server()
    await wsrv.start_server()
    s = session()
    yield (
        trainer,
        engine,
        str(tsrv.make_url("")).rstrip("/"),
        WorkerClient(str(wsrv.make_url("")).rstrip("/"), "wsecret", s),
    )
    await s.close()
    await wsrv.close()
    await tsrv.close()


async def _train(s, turl: str, step: int) -> dict:
    async with s.post(
        f"{turl}/samples", json={"samples": [dp.DATA_PLANE.dump(x) for x in fixed_batch(step)]}, headers=AUTH
    ) as r:
        assert r.status == 200
        return await r.json()


async def test_worker_pulls_the_latest_version_and_never_goes_back(stack):
    trainer, engine, turl, worker = stack
    s = worker.session
    body = await _train(s, turl, 0)
    assert body["version"] == 1 and body["step"]["accepted"] == 8
    async with s.get(f"{turl}/weights/latest") as r:
        assert r.status == 401  # the weight store needs the token too
    async with s.post(f"{turl}/samples", json={"samples": [{"group": "g"}]}, headers=AUTH) as r:
        assert r.status == 400  # malformed samples
    before = await worker.generate(dp.GenerateRequest(request_id="a", prompt="abc"))
    assert before.weight_version == 0
    with pytest.raises(WorkerCallError) as err:
        await worker.generate(dp.GenerateRequest(request_id="b", prompt="abc", min_weight_version=1))
    assert err.value.status == 409  # never serve with weights older than the job allows

    h = await worker.call("weights", {"url": turl, "version": 0, "token": "tok"})  # 0 = latest
    assert h["weight_version"] == 1
    assert weights_hash(engine.runner.model) == weights_hash(trainer.model)  # bit-identical to the trainer's
    after = await worker.generate(dp.GenerateRequest(request_id="c", prompt="abc", min_weight_version=1))
    assert after.weight_version == 1

    with pytest.raises(WorkerCallError) as err:
        await worker.call("weights", {"url": turl, "version": 99, "token": "tok"})
    assert err.value.status == 404  # unknown version
    with pytest.raises(WorkerCallError) as err:
        await worker.call("weights", {"url": turl, "version": 0, "token": "bad"})
    assert err.value.status == 502 and "401" in str(err.value)

    await _train(s, turl, 1)
    assert (await worker.call("weights", {"url": turl, "version": 2, "token": "tok"}))["weight_version"] == 2
    with pytest.raises(WorkerCallError) as err:
        await worker.call("weights", {"url": turl, "version": 1, "token": "tok"})
    assert err.value.status == 409  # refuses to go back
    assert (await worker.get("health"))["weight_version"] == 2
