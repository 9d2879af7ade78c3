"""A job's model directory as this process sees it: the core check over its files (`core.model_dir`), and the
planner's prior for it registered from its config.json, so `core.profiles.get_profile(hardware, job.model, tp)`
answers for it in this process (the planner, the driver's view and the submit check each ask first)."""

from __future__ import annotations

import os
from pathlib import Path

from controlplane.core.model_dir import ModelDir, ModelDirError, inspect_model_dir, is_model_dir_spec
from controlplane.core.model_dir import register_model_config as _register
from controlplane.core.profiles import is_registered


def inspect(path: str) -> ModelDir:
    """The checked directory (`ModelDirError` names what is wrong: missing, no config, no weights, an unsupported
    architecture, no tokenizer or no chat template; one this process may not read, too)."""
    try:
        return inspect_model_dir(path, is_dir=_is_dir, list_dir=lambda p: sorted(os.listdir(p)), read_text=_read)
    except OSError as exc:  # a directory it may not list
        raise ModelDirError(f"model directory {path!r} cannot be read: {exc}") from None


def _is_dir(path: str) -> bool:
    try:
        return os.path.isdir(path)
    except ValueError:  # a path with a NUL byte names nothing
        return False


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def ensure_profile(model: str) -> None:
    """Register a model directory's derived profile in this process, once (a profile's model name needs nothing).
    A directory that can no longer be read is a `ModelDirError` naming it."""
    if not is_model_dir_spec(model) or is_registered(model):
        return
    config = inspect(model).config
    try:
        _register(model, config)
    except ValueError as exc:
        raise ModelDirError(f"model directory {model!r}: {exc}") from None
