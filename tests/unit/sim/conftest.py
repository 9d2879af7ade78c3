from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

SMALL: dict[str, Any] = {
    "name": "small-test",
    "description": "short scenario with frequent preemptions for tests",
    "model": "qwen3-8b",
    "cluster": {"training_gpus": 8, "reserved_gpus": 4, "preemptible_gpus": 8, "hardware": "H800", "tp": 2},
    "workload": {"batch_size": 16, "group_size": 8, "max_length": 16384},
    "trace": {"points": [[0, 12], [150, 6], [260, 10], [400, 4], [520, 12], [700, 8], [820, 12]]},
    "duration_s": 1100,
    "seed": 3,
}


@pytest.fixture
def small_file(tmp_path: Path) -> Path:
    p = tmp_path / "small.yaml"
    p.write_text(yaml.safe_dump(SMALL))
    return p


@pytest.fixture
def small():
    from controlplane.sim.scenario import scenario_from_dict

    return scenario_from_dict(dict(SMALL))
