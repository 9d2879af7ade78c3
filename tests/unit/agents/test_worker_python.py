"""Which interpreter a worker process runs under: vLLM workers under PEARL_VLLM_PYTHON (vLLM in a virtualenv
of its own), everything else under the agent's own; and how long the agent waits for each to serve."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agents import process


def test_vllm_workers_run_under_pearl_vllm_python_and_nothing_else_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(sys.executable)  # as in a virtualenv: the link's path is what makes it that venv's
    monkeypatch.setenv(process.VLLM_PYTHON_ENV, str(venv_python))
    assert process.worker_python("vllm", "agents.worker") == str(venv_python)  # not resolved through the link
    assert process.worker_python("torch", "agents.worker") == sys.executable
    assert process.worker_python("vllm", "agents.trainer") == sys.executable  # the trainer is torch, not vLLM
    monkeypatch.setenv(process.VLLM_PYTHON_ENV, "README.md")  # relative: to the repository; not executable
    with pytest.raises(RuntimeError, match="not an executable interpreter"):
        process.worker_python("vllm", "agents.worker")
    monkeypatch.delenv(process.VLLM_PYTHON_ENV)
    assert process.worker_python("vllm", "agents.worker") == sys.executable


def test_a_vllm_worker_gets_longer_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(process.VLLM_START_ENV, raising=False)
    assert process.start_timeout("vllm", "agents.worker") == process.VLLM_START_TIMEOUT_S
    assert process.start_timeout("torch", "agents.worker") == process.START_TIMEOUT_S
    monkeypatch.setenv(process.VLLM_START_ENV, "42")
    assert process.start_timeout("vllm", "agents.worker") == 42.0
