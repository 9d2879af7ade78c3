"""A user's model directory on vLLM (issue 36): tiny random Llama, Qwen2, Mistral and Qwen3 directories
(tests.support.hf_models, nothing downloaded) are passed to vLLM by path; a text prompt is tokenized with the
directory's tokenizer, the result's text is its decoding, a turn may stop at the directory's EOS, and a
trainer's snapshot of the same architecture installs in place. Runs in `make test-vllm` only (.venv-vllm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import ClientSession

from tests.support.hf_models import ARCHITECTURES, model_dir
from tests.vllm.conftest import VLLM_SIZE, start_worker

pytest.importorskip("vllm")
pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-hf")


@pytest.mark.parametrize("arch", ARCHITECTURES)
async def test_a_model_directory_serves_on_vllm_with_its_tokenizer_and_takes_trained_weights(
    arch: str, root: Path, http: ClientSession
) -> None:
    from safetensors.torch import save

    from agents import models
    from agents.tokenizer import HFTokenizer

    path = model_dir(root, arch, **VLLM_SIZE)
    worker = await start_worker(path, 40 + ARCHITECTURES.index(arch), http, kv_connector="")
    try:
        tok = worker.engine.tokenizer
        assert isinstance(tok, HFTokenizer) and worker.engine.model_dir == path
        body = {"request_id": f"{arch}-a", "prompt": "3+4? the quick", "sampling": {"max_tokens": 6}}
        status, before = await worker.call("generate", body)
        assert status == 200, before
        assert before["prompt_len"] == len(tok.encode("3+4? the quick")) and len(before["tokens"]) == 6
        assert before["text"] == tok.decode(before["tokens"])
        # a trainer's snapshot (another seed, same architecture) installs in place
        trained = models.state_dict_for_wire(models.load_model(str(model_dir(root, arch, seed=1, **VLLM_SIZE))))
        await worker.engine.load_weights(1, save(trained))
        status, after = await worker.call("generate", body | {"request_id": f"{arch}-b"})
        assert status == 200 and after["weight_version"] == 1
        assert after["logprobs"] != pytest.approx(before["logprobs"], abs=1e-3)
    finally:
        await worker.runner.cleanup()


async def test_a_trainer_checkpoint_serves_on_vllm(root: Path, http: ClientSession) -> None:
    """Issue 36: the trainer's Hugging Face checkpoint of a Llama job (agents.trainer.export, as the trainer
    writes it every checkpoint_every updates) is a directory vLLM serves by path, with the tokenizer and chat
    template copied from the job's model, and its greedy turn is the one of the same weights installed in place."""
    from safetensors.torch import save

    from agents import models
    from agents.tokenizer import HFTokenizer
    from agents.trainer.export import Exporter

    source = model_dir(root, "llama", **VLLM_SIZE)
    policy = models.load_model(str(model_dir(root, "llama", seed=1, **VLLM_SIZE)))  # the "trained" policy
    exporter = Exporter(root / "checkpoints", every=1, keep=1, model_spec=str(source), job="vllm-export")
    ckpt = exporter.export(policy, step=3, version=1)
    body = {"request_id": "ck-a", "prompt": "3+4? the quick", "sampling": {"max_tokens": 6}}
    worker = await start_worker(ckpt, 50, http, kv_connector="")
    try:
        assert isinstance(worker.engine.tokenizer, HFTokenizer)
        status, served = await worker.call("generate", body)
        assert status == 200, served
        assert served["prompt_len"] == len(worker.engine.tokenizer.encode("3+4? the quick"))
        assert len(served["tokens"]) == 6 and served["text"] == worker.engine.tokenizer.decode(served["tokens"])
    finally:
        await worker.runner.cleanup()
    # the same weights sent to a worker of the job's own model directory give the same turn
    worker = await start_worker(source, 51, http, kv_connector="")
    try:
        await worker.engine.load_weights(1, save(models.state_dict_for_wire(policy)))
        status, installed = await worker.call("generate", body | {"request_id": "ck-b"})
        assert status == 200, installed
        assert installed["tokens"] == served["tokens"]
        assert installed["logprobs"] == pytest.approx(served["logprobs"], abs=1e-3)
    finally:
        await worker.runner.cleanup()
