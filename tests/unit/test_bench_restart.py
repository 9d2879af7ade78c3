"""The restart benchmark's readings of a trainer's files and its summary (benchmarks/bench_restart.py): what was
durable at a kill is what the trainer's own StepBuffer wrote, the audit tolerates a torn last line, and the medians
and totals leave out what a run could not read rather than counting it as zero."""

import importlib
import json
import sys
from pathlib import Path

from agents import dataplane as dp
from agents.trainer.server import StepBuffer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # it imports its siblings by name
br = importlib.import_module("bench_restart")


def _sample(traj: str) -> dp.TrainSample:
    return dp.TrainSample(
        group="0",
        prompt_tokens=[1],
        completion_tokens=[2],
        logprobs=[-0.5],
        reward=1.0,
        weight_version=0,
        trajectory=traj,
    )


def test_durable_is_what_the_trainer_buffered_per_step(tmp_path: Path) -> None:
    buf = StepBuffer(tmp_path)
    buf.add(3, [_sample("s3-t0"), _sample("s3-t1")])
    buf.add(4, [_sample("s4-t2")])
    buf.add(3, [_sample("s3-t0")])  # a re-post changes nothing
    assert br.durable(tmp_path) == {3: {"s3-t0", "s3-t1"}, 4: {"s4-t2"}}
    assert br.durable(tmp_path / "none") == {}


def test_updates_reads_the_audit_and_skips_a_torn_line(tmp_path: Path) -> None:
    assert br.updates(tmp_path) == {}
    lines = [json.dumps({"step": 0, "version": 1, "trajectories": ["s0-t0"]}), '{"step": 1, "vers']
    (tmp_path / "updates.jsonl").write_text("\n".join(lines))
    assert br.updates(tmp_path) == {0: {"step": 0, "version": 1, "trajectories": ["s0-t0"]}}


def _audit(step: int, rerun: int | None, resumed: int, regenerated: int) -> dict:
    api = None if rerun is None else {"total": 30, "trained": 30, "untrained": 0, "rerun": rerun, "resumed": resumed}
    return {"step": step, "api": api, "trainer": {"durable_regenerated": regenerated, "replacements": resumed}}


def test_summary_takes_medians_and_totals_of_what_was_read() -> None:
    runs = [
        {"up_s": 20.0, "jobs": {"swe": {"first_turn_s": 30.0, "in_flight": [_audit(2, 0, 30, 0)]}}},
        {"up_s": 25.0, "jobs": {"swe": {"first_turn_s": None, "in_flight": [_audit(5, 1, 29, 0)]}}},
        {
            "up_s": 40.0,
            "jobs": {"swe": {"first_turn_s": 50.0, "in_flight": [_audit(9, None, 0, 2), {"step": 10, "error": "x"}]}},
        },
    ]
    pauses = [
        {"released_s": 3.0, "serving_after_resume_s": 1.0, "first_turn_after_resume_s": 4.0},
        {"released_s": 5.0, "serving_after_resume_s": 2.0, "first_turn_after_resume_s": 2.0},
    ]
    got = br.summary(runs, pauses)
    assert got["up_s"] == 25.0
    swe = got["swe"]
    assert swe["first_turn_s"] == 40.0  # a run with no new turn is left out, not counted as 0
    assert swe["steps_audited"] == 3  # the step whose update never came is not audited
    assert (swe["api_rerun"], swe["api_resumed"]) == (1, 59)  # the step without records adds nothing
    assert swe["durable_regenerated"] == 2
    assert got["pause"] == {"released_s": 4.0, "serving_after_resume_s": 1.5, "first_turn_after_resume_s": 3.0}
    assert br.summary(runs[:1], [])["swe"]["api_rerun"] == 0
    no_records = [{"up_s": 1.0, "jobs": {"calc": {"first_turn_s": 1.0, "in_flight": [_audit(1, None, 0, 0)]}}}]
    assert br.summary(no_records, [])["calc"]["api_rerun"] is None
