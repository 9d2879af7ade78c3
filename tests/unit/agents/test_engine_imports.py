"""A worker process imports only what it runs: the emulated engine and the swe-like environment load the
batching and workload models from core, never the simulator, the policy registry, the decision engine or YAML."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("controlplane.sim", "controlplane.core.policies", "controlplane.core.decision", "yaml", "django")


@pytest.mark.parametrize(
    "module, model",
    [("agents.engines.emulated", "controlplane.core.batching"), ("agents.envs.swe_like", "controlplane.core.workload")],
)
def test_a_worker_module_loads_no_simulator_policy_registry_decision_engine_or_yaml(module: str, model: str) -> None:
    code = f"import json, sys, {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    loaded = json.loads(out.stdout)
    assert module in loaded and model in loaded
    heavy = [m for m in loaded if m.startswith(HEAVY)]
    assert heavy == [], f"{module} loads {heavy}"
