"""The live benchmark's pure figures: the simulator's throughput definition on live STEP/TRAIN
records, the predictor's error, the trace shift (benchmarks/bench_live.py)."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "bench_live", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_live.py"
)
assert _spec is not None and _spec.loader is not None
bl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bl)


def test_throughput_skips_warmup_and_spans_publications():
    # step 0 has no "step" key (records omit defaults); trained at t = 100, 200, 300, 400, 600
    steps = [{"generated_tokens_total": 10, "train_tokens": 100}] + [
        {"step": i, "generated_tokens_total": 10 * (i + 1), "train_tokens": 100} for i in range(1, 6)
    ]
    trains = [{"time_s": 100.0}] + [
        {"step": i, "time_s": t} for i, t in ((1, 200.0), (2, 300.0), (3, 400.0), (4, 600.0))
    ]
    got = bl.throughput(steps, trains, warmup=2)
    # body = steps 3, 4; span = 600 - 300; tokens = (40 + 100) + (50 + 100)
    assert got["steps_measured"] == 2 and got["span_s"] == 300.0
    assert got["throughput_tok_s"] == pytest.approx(290 / 300)
    assert bl.throughput(steps, trains[:3], warmup=2)["throughput_tok_s"] is None


def test_mape_after_warmup_ignores_missing_predictions():
    steps = [
        {"makespan_s": 100.0, "p": 1000.0},
        {"step": 2, "makespan_s": 100.0, "p": 150.0},
        {"step": 3, "makespan_s": 200.0, "p": 0.0},
        {"step": 4, "makespan_s": 200.0, "p": 180.0},
    ]
    got = bl.mape(steps, "p", warmup=2)
    assert got["n"] == 2 and got["mape_pct"] == pytest.approx(30.0)


def test_shift_trace_starts_at_the_offset_level():
    pts = [(0.0, 8), (100.0, 4), (150.0, 12)]
    assert bl.shift_trace(pts, 120.0) == [(0.0, 4), (30.0, 12)]
    assert bl.shift_trace(pts, 0.0) == pts
