"""The trainer's side of exactly-once samples (issue 34), over real HTTP with the emulated trainer and its
checkpoint directory: `POST /samples` is idempotent by trajectory (the first durable copy is kept, a step
already trained takes none), `GET /samples` lists what a restarted driver recovers, and `POST /step` is
idempotent by (step, the version it updates): asked again it answers the version it published, asked of a
trainer at another version it is refused; an update cut by a crash before its commit is redone from the
buffer, one committed is not redone, and the weight version advances once per step."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import ClientSession

from agents import dataplane as dp
from agents.trainer import TrainerServer
from tests.unit.agents.test_trainer_server import TOKEN, emulated, post, samples, serving


def _traj(name: str, reward: float, version: int = 0) -> dict[str, Any]:
    s = samples(1, tokens=False)[0]
    return s | {"trajectory": name, "reward": reward, "weight_version": version}


async def _get(http: ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with http.get(url, headers={dp.AUTH_HEADER: f"Bearer {TOKEN}"}) as r:
        return r.status, await r.json()


def test_samples_are_idempotent_by_trajectory_and_listed_for_recovery(tmp_path: Path) -> None:
    async def main() -> None:
        runner, base = await serving(TrainerServer(emulated(tmp_path), TOKEN))
        try:
            async with ClientSession() as http:
                for body in ([_traj("s0-t0", 1.0)], [_traj("s0-t0", 0.0), _traj("s0-t1", 0.5, 0)]):
                    status, ans = await post(http, base + "/samples", {"samples": body, "train": False, "step": 0})
                    assert status == 200, ans
                assert ans["buffered"] == 2
                status, listed = await _get(http, base + "/samples")
                assert status == 200, listed
                got = {t["trajectory"]: t["reward"] for t in listed["trajectories"]}
                assert got == {"s0-t0": 1.0, "s0-t1": 0.5}  # the re-post of s0-t0 changed nothing
                assert [t["turns"] for t in listed["trajectories"]] == [1, 1]  # one sample each
        finally:
            await runner.cleanup()

    asyncio.run(main())
    # on disk as in memory: a restarted trainer lists the same first copies
    again = TrainerServer(emulated(tmp_path), TOKEN)
    assert {t: ss[0].reward for t, ss in again.buffer.steps[0].items()} == {"s0-t0": 1.0, "s0-t1": 0.5}


def test_a_step_updates_once_per_version_and_a_restarted_trainer_redoes_only_an_uncommitted_update(
    tmp_path: Path,
) -> None:
    step0 = {"step": 0, "trajectories": ["s0-t0", "s0-t1"], "version": 0}

    async def run(server: TrainerServer, calls: list[tuple[str, dict[str, Any]]]) -> list[tuple[int, dict]]:
        runner, base = await serving(server)
        try:
            async with ClientSession() as http:
                return [await post(http, base + path, body) for path, body in calls]
        finally:
            await runner.cleanup()

    posts = [("/samples", {"samples": [_traj("s0-t0", 1.0), _traj("s0-t1", 0.0)], "train": False, "step": 0})]
    asyncio.run(run(TrainerServer(emulated(tmp_path), TOKEN), posts))
    # the trainer died before the update committed: a new one holds the samples and does the update
    first = TrainerServer(emulated(tmp_path), TOKEN)
    assert first.trainer.version == 0 and first.buffer.size(0) == 2
    (ok, ans), (again, ans2), (late, _), (conflict, why) = asyncio.run(
        run(
            first,
            [
                ("/step", step0),
                ("/step", step0),  # a restarted driver asks again
                ("/samples", {"samples": [_traj("s0-t9", 1.0)], "train": False, "step": 0}),  # a late post
                ("/step", {"step": 1, "trajectories": ["s1-t0"], "version": 0}),  # the loop thinks v0
            ],
        )
    )
    assert ok == 200 and ans["version"] == 1 and not ans["already"] and ans["missing"] == []
    assert again == 200 and ans2["version"] == 1 and ans2["already"]
    assert late == 200 and first.buffer.size(0) == 0  # a trained step's samples are not buffered again
    assert conflict == 409 and "v0" in why["error"] and "v1" in why["error"]
    assert first.trainer.version == 1
    # a crash after the commit, before the buffer's drop: the restarted trainer drops it and does not redo it
    first.buffer.add(0, [dp.DATA_PLANE.parse(_traj("s0-t0", 1.0), dp.TrainSample)])
    second = TrainerServer(emulated(tmp_path), TOKEN)
    assert second.trainer.version == 1 and second.buffer.size(0) == 0
    [(ok, ans)] = asyncio.run(run(second, [("/step", step0)]))
    assert ans["already"] and ans["version"] == 1 and second.trainer.version == 1
    audit = [json.loads(line) for line in (tmp_path / "ck" / "updates.jsonl").read_text().splitlines()]
    assert audit == [{"step": 0, "version": 1, "trajectories": ["s0-t0", "s0-t1"], "missing": []}]
