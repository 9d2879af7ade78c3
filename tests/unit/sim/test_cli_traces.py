"""CLI smoke (list / run / compare --json) and trace files (generator, user CSV, bad files)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controlplane.sim.cli import main
from controlplane.sim.scenario import get_scenario, list_scenarios
from controlplane.sim.traces import PAPER_SEGMENTS, TraceError, generate_bamboo_like, load_trace, parse_trace_csv

KEYS = {
    "throughput_tok_s",
    "steps",
    "rollout_s_mean",
    "train_s_mean",
    "transitions",
    "borrowed_gpu_s",
    "return_deadline_misses",
    "lost_tokens",
    "predictor_mape",
    "predictor_mape_start",
}


def test_list_names_the_paper_scenarios(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for seg in (1, 2, 3):
        assert f"paper-qwen3-8b-seg{seg}" in out
        assert f"paper-qwen3-30b-a3b-seg{seg}" in out
    assert "ablation-qwen3-8b-4gpu" in out and "sens-batch-128" in out


def test_compare_json_has_exactly_the_contract_keys(small_file, capsys):
    assert main(["compare", "--scenario-file", str(small_file), "--seed", "5", "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)  # exactly one JSON object, nothing else on stdout
    assert set(data) == {"scenario", "seed", "policies"}
    assert data["scenario"] == "small-test" and data["seed"] == 5
    assert set(data["policies"]) == {"pearl", "fixed", "fixed-large", "elastic", "oracle"}
    for row in data["policies"].values():
        assert set(row) == KEYS
        assert isinstance(row["throughput_tok_s"], float) and isinstance(row["steps"], int)
        assert row["predictor_mape"] is None or isinstance(row["predictor_mape"], float)
        assert set(row["predictor_mape_start"]) == {"colocated", "disaggregated"}
        assert all(v is None or isinstance(v, float) for v in row["predictor_mape_start"].values())


def test_run_subprocess_and_html(small_file, tmp_path):
    py = sys.executable
    out = subprocess.run(
        [py, "-m", "controlplane.sim", "run", "--scenario-file", str(small_file), "--policy", "fixed", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    row = json.loads(out)
    assert row["policy"] == "fixed" and row["steps"] >= 1
    html = tmp_path / "r.html"
    assert main(["compare", "--scenario-file", str(small_file), "--policies", "pearl,fixed", "--html", str(html)]) == 0
    text = html.read_text()
    # plotly.js is inlined (the bundle itself is in the page) and no script is fetched from anywhere
    assert "<script src=" not in text.replace('<script src="data:', "")
    assert "Plotly.newPlot" in text and len(text) > 3_000_000


def test_user_trace_csv_is_used(small_file, tmp_path, capsys):
    csv = tmp_path / "mine.csv"
    csv.write_text("time_s,available_gpus\n0,4\n300,8\n")
    assert (
        main(["compare", "--scenario-file", str(small_file), "--trace", str(csv), "--policies", "fixed", "--json"]) == 0
    )
    assert json.loads(capsys.readouterr().out)["policies"]["fixed"]["steps"] >= 1
    tr = load_trace(csv)
    assert tr.at(0) == 4 and tr.at(299.9) == 4 and tr.at(300) == 8


@pytest.mark.parametrize(
    "text,needle",
    [
        ("time,gpus\n0,4\n", "header"),
        ("time_s,available_gpus\n0,4\n10,abc\n", ":3: available_gpus"),
        ("time_s,available_gpus\n0,4\n10,6\n5,8\n", ":4: time_s must be strictly increasing"),
        ("time_s,available_gpus\n5,4\n", "first row must be at time_s 0"),
        ("time_s,available_gpus\n0,-2\n", "must be >= 0"),
        ("", "empty"),
    ],
)
def test_bad_trace_gives_a_clear_error(text, needle):
    with pytest.raises(TraceError) as exc:
        parse_trace_csv(text, source="bad.csv")
    assert needle in str(exc.value) and "bad.csv" in str(exc.value)


def test_bad_trace_through_the_cli(small_file, tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_text("time_s,available_gpus\n0,4\n10,x\n")
    assert main(["compare", "--scenario-file", str(small_file), "--trace", str(bad), "--json"]) == 2
    err = capsys.readouterr().err
    assert "bad.csv:3" in err
    assert main(["compare", "--scenario-file", str(tmp_path / "missing.csv"), "--json"]) == 2


def test_shipped_traces_match_the_paper_segment_means():
    for seg, mean in (("seg1", 13.6), ("seg2", 9.0), ("seg3", 11.8)):
        sc = get_scenario(f"paper-qwen3-8b-{seg}")
        assert abs(sc.trace.mean(7200) - mean) <= 0.05
        assert all(g % 2 == 0 and 4 <= g <= 16 for g in sc.trace.gpus)
    s1, s3 = get_scenario("paper-qwen3-8b-seg1").trace, get_scenario("paper-qwen3-8b-seg3").trace
    assert s1.n_changes(7200) > 2 * s3.n_changes(7200)  # frequent vs moderate changes


def test_generator_is_seeded():
    a = generate_bamboo_like(PAPER_SEGMENTS["seg2"], seed=11)
    b = generate_bamboo_like(PAPER_SEGMENTS["seg2"], seed=11)
    c = generate_bamboo_like(PAPER_SEGMENTS["seg2"], seed=12)
    assert a == b and a != c
    assert parse_trace_csv(a.to_csv()).gpus == a.gpus


def test_every_shipped_scenario_loads():
    names = list_scenarios()
    assert len(names) >= 6 + 8 + 8
    for n in names:
        get_scenario(n)
