"""A job's exported checkpoints (issue 36): the policy as a Hugging Face directory the user takes home.

One layout, written by the trainer (`agents/trainer/export.py`) and read by the control plane (which lists,
records and serves them): under the job's checkpoint directory, `step_00000012/` holds a `save_pretrained`
directory (sharded safetensors with their index, config.json, generation_config.json, the tokenizer files and
chat template) and `pearl_checkpoint.json`, the manifest, written last inside a temporary directory that is
renamed into place: a directory named `step_N` is complete, a crash leaves a dot-named temporary one that no
reader lists. Pure: the callers do the I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MANIFEST = "pearl_checkpoint.json"
DIR_RE = re.compile(r"^step_(\d{8})$")
DEFAULT_EVERY = 10  # trainer updates between two checkpoints (and one at stop)
DEFAULT_KEEP = 3  # the newest K are kept; 0 keeps every one
MAX_EVERY = 1_000_000
MAX_KEEP = 10_000
# what a checkpoint directory may hold: JSON, text (templates, tokenizer vocabularies) and safetensors; never a
# pickle (the download refuses any other file)
ALLOWED_SUFFIXES = (".json", ".safetensors", ".jinja", ".txt", ".model", ".md")


class CheckpointSpecError(ValueError):
    """A bad checkpoint setting of a job spec; `field` names it."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def dir_name(step: int) -> str:
    """The directory of the checkpoint of trainer update `step` (the weight version it holds)."""
    return f"step_{step:08d}"


def step_of(name: str) -> int | None:
    """The step of a complete checkpoint directory's name, None for anything else (temporary, foreign)."""
    m = DIR_RE.match(name)
    return int(m.group(1)) if m else None


def servable(name: str) -> bool:
    """A file the download may send (a plain name of an allowed kind: JSON, text, safetensors)."""
    return "/" not in name and not name.startswith(".") and name.endswith(ALLOWED_SUFFIXES)


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a checkpoint is: the job and its model spec, the rollout step whose update produced it, the weight
    version it holds, when it was written (unix s), its files with their sizes, and what tokenizer it carries."""

    job: str
    model: str
    step: int
    weight_version: int
    time_s: float
    files: dict[str, int]
    tokenizer: str  # "hf" (the model directory's tokenizer files) or "byte" (the tiny model's: none to ship)

    @property
    def size_bytes(self) -> int:
        return sum(self.files.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "model": self.model,
            "step": self.step,
            "weight_version": self.weight_version,
            "time_s": self.time_s,
            "files": dict(sorted(self.files.items())),
            "tokenizer": self.tokenizer,
        }

    @classmethod
    def from_json(cls, data: Any) -> Manifest:
        """Strict: a manifest that is not what the trainer writes is a ValueError."""
        if not isinstance(data, dict):
            raise ValueError("a checkpoint manifest is a JSON object")
        try:
            files = data["files"]
            if not isinstance(files, dict) or not all(
                isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in files.items()
            ):
                raise ValueError("files must map names to sizes")
            m = cls(
                job=str(data["job"]),
                model=str(data["model"]),
                step=int(data["step"]),
                weight_version=int(data["weight_version"]),
                time_s=float(data["time_s"]),
                files=dict(files),
                tokenizer=str(data.get("tokenizer", "")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"not a checkpoint manifest: {exc!r}") from None
        if m.step < 0 or m.weight_version < 0:
            raise ValueError("a checkpoint's step and weight version are >= 0")
        return m


def validate_settings(every: Any, keep: Any) -> tuple[int, int]:
    """`checkpoint_every` (trainer updates between checkpoints, >= 1) and `checkpoint_keep` (the newest K kept,
    0 = all); absent: the defaults."""
    every = DEFAULT_EVERY if every is None else every
    keep = DEFAULT_KEEP if keep is None else keep
    if isinstance(every, bool) or not isinstance(every, int) or not 1 <= every <= MAX_EVERY:
        raise CheckpointSpecError(f"checkpoint_every must be an integer in 1..{MAX_EVERY}", "checkpoint_every")
    if isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep <= MAX_KEEP:
        raise CheckpointSpecError(
            f"checkpoint_keep must be an integer in 0..{MAX_KEEP} (0 keeps all)", "checkpoint_keep"
        )
    return every, keep


@dataclass(frozen=True, slots=True)
class InitFrom:
    """Where a new job's policy starts: another job's checkpoint (`job`, `step`; step None: its newest) or a
    directory (`path`, absolute)."""

    job: str = ""
    step: int | None = None
    path: str = ""


def parse_init_from(value: Any) -> InitFrom | None:
    """`init_from: {job: NAME, step: N}` (step optional: the newest) or an absolute directory path."""
    if value is None or value == "" or value == {}:
        return None
    if isinstance(value, str):
        if not value.startswith("/"):
            raise CheckpointSpecError("init_from: a directory must be an absolute path", "init_from")
        return InitFrom(path=value)
    if not isinstance(value, dict):
        raise CheckpointSpecError("init_from is {job: NAME, step: N} or an absolute directory path", "init_from")
    unknown = set(value) - {"job", "step"}
    if unknown:
        raise CheckpointSpecError(f"init_from: unknown key {sorted(unknown)[0]!r} (job, step)", "init_from")
    job = value.get("job")
    if not isinstance(job, str) or not job:
        raise CheckpointSpecError("init_from.job must name a job", "init_from.job")
    step = value.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise CheckpointSpecError("init_from.step must be an integer >= 0", "init_from.step")
    return InitFrom(job=job, step=step)


def to_prune(steps: list[int], keep: int) -> list[int]:
    """The steps retention removes: all but the newest `keep` (0 keeps all)."""
    return [] if keep <= 0 else sorted(steps)[:-keep]
