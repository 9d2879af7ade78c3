"""A model directory in the agents (issue 36): Llama, Qwen2, Mistral and Qwen3 load through `AutoModelForCausalLM`;
the torch engine's decode path computes what the `transformers` forward computes; the directory's tokenizer and
chat template are what the engines, the calculator environment and the gateway speak; the tiny model keeps its
byte tokenizer; a directory that cannot run is refused with its reason before any weight is read."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agents import models
from agents.dataplane import GenerateRequest, SamplingParams
from agents.engines.torch_engine import TorchEngine
from agents.engines.torch_runner import TorchRunner
from agents.engines.torch_scheduler import Seq
from agents.envs import make_env
from agents.gateway.chat import HFChatFormat, load_format
from agents.tokenizer import TOKENIZER, HFTokenizer, load_tokenizer
from controlplane.core.model_dir import ModelDirError
from tests.support.hf_models import ARCHITECTURES, bad_model_dir, model_dir


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf-models")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_each_architecture_decodes_as_its_transformers_forward(root, arch):
    path = str(model_dir(root, arch))
    model = models.load_model(path)
    assert model.config.model_type == arch and not model.training
    tok = load_tokenizer(path)
    runner = TorchRunner(model)
    prompts = [tok.encode("3+4? the quick brown fox"), tok.encode("=7")]
    seqs = []
    for i, (logits, kv) in enumerate(runner.prefill(prompts)):
        s = Seq(f"r{i}", "generate", prompts[i], SamplingParams(max_tokens=6), 0, None)  # type: ignore[arg-type]
        s.out_tokens.append(int(torch.argmax(logits)))
        runner.join(s, kv)
        seqs.append(s)
    for _ in range(4):  # batched, left-padded decode iterations vs the full forward of each sequence
        logits = runner.decode_iteration()
        for i, s in enumerate(seqs):
            full = model(input_ids=torch.tensor([s.prompt + s.out_tokens])).logits[0, -1]
            assert torch.allclose(logits[i], full, atol=1e-5), (arch, i)
            s.out_tokens.append(int(torch.argmax(logits[i])))


async def test_the_engine_speaks_the_directorys_tokenizer_and_stops_at_its_eos(root):
    path = str(model_dir(root, "qwen2"))
    e = TorchEngine(model=path, threads=1)
    await e.start()
    try:
        assert isinstance(e.tokenizer, HFTokenizer) and e.eos_id == e.tokenizer.tok.convert_tokens_to_ids("<|im_end|>")
        prompt = load_format(path).render([{"role": "user", "content": "1+2?"}], None)
        out = await e.generate(
            GenerateRequest(request_id="a", sampling=SamplingParams(max_tokens=5, temperature=0.0)), prompt
        )
        assert out.text == e.tokenizer.decode(out.tokens) and len(out.tokens) == 5
        # a turn stops at the engine's EOS (the directory's): made the third greedy token here, it ends there
        e.eos_id = out.tokens[2]
        stopped = await e.generate(
            GenerateRequest(request_id="b", sampling=SamplingParams(max_tokens=5, temperature=0.0, stop_at_eos=True)),
            prompt,
        )
        first = out.tokens.index(out.tokens[2])
        assert stopped.tokens == out.tokens[: first + 1] and stopped.finish_reason == "stop"
    finally:
        await e.shutdown()


async def test_the_calculator_speaks_the_chat_template_of_a_directory_and_bytes_for_tiny(root):
    path = str(model_dir(root, "llama"))
    fmt = load_format(path)
    assert isinstance(fmt, HFChatFormat)
    env = make_env("calculator", task=3, seed=1, model=path)
    first = await env.reset()
    text = fmt.tok.decode(first.observation)
    assert text.startswith("<|im_start|>user\n") and text.endswith("?<|im_end|>\n<|im_start|>assistant\n"), text
    call = fmt.encode("x")[:1]  # a letter: the tool
    told = await env.step(call)
    assert not told.done
    rendered = fmt.tok.decode(told.observation)
    assert rendered.startswith("<|im_end|>\n<|im_start|>tool\n=") and rendered.endswith("<|im_start|>assistant\n")
    result = rendered.split("=")[1][0]
    done = await env.step(fmt.encode(result)[:1])
    assert done.done and done.reward == pytest.approx(1.0) and done.info["correct"] == 1.0
    # the tiny model: the byte prompt and rewards as before
    tiny = make_env("calculator", task=3, seed=1)
    t0 = await tiny.reset()
    assert t0.observation[0] == TOKENIZER.bos_id and TOKENIZER.decode(t0.observation[1:]).endswith("?")
    t1 = await tiny.step([ord("q")])
    assert TOKENIZER.decode(t1.observation).startswith("=")
    t2 = await tiny.step([ord(TOKENIZER.decode(t1.observation)[1])])
    assert t2.done and t2.reward == pytest.approx(1.0)
    assert load_tokenizer("tiny") is TOKENIZER and load_tokenizer("qwen3-8b") is TOKENIZER


@pytest.mark.parametrize(
    ("defect", "says"),
    [
        ("missing", "does not exist"),
        ("no_weights", "has no weights"),
        ("architecture", "unsupported architecture 'gpt2'"),
        ("no_template", "without a chat template"),
    ],
)
def test_a_directory_that_cannot_run_is_refused_with_its_reason(root, defect, says):
    with pytest.raises(ModelDirError, match=says):
        models.load_model(str(bad_model_dir(root, defect)))
