"""The trainer's Hugging Face checkpoints (issue 36): every `every` updates and at stop, a directory that
`AutoModelForCausalLM.from_pretrained` loads with logits equal to the trainer's at that step (float32 weights:
compared exactly, and within 1e-6 as the stated tolerance), sharded when asked (a tiny model too), with the
model directory's tokenizer and chat template (the tiny model: config, generation config and safetensors only,
its tokenizer being the built-in byte one); retention keeps the newest K; a new trainer starts from one."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from agents import models
from agents.trainer import GRPOConfig, GRPOTrainer
from agents.trainer.export import Exporter
from controlplane.core import checkpoints as ck
from tests.support.hf_models import model_dir
from tests.unit.agents.test_trainer import fixed_batch

PROMPT = torch.tensor([[3, 17, 42, 99, 7, 250, 11]])
TOL = 1e-6


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=PROMPT).logits


def _load(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True).eval()


def test_every_k_updates_a_checkpoint_that_transformers_loads_with_the_trainers_logits(tmp_path):
    ex = Exporter(tmp_path / "ck", every=2, keep=2, model_spec="tiny", job="j", max_shard_size="300KB")
    t = GRPOTrainer("tiny", GRPOConfig(lr=1e-2), exporter=ex, job="j")
    seen: dict[int, torch.Tensor] = {}
    for step in range(6):
        t.update_blocking(fixed_batch(t.version), rollout_step=step)
        t.model.eval()
        seen[step] = _logits(t.model)
        t.model.train()
    # versions 2, 4, 6 were due (steps 1, 3, 5); retention kept the newest two
    assert ex.steps() == [3, 5]
    for step in (3, 5):
        out = tmp_path / "ck" / ck.dir_name(step)
        got = _logits(_load(out))
        assert torch.allclose(got, seen[step], atol=TOL, rtol=0) and torch.equal(got, seen[step])
        manifest = ck.Manifest.from_json(json.loads((out / ck.MANIFEST).read_text()))
        assert manifest.step == step and manifest.weight_version == step + 1 and manifest.tokenizer == "byte"
        shards = [n for n in manifest.files if n.endswith(".safetensors")]
        assert len(shards) > 1 and "model.safetensors.index.json" in manifest.files  # sharded as asked
        assert {"config.json", "generation_config.json"} <= set(manifest.files)
        assert all(ck.servable(n) for n in manifest.files)
    assert not _logits(_load(tmp_path / "ck" / ck.dir_name(3))).equal(seen[5])  # two different checkpoints


def test_the_checkpoint_at_stop_and_a_new_job_starting_from_it(tmp_path):
    src = model_dir(tmp_path, "llama")
    ex = Exporter(tmp_path / "ck", every=100, keep=0, model_spec=str(src), job="j", max_shard_size="100KB")
    t = GRPOTrainer(str(src), GRPOConfig(lr=1e-2), exporter=ex, job="j")
    assert t.export() is None  # nothing trained: nothing to take home
    vocab = t.model.config.vocab_size
    for step in range(2):
        batch = [
            dataclasses.replace(s, completion_tokens=[c % vocab for c in s.completion_tokens])
            for s in fixed_batch(t.version)
        ]
        t.update_blocking(batch, rollout_step=step)
    assert ex.steps() == []  # not due yet
    out = t.export()  # what the server does at stop
    assert out is not None and out == tmp_path / "ck" / ck.dir_name(1)
    names = {p.name for p in out.iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"} <= names
    t.model.eval()
    assert torch.equal(_logits(_load(out)), _logits(t.model))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)
    assert tok.apply_chat_template([{"role": "user", "content": "2+2"}], tokenize=False)
    assert (
        json.loads((out / "generation_config.json").read_text())
        == json.loads((src / "generation_config.json").read_text())
        or not (src / "generation_config.json").exists()
    )

    fresh = GRPOTrainer(str(src), GRPOConfig(), job="k")
    assert not torch.equal(_logits(fresh.model.eval()), _logits(t.model))
    started = GRPOTrainer(str(src), GRPOConfig(), job="k", init_from=str(out))
    assert torch.equal(_logits(started.model.eval()), _logits(t.model))


def test_init_from_a_checkpoint_of_another_architecture_is_refused(tmp_path):
    ex = Exporter(tmp_path / "ck", every=1, keep=0, model_spec="tiny", job="j")
    out = ex.export(models.load_model("tiny"), step=0, version=1)
    with pytest.raises(ValueError, match="do not fit the model"):
        GRPOTrainer(str(model_dir(tmp_path, "qwen2")), GRPOConfig(), init_from=str(out))


def test_a_checkpoint_that_cannot_be_written_never_stops_training(tmp_path, caplog):
    ex = Exporter(tmp_path / "ck", every=1, keep=0, model_spec="tiny", job="j")
    (tmp_path / "full").write_text("a file where the directory should be")
    ex.dir = tmp_path / "full" / "ck"  # every write now fails, as on a full or vanished disk
    t = GRPOTrainer("tiny", GRPOConfig(lr=1e-2), exporter=ex, job="j")
    for step in range(2):
        t.update_blocking(fixed_batch(t.version), rollout_step=step)
    assert t.version == 2 and t.trained_steps == {0: 1, 1: 2}
    assert "the checkpoint of v2 failed; training goes on" in caplog.text
