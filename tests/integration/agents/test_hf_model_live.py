"""A user's own model directory trains live (issue 36): tiny random Llama, Qwen2, Mistral and Qwen3 directories
(tests.support.hf_models, nothing downloaded), each through the real rollout driver on the calculator
environment (its prompts and tool results rendered by the directory's chat template), torch engine workers
serving the directory, and a GRPO trainer server on it; weights published by the trainer are pulled and
installed by every worker. Colocated: one worker serves whole turns. Disaggregated: a prefill worker and a
decode worker, every turn's KV handed from one to the other."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientSession

from agents.driver import RolloutDriver
from agents.engines.torch_engine import TorchEngine
from agents.trainer.grpo import GRPOConfig, GRPOTrainer
from agents.trainer.server import TrainerServer
from agents.weights import WeightStore
from controlplane.core import driver_link as dl
from controlplane.core.state import Role
from tests.support.gateway import SECRET, TRAINER_TOKEN, Link, serve_app, serve_engine
from tests.support.hf_models import ARCHITECTURES, model_dir

pytestmark = pytest.mark.asyncio

STEPS = 2


@pytest.fixture(scope="module")
def models_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf-models")


async def run_job(model: str, mode: str, tmp_path: Path, *, timeout_s: float = 90.0) -> dict[str, Any]:
    """Train `STEPS` GRPO steps of a calculator job on `model`; what the workers and the trainer saw."""
    roles = ["colocated"] if mode == "colocated" else ["prefill", "decode"]
    engines = [TorchEngine(model=model, worker_id=i + 1, role=r, job="hf-job", threads=1) for i, r in enumerate(roles)]
    served = [await serve_engine(e) for e in engines]
    trainer = GRPOTrainer(
        model, GRPOConfig(lr=1e-2, batch_size=4, max_staleness=1), store=WeightStore(tmp_path / "w"), job="hf-job"
    )
    tserver = TrainerServer(trainer, TRAINER_TOKEN, job_token=SECRET)
    trunner, turl = await serve_app(tserver.app)
    job = dl.JobView(
        name="hf-job",
        environment="calculator",
        model=model,
        engine="torch",
        batch_size=4,
        group_size=2,
        max_staleness=1,
        max_trajectory_tokens=256,
        return_deadline_s=30.0,
    )
    link = Link()
    posted: list[Any] = []
    keep = tserver.buffer.add

    def add(step: int, samples: list[Any]) -> None:
        posted.extend(samples)
        keep(step, samples)

    tserver.buffer.add = add  # type: ignore[method-assign]  # the samples the driver posted, kept
    try:
        async with ClientSession() as http:
            driver = RolloutDriver(job, link=link, token=SECRET, http=http)
            link.driver = driver
            workers = [
                dl.RoutableWorker(worker=e.worker_id, role=Role(e.role), endpoint=url)
                for e, (_, url, _) in zip(engines, served)
            ]
            driver.cluster = dl.ClusterView(
                workers=workers, weight_version=0, training_active=False, borrowed=0, trainer=turl
            )
            task = asyncio.create_task(driver.run())
            try:
                for _ in range(int(timeout_s / 0.05)):
                    await asyncio.sleep(0.05)
                    v = driver.waiting_version
                    if v is not None and all(e.weight_version < v for e in engines):
                        # the control plane has every worker pull the published version, then announces it
                        body = {"url": turl, "version": v, "token": TRAINER_TOKEN}
                        for _, url, _ in served:
                            headers = {"Authorization": f"Bearer {SECRET}"}
                            async with http.post(f"{url}/weights", json=body, headers=headers) as r:
                                assert r.status == 200, await r.text()
                    await link.pump()
                    if trainer.version >= STEPS and all(e.weight_version >= STEPS for e in engines):
                        break
                    if task.done():
                        task.result()
                else:
                    raise AssertionError(f"{mode} job on {model} did not train {STEPS} steps in {timeout_s} s")
            finally:
                driver.stop()
                await task
        return {
            "posted": posted,
            "trainer": trainer,
            "engines": engines,
        }
    finally:
        await trunner.cleanup()
        for runner, _, _ in served:
            await runner.cleanup()
        for e in engines:
            await e.shutdown()


@pytest.mark.parametrize("mode", ["colocated", "disaggregated"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
async def test_a_model_directory_trains_live(arch: str, mode: str, models_root: Path, tmp_path: Path) -> None:
    path = str(model_dir(models_root, arch))
    out = await run_job(path, mode, tmp_path)
    trainer, engines, posted = out["trainer"], out["engines"], out["posted"]
    assert trainer.version >= STEPS and trainer.consumed > 0
    assert all(e.weight_version >= STEPS for e in engines)  # every worker installed the trained weights
    # the prompts are the directory's chat template, not the byte tokenizer's: the question is a user message
    tok = engines[0].tokenizer
    first = tok.tok.decode(posted[0].prompt_tokens)
    assert first.startswith("<|im_start|>user\n") and first.endswith("<|im_start|>assistant\n"), first
    assert all(max(s.prompt_tokens + s.completion_tokens) < tok.vocab_size for s in posted)
    # a turn that called the tool got the result as a tool message through the template
    told = [tok.tok.decode(s.prompt_tokens) for s in posted if "<|im_start|>tool" in tok.tok.decode(s.prompt_tokens)]
    assert all("<|im_end|>\n<|im_start|>tool\n=" in t for t in told), told
    if mode == "disaggregated":
        prefill, decode = engines
        assert prefill.kv.bytes_out > 0 and decode.counters.kv_bytes_in == prefill.kv.bytes_out
        assert prefill.counters.decode_iterations == 0  # every turn was decoded on the decode worker
    # the served weights are the trainer's: same next-token log-probs on a prompt after the updates
    import torch
    from safetensors.torch import load as st_load

    data = trainer.store.read(trainer.version)
    tensors = st_load(data)
    for name, t in trainer.model.state_dict().items():
        if name in tensors:
            assert torch.equal(tensors[name], t.detach()), name
    served_state = engines[-1].runner.model.state_dict()
    for name, t in tensors.items():
        assert torch.equal(served_state[name], t), name
