"""The driver's turn journal (issue 34): each in-flight trajectory of a built-in environment, turn by turn, on
the driver's own disk, so that a restarted driver continues it from its last finished turn instead of running it
again from its prompt.

One file per trajectory (`<dir>/<trajectory>.jsonl`), JSON lines: a header (the first prompt, the first turn's
budget, the weights it started under), then one line per finished turn that did not end the trajectory (the
response with the log-probs it was sampled with, the weights and workers that produced it, the observation
and budget the environment answered with, and the environment's state after it, `Environment.snapshot()`).
A file is created whole (a temporary file, fsync, rename, fsync of the directory) and each turn is one
appended line, fsync'ed before the next turn is asked for: a crash leaves at most its last line torn, which
`load` ignores (and everything after a bad line). Bounded: a trajectory whose file would pass
`MAX_FILE_BYTES` stops being journaled (its file is removed: it reruns after a crash, as before).

The file goes when its trajectory finishes (its samples are durable at the trainer, the better copy), is
replaced (stale, failed), or its step is trained; a restarted driver prunes what its loop no longer has.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.weights import atomic_write

log = logging.getLogger("pearl.driver")
MAX_FILE_BYTES = 16 << 20  # one trajectory's journal at most (a 32k-token trajectory journals well under it)
VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")


@dataclass(frozen=True, slots=True)
class JournaledTurn:
    """A finished turn that did not end its trajectory, with what the environment answered."""

    response: list[int]
    logprobs: list[float]  # as sampled: the resumed prefix trains on these, never recomputed
    weight_version: int
    workers: list[int]
    observation: list[int]  # appended to the context after the response
    max_tokens: int  # the next turn's budget
    env: dict[str, Any]  # the environment's state after the turn (`Environment.snapshot()`)


@dataclass(slots=True)
class JournaledTrajectory:
    """What the journal holds of one trajectory: its first prompt and its finished turns, in order."""

    trajectory: str
    step: int
    prompt: list[int]
    budget: int
    version: int
    turns: list[JournaledTurn] = field(default_factory=list)

    def header(self) -> dict[str, Any]:
        return {
            "v": VERSION,
            "trajectory": self.trajectory,
            "step": self.step,
            "prompt": self.prompt,
            "budget": self.budget,
            "version": self.version,
        }


def _turn_json(t: JournaledTurn) -> dict[str, Any]:
    return {
        "response": t.response,
        "logprobs": t.logprobs,
        "weight_version": t.weight_version,
        "workers": t.workers,
        "observation": t.observation,
        "max_tokens": t.max_tokens,
        "env": t.env,
    }


def _ints(x: Any) -> list[int]:
    if not isinstance(x, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in x):
        raise ValueError("not a list of integers")
    return list(x)


def _turn(d: Any) -> JournaledTurn:
    if not isinstance(d, dict) or not isinstance(d.get("env"), dict):
        raise ValueError("not a turn")
    lps = d.get("logprobs")
    if not isinstance(lps, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in lps):
        raise ValueError("logprobs")
    response = _ints(d.get("response"))
    if len(lps) != len(response):
        raise ValueError("logprobs and response differ in length")
    return JournaledTurn(
        response=response,
        logprobs=[float(v) for v in lps],
        weight_version=int(d["weight_version"]),
        workers=_ints(d.get("workers")),
        observation=_ints(d.get("observation")),
        max_tokens=int(d["max_tokens"]),
        env=d["env"],
    )


def _line(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode()


class _TrajectoryFiles:
    """A directory of one file per trajectory, `<trajectory id><suffix>` (an id that is no plain file name is
    refused), written whole through a temporary file (`atomic_write`)."""

    suffix = ""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, tid: str) -> Path:
        if not _NAME.match(tid):
            raise ValueError(f"trajectory id {tid[:40]!r} is not a file name")
        return self.dir / f"{tid}{self.suffix}"

    def _remove_temporaries(self) -> None:
        """The temporary files of a whole write cut short (by a crash)."""
        for tmp in self.dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)


class TurnJournal(_TrajectoryFiles):
    """The journal directory of one driver (one job). Every method is a few small fsync'ed writes."""

    suffix = ".jsonl"

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.sizes: dict[str, int] = {}  # bytes written per trajectory journaled by this driver

    def _sync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def begin(self, j: JournaledTrajectory) -> bool:
        """Create `j.trajectory`'s journal whole (its header and any turns it carries over), atomically.
        False (and nothing journaled) past the size bound."""
        data = _line(j.header()) + b"".join(_line(_turn_json(t)) for t in j.turns)
        path = self._path(j.trajectory)
        if len(data) > MAX_FILE_BYTES:
            self.remove(j.trajectory)
            return False
        atomic_write(path, data)
        self._sync_dir()
        self.sizes[j.trajectory] = len(data)
        return True

    def append(self, tid: str, turn: JournaledTurn) -> bool:
        """One finished turn, appended and fsync'ed. False if `tid` is not journaled (never begun, removed, or
        past the bound: then its file is removed, so a restart reruns it rather than resume a gap)."""
        size = self.sizes.get(tid)
        if size is None:
            return False
        data = _line(_turn_json(turn))
        if size + len(data) > MAX_FILE_BYTES:
            log.info("journal of %s passed %d bytes: not journaled further", tid, MAX_FILE_BYTES)
            self.remove(tid)
            return False
        try:  # no O_CREAT: a file removed meanwhile (its trajectory aborted) stays removed
            fd = os.open(self._path(tid), os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError:
            self.sizes.pop(tid, None)
            return False
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.sizes[tid] = size + len(data)
        return True

    def remove(self, tid: str) -> None:
        self.sizes.pop(tid, None)
        try:
            self._path(tid).unlink()
        except (FileNotFoundError, ValueError):
            return
        self._sync_dir()

    def load(self) -> dict[str, JournaledTrajectory]:
        """Every trajectory journaled here (by a driver before this one), its torn or bad tail left out.
        Temporary files of a `begin` cut short are removed; an unreadable header drops its file."""
        out: dict[str, JournaledTrajectory] = {}
        self._remove_temporaries()
        for path in sorted(self.dir.glob(f"*{self.suffix}")):
            j = read(path)
            if j is None or j.trajectory != path.stem:
                log.warning("journal %s unreadable: removed", path.name)
                path.unlink(missing_ok=True)
                continue
            out[j.trajectory] = j
        return out

    def remove_step(self, step: int) -> None:
        """Remove every journal of step `step` (trained: none of it is continued)."""
        for path in self.dir.glob(f"s{step}-*.jsonl"):
            self.remove(path.stem)

    def prune(self, keep: set[str]) -> None:
        """Remove every journal but those of `keep` (what a restarted driver's loop may still continue)."""
        for path in self.dir.glob("*.jsonl"):
            if path.stem not in keep:
                self.remove(path.stem)


def read(path: Path) -> JournaledTrajectory | None:
    """One journal file: its header and its turns up to the first line that is torn or not a turn."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    lines = raw.split(b"\n")
    if raw.endswith(b"\n"):
        lines.pop()
    else:  # the last line never got its newline: torn
        lines = lines[:-1]
    if not lines:
        return None
    try:
        h = json.loads(lines[0])
        if not isinstance(h, dict) or h.get("v") != VERSION:
            return None
        j = JournaledTrajectory(
            trajectory=str(h["trajectory"]),
            step=int(h["step"]),
            prompt=_ints(h["prompt"]),
            budget=int(h["budget"]),
            version=int(h["version"]),
        )
    except (ValueError, KeyError, TypeError):
        return None
    for line in lines[1:]:
        try:
            j.turns.append(_turn(json.loads(line)))
        except (ValueError, KeyError, TypeError):
            break  # a bad line: what follows it cannot be trusted to be the next turn
    return j


class RecordJournal(_TrajectoryFiles):
    """A built-in environment's finished trajectories whose records the control plane has not taken yet
    (`<dir>/<trajectory>.json`: {"step", "record"}), written whole (temporary file, fsync, rename) before the
    trajectory's samples go to the trainer and removed once its record was sent. A driver killed between the two
    leaves the file: its successor reports the record of each trajectory the trainer holds (the steps' audit
    lists it) and drops the others (their trajectories run again, with records of their own)."""

    suffix = ".json"

    def keep(self, tid: str, step: int, record: dict[str, Any]) -> bool:
        """Write `tid`'s record durably; False (nothing kept) past the size bound or for a bad id."""
        try:
            path = self._path(tid)
        except ValueError:
            return False
        data = json.dumps({"step": step, "record": record}, separators=(",", ":"), allow_nan=False).encode()
        if len(data) > MAX_FILE_BYTES:
            return False
        atomic_write(path, data)
        return True

    def drop(self, tid: str) -> None:
        try:
            self._path(tid).unlink()
        except (FileNotFoundError, ValueError):
            return

    def load(self) -> dict[str, tuple[int, dict[str, Any]]]:
        """Every record kept here by a driver before this one (unreadable files and temporaries removed)."""
        out: dict[str, tuple[int, dict[str, Any]]] = {}
        self._remove_temporaries()
        for path in sorted(self.dir.glob(f"*{self.suffix}")):
            try:
                d = json.loads(path.read_bytes())
                out[path.stem] = (int(d["step"]), dict(d["record"]))
            except (OSError, ValueError, KeyError, TypeError):
                log.warning("kept record %s unreadable: removed", path.name)
                path.unlink(missing_ok=True)
        return out
