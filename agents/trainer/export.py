"""The trainer's Hugging Face checkpoints (issue 36): the policy as a directory a user loads with
`AutoModelForCausalLM.from_pretrained` or serves with vLLM, in the layout `controlplane.core.checkpoints` names.

A checkpoint is written into a dot-named temporary directory beside the others (sharded safetensors with their
index, config.json, generation_config.json, the model directory's tokenizer files and chat template, then the
manifest), every file and the directory fsync'ed, then renamed to `step_N`: a reader sees a complete checkpoint or
none, and a crash mid-write leaves the previous ones as they were (the temporary directory is removed at the next
start). Retention then removes all but the newest K. `load_into` starts a new job's policy from one.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from agents import models
from agents.tokenizer import is_builtin
from controlplane.core import checkpoints as ck

log = logging.getLogger(__name__)

# what of a model directory is the tokenizer and its chat template (copied as they are: the exact files the user
# brought; the EOS and stop tokens a server reads stay the model's own)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)
DEFAULT_SHARD_SIZE = "2GB"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Exporter:
    """Writes a job's checkpoints under `directory` every `every` trainer updates (and at stop), keeping the
    newest `keep` (0: all). `model_spec` is the job's model (`tiny` or a directory), for the tokenizer files,
    the generation config and the manifest."""

    def __init__(
        self,
        directory: Path,
        *,
        every: int,
        keep: int,
        model_spec: str,
        job: str,
        max_shard_size: str | int = DEFAULT_SHARD_SIZE,
    ) -> None:
        self.dir = Path(directory)
        self.every, self.keep = max(1, every), max(0, keep)
        self.model_spec, self.job = model_spec, job
        self.max_shard_size = max_shard_size
        self.dir.mkdir(parents=True, exist_ok=True)
        for stale in self.dir.glob(".step_*.tmp"):  # a crash mid-write: never listed, removed now
            shutil.rmtree(stale, ignore_errors=True)

    def due(self, version: int) -> bool:
        return version > 0 and version % self.every == 0

    def steps(self) -> list[int]:
        return sorted(s for p in self.dir.iterdir() if (s := ck.step_of(p.name)) is not None)

    def has(self, step: int) -> bool:
        return (self.dir / ck.dir_name(step) / ck.MANIFEST).is_file()

    def export(self, model: Any, *, step: int, version: int) -> Path:
        """Write the checkpoint of rollout step `step` (weights `version`) atomically; then apply retention.
        A step exported already (a restarted trainer) is kept as it is."""
        final = self.dir / ck.dir_name(step)
        if self.has(step):
            return final
        t0 = time.perf_counter()
        tmp = self.dir / f".{ck.dir_name(step)}.{secrets.token_hex(4)}.tmp"
        tmp.mkdir()
        try:
            self._write(model, tmp, step=step, version=version)
            if final.exists():  # an incomplete leftover under the final name (never renamed there: defensive)
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync(self.dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for old in ck.to_prune(self.steps(), self.keep):
            shutil.rmtree(self.dir / ck.dir_name(old), ignore_errors=True)
        log.info("checkpoint of step %d (v%d) at %s in %.2f s", step, version, final, time.perf_counter() - t0)
        return final

    def _write(self, model: Any, out: Path, *, step: int, version: int) -> None:
        model.save_pretrained(out, max_shard_size=self.max_shard_size)
        builtin = is_builtin(self.model_spec)
        if not builtin:
            src = Path(self.model_spec)
            for name in TOKENIZER_FILES:
                if (src / name).is_file():
                    shutil.copyfile(src / name, out / name)
            if (src / "generation_config.json").is_file():  # the model's own: its EOS matches its chat template
                shutil.copyfile(src / "generation_config.json", out / "generation_config.json")
        if not (out / "generation_config.json").exists():
            from transformers import GenerationConfig

            GenerationConfig.from_model_config(model.config).save_pretrained(out)
        files = {p.name: p.stat().st_size for p in sorted(out.iterdir()) if p.is_file()}
        unsafe = [n for n in files if not ck.servable(n)]
        if unsafe:  # only JSON, text and safetensors leave the trainer (never a pickle)
            raise RuntimeError(f"a checkpoint may not hold {unsafe}")
        manifest = ck.Manifest(
            job=self.job,
            model=self.model_spec,
            step=step,
            weight_version=version,
            time_s=time.time(),
            files=files,
            tokenizer="byte" if builtin else "hf",
        )
        (out / ck.MANIFEST).write_text(json.dumps(manifest.to_json(), indent=1))
        for p in out.iterdir():
            _fsync(p)
        _fsync(out)


def read_weights(directory: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a checkpoint directory's safetensors files (safetensors only: nothing is unpickled)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    if not tensors:
        raise ValueError(f"{directory}: no *.safetensors weights")
    return tensors


def load_into(model: Any, directory: str | Path) -> None:
    """Start `model` from a checkpoint directory (`init_from`): strict names and shapes (only tied duplicates may
    be absent), cast to the model's dtype."""
    expected = model.state_dict()
    tensors = {k: v.to(expected[k].dtype) if k in expected else v for k, v in read_weights(directory).items()}
    models.load_wire_state(model, tensors)
