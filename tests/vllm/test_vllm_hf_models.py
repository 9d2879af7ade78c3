"""A user's model directory on vLLM (issue 36): tiny random Llama, Qwen2, Mistral and Qwen3 directories
(tests.support.hf_models, nothing downloaded) are passed to vLLM by path; a text prompt is tokenized with the
directory's tokenizer, the result's text is its decoding, a turn may stop at the directory's EOS, and a
trainer's snapshot of the same architecture installs in place. Runs in `make test-vllm` only (.venv-vllm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import ClientSession

from tests.support.hf_models import ARCHITECTURES, model_dir
from tests.vllm.conftest import start_worker

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

    path = model_dir(root, arch)
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
        trained = models.state_dict_for_wire(models.load_model(str(model_dir(root, arch, seed=1))))
        await worker.engine.load_weights(1, save(trained))
        status, after = await worker.call("generate", body | {"request_id": f"{arch}-b"})
        assert status == 200 and after["weight_version"] == 1
        assert after["logprobs"] != pytest.approx(before["logprobs"], abs=1e-3)
    finally:
        await worker.runner.cleanup()
