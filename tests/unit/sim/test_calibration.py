"""The calibration statistics (sim/calibration.py) and the physical causes of prefix-cache loss."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from controlplane.sim.calibration import engine_stats, split_from_stats
from controlplane.sim.cli import main
from controlplane.sim.cluster import Simulation


def test_split_from_counters():
    st = {
        "prefill_tokens": 600,
        "cached_tokens": 300,
        "decode_tokens": 100,
        "prefill_s": 1.0,
        "decode_s": 3.0,
        "pure_decode_tokens": 80,
        "pure_decode_s": 2.0,
    }
    out = split_from_stats(st, tp=2)
    assert out["prefill_token_share"] == pytest.approx(0.9)  # (600 + 300) / 1000
    assert out["computed_prefill_token_share"] == pytest.approx(600 / 700)
    assert out["prefill_time_share"] == pytest.approx(0.25)
    assert out["decode_tok_s_per_gpu"] == pytest.approx(20.0)  # 80 tokens / 2 s / 2 GPUs
    assert out["cache_hit_rate"] == pytest.approx(1 / 3)


def _fixed(small, **engine):
    sc = replace(small, engine=replace(small.engine, **engine), trace=small.trace.constant(8))
    sim = Simulation(sc, "fixed")
    res = sim.run()
    return sim, res


def test_engine_counters_agree_with_the_token_accounting(small):
    sim, res = _fixed(small)
    st = engine_stats(sim)
    # every token an engine generated is a decode token in the counters
    assert st["decode_tokens"] == res.conservation["engine_tokens"] > 0
    assert 0 < st["pure_decode_tokens"] <= st["decode_tokens"]
    assert st["prefill_tokens"] > 0 and st["prefill_s"] > 0 and st["decode_s"] >= st["pure_decode_s"] > 0


def test_weight_updates_flush_prefix_caches(small):
    kept, _ = _fixed(small, flush_cache_on_weight_update=False)
    flushed, _ = _fixed(small, flush_cache_on_weight_update=True)
    a, b = engine_stats(kept), engine_stats(flushed)
    assert b["cached_tokens"] < a["cached_tokens"]
    assert b["prefill_tokens"] > a["prefill_tokens"]


def test_prefix_reuse_sets_the_computed_prefill(small):
    sc = replace(small, trace=small.trace.constant(8))
    shares = []
    for reuse in (1.0, 0.5):
        s = replace(sc, workload=replace(sc.workload, prefix_reuse=reuse))
        sim = Simulation(s, "fixed")
        sim.run()
        shares.append(split_from_stats(engine_stats(sim), s.cluster.tp)["cache_hit_rate"])
    assert shares[1] < shares[0]


def test_calibrate_cli_json(small_file, capsys, monkeypatch):
    import controlplane.sim.calibration as cal

    monkeypatch.setattr(
        cal,
        "token_time_split",
        lambda base, **kw: {
            "prefill_token_share": 0.95,
            "computed_prefill_token_share": 0.9,
            "prefill_time_share": 0.2,
            "decode_tok_s_per_gpu": 300.0,
            "cache_hit_rate": 0.5,
        },
    )
    monkeypatch.setattr(
        cal,
        "dp_scaling",
        lambda base, **kw: {"rollout_s": {16: 100.0, 24: 90.0, 32: 82.0}, "dp_16_to_24": 0.1, "dp_24_to_32": 0.08},
    )
    assert main(["calibrate", "--scenario-file", str(small_file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["within"] == {
        "prefill_token_share": True,
        "prefill_time_share": True,
        "decode_tok_s_per_gpu": True,
        "dp_16_to_24": True,
        "dp_24_to_32": True,
    }
    assert out["paper"]["prefill_token_share"] == pytest.approx(0.9668)
