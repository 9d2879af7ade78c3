#!/usr/bin/env python
"""Live beside the simulator on the demo's cluster (issue 23): `bench_live.py`'s stacks, figures and table on two
more clusters, both the paper's Qwen3-8B cluster (PEARL §7) at half scale (8 training, 2 reserved, <= 6
preemptible GPUs as three 2-GPU nodes, Bamboo seg1 as the live replay holds it there), the job `make demo`
submits (emulated SWE-like, B = 32, G = 16, TP 2, 32K contexts):

- `demo16`: all H800 (`benchmarks/nodes-demo16.yaml`, launch's DEMO_NODES without the cpu nodes);
- `mixed16`: a mixed elastic pool, one node each of H800, H20 and A100 (`examples/nodes-mixed.yaml`); the job
  trains on H800 and names all three types (`hardware_types`), each agent's engines timed by its node's chip.

    .venv/bin/python benchmarks/bench_live_mixed.py --cluster mixed16 [--minutes N] [--policies elastic,pearl]

Every other option is bench_live.py's. Its stacks listen on ports 8737+ (web) and 6437+ (Redis), apart from
bench_live.py's 8200+/6420+, so both may run on one machine. Writes `benchmarks/out/bench_live-<stamp>.json`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_live  # noqa: E402

_JOB: dict[str, Any] = bench_live._JOB | {
    "hardware": "H800",
    "batch_size": 32,
    "group_size": 16,
    "rollout_gpus": 8,
    "training_gpus": 8,
    "max_trajectory_tokens": 32768,
}
CLUSTERS: dict[str, dict[str, Any]] = {
    "demo16": {
        "scenario": ROOT / "benchmarks" / "live-demo-qwen3-8b-h800-16gpu.yaml",
        "trace": ROOT / "benchmarks" / "bamboo-seg1-demo16.csv",
        "nodes": ROOT / "benchmarks" / "nodes-demo16.yaml",
        "job": _JOB,
    },
    "mixed16": {
        "scenario": ROOT / "benchmarks" / "live-mixed-qwen3-8b-16gpu.yaml",
        "trace": ROOT / "benchmarks" / "bamboo-seg1-demo16.csv",
        "nodes": ROOT / "examples" / "nodes-mixed.yaml",
        "job": _JOB | {"hardware_types": ["H800", "H20", "A100"]},
    },
}
PORT_OFFSET = (8737 - 8200, 6437 - 6420)


class _Stack(bench_live.Stack):
    """bench_live's stack on this benchmark's own ports."""

    def __init__(self, var: Path, *, port: int, redis_port: int, **kw: Any) -> None:
        super().__init__(var, port=port + PORT_OFFSET[0], redis_port=redis_port + PORT_OFFSET[1], **kw)


def main(argv: list[str] | None = None) -> int:
    bench_live.CLUSTERS.update(CLUSTERS)
    bench_live.Stack = _Stack  # type: ignore[misc]
    args = list(sys.argv[1:] if argv is None else argv)
    if "--cluster" not in args and not any(a.startswith("--cluster=") for a in args) and "--report" not in args:
        args += ["--cluster", "mixed16"]
    if "--policies" not in args:
        args += ["--policies", "elastic,pearl"]
    return bench_live.main(args)


if __name__ == "__main__":
    sys.exit(main())
