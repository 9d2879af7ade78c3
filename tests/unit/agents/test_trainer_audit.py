"""The trainer's audit across a crash between an update's commit and its audit line (found by the crash suite,
tests/fault/test_crash_points.py, `trainer.after_commit`: the update went missing from `updates.jsonl`, and the
driver's retry was answered `already`, so nothing wrote it): the line is written ahead of the commit and a
restarted trainer appends it if its update committed, or drops it if not."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agents import dataplane as dp
from agents.trainer import TrainerServer
from tests.unit.agents.test_trainer_server import TOKEN, emulated, samples


def _buffer(server: TrainerServer) -> list[dp.TrainSample]:
    batch = []
    for i, s in enumerate(samples(2, tokens=False)):
        batch.append(dp.DATA_PLANE.parse(s | {"trajectory": f"s0-t{i}"}, dp.TrainSample))
    server.buffer.add(0, batch)
    return batch


def _audit(ckpt: Path) -> list[dict]:
    path = ckpt / "updates.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def test_an_update_committed_before_its_audit_line_is_audited_by_the_restarted_trainer(tmp_path: Path) -> None:
    server = TrainerServer(emulated(tmp_path), TOKEN)
    ckpt = server.trainer.ckpt_dir
    assert ckpt is not None
    batch = _buffer(server)
    # what `_update_step` does up to a SIGKILL at `trainer.after_commit`: the line ahead, the commit, no line
    server._audit_ahead(0, ["s0-t0", "s0-t1"], [])
    asyncio.run(server.trainer.update(batch, 0))
    assert _audit(ckpt) == []
    again = TrainerServer(emulated(tmp_path), TOKEN)
    assert again.trainer.trained_steps == {0: 1}
    assert _audit(ckpt) == [{"step": 0, "version": 1, "trajectories": ["s0-t0", "s0-t1"], "missing": []}]
    assert not (ckpt / "updates.pending").exists()
    TrainerServer(emulated(tmp_path), TOKEN)  # a second restart adds nothing
    assert len(_audit(ckpt)) == 1


def test_a_line_ahead_of_an_update_that_never_committed_is_dropped(tmp_path: Path) -> None:
    server = TrainerServer(emulated(tmp_path), TOKEN)
    ckpt = server.trainer.ckpt_dir
    assert ckpt is not None
    _buffer(server)
    server._audit_ahead(0, ["s0-t0", "s0-t1"], [])  # killed at `trainer.mid_update`: nothing committed
    (ckpt / "updates.jsonl").write_text('{"step": 7, "vers')  # and a torn line is no update's
    again = TrainerServer(emulated(tmp_path), TOKEN)
    assert again.trainer.trained_steps == {} and again.buffer.size(0) == 2  # redone from the buffer later
    assert not (ckpt / "updates.pending").exists()
    assert (ckpt / "updates.jsonl").read_text() == '{"step": 7, "vers'
