"""benchmarks/gpu_profile.py at tiny shapes on CPU: the run a lent GPU makes at the Qwen3-8B and
Qwen3-30B-A3B shapes, small, so the script is known to work before a GPU is ever lent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_profile_tiny_writes_measured_coefficients(tmp_path: Path) -> None:
    out = tmp_path / "profile.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_profile.py"), "--tiny", "--out", str(out)],
        check=True,
        timeout=240,
        capture_output=True,
    )
    result = json.loads(out.read_text())
    assert result["hardware"] == "cpu" and result["skipped"] == []
    dense, moe = result["profiles"]
    assert (dense["model"], moe["model"]) == ("tiny", "tiny-moe")
    for prof in (dense, moe):
        assert [p["tokens"] for p in prof["prefill"]] == [128, 512, 1024]
        assert all(p["s"] > 0 and p["tokens_per_s"] > 0 for p in prof["prefill"])
        grid = {(p["batch"], p["context"]) for p in prof["decode_iteration_s"]}
        assert grid == {(b, c) for b in (1, 4, 16) for c in (128, 512)}
        mixed = prof["mixed_iteration"]
        assert mixed["mixed_s"] > 0 and mixed["interference"] > 0
        assert prof["weight_install_s"] > 0 and prof["weight_bytes"] > 0
        c = prof["coefficients"]
        assert c["t_prefill"] > 0 and c["decode_a"] > 0 and c["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4
    assert moe["weight_bytes"] > dense["weight_bytes"]  # 8 experts per layer
