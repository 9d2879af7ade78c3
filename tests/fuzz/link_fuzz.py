"""Fuzzing the agent link (`/ws/agent/`) over a real websocket: generated frames (arbitrary JSON, raw
text, valid messages with a field replaced, removed or added, deep nesting, NaN, NUL, huge numbers)
are sent on one registered socket. After every frame the link must still be up and still count: a
heartbeat with the node's current epoch is accepted (no error), and no frame closes it with 1011.
Used by the CI test (tests/fuzz/test_link_fuzz.py) and benchmarks/bench_fuzz.py."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
JSON = st.recursive(
    SCALARS,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)),
    max_leaves=12,
)


def valid_messages(node: str, epoch: int) -> list[dict[str, Any]]:
    worker = {"worker_id": 1, "role": "decode", "activity": "active", "state": "running", "weight_version": 0}
    return [
        {"type": "heartbeat", "epoch": epoch, "generation": 0, "workers": [worker]},
        {
            "type": "telemetry",
            "epoch": epoch,
            "records": [{"kind": "decode_iteration", "job": "j", "running_batch": 1, "duration_s": 0.1}],
        },
        {
            "type": "fault",
            "epoch": epoch,
            "worker_id": 0,
            "kind": "crashed",
            "detail": "x",
            "aborted": [{"request_id": "r", "tokens": [1]}],
        },
        {
            "type": "register",
            "node": node,
            "pool": "reserved",
            "hardware": "cpu",
            "incarnation": "fz",
            "slots": [{"index": 0, "hardware": "cpu", "memory_mb": 1}],
        },
    ]


def _mutate(message: dict[str, Any], how: int, key_pick: int, value: Any, node: str) -> dict[str, Any]:
    msg = json.loads(json.dumps(message))
    keys = [k for k in msg if k != "type" and not (msg["type"] == "register" and k == "node")]  # keep our own node
    key = keys[key_pick % len(keys)]
    if how == 0:
        msg[key] = value
    elif how == 1:
        del msg[key]
    elif how == 2:
        msg[f"x_{key_pick}"] = value
    elif how == 3 and isinstance(msg.get("workers"), list):
        msg["workers"][0][["worker_id", "role", "activity", "state", "weight_version"][key_pick % 5]] = value
    else:
        msg["type"] = value if isinstance(value, str) else "teleport"
    return msg


RAW = st.sampled_from(
    [
        "[" * 5000 + "]" * 5000,
        '{"type": "heartbeat", "epoch": NaN, "generation": 0}',
        '{"type": "heartbeat", "epoch": Infinity}',
        '{"type": "fault", "epoch": 1, "worker_id": 0, "kind": "x", "detail": "\\u0000"}',
        '{"a": "\\ud800"}',
        "9" * 5000,
        '{"type": "heartbeat", "epoch": 1e999, "generation": 0}',
        "{",
        "null",
        '"text"',
        "[]",
        " ",
    ]
)


def frames(node: str) -> st.SearchStrategy[str]:
    mutated = st.builds(
        lambda i, how, k, v: json.dumps(_mutate(valid_messages(node, 1)[i % 4], how, k, v, node)),
        st.integers(0, 3),
        st.integers(0, 4),
        st.integers(0, 50),
        JSON,
    )
    arbitrary = JSON.map(json.dumps)
    text = st.text(max_size=200).filter(lambda t: t != "")
    return st.one_of(mutated, arbitrary, text, RAW)


@dataclass
class LinkReport:
    frames: int = 0
    error_replies: int = 0
    link_kept: int = 0  # frames after which the same socket still renewed the lease
    closed_1011: int = 0
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0


class Link:
    """One registered agent socket; tracks the node's epoch from what the control plane says."""

    def __init__(self, ws_url: str, token: str, node: str) -> None:
        self._connection = connect(
            ws_url, additional_headers={"Authorization": f"Bearer {token}"}, max_size=None, open_timeout=20
        )
        self.ws = self._connection.__enter__()
        self.node = node
        self.epoch = 0
        self.send(json.dumps(valid_messages(node, 0)[3]))
        self.drain(until=lambda m: m.get("type") == "desired_state")

    def send(self, text: str) -> None:
        self.ws.send(text)

    def drain(self, until: Any = None, quiet_s: float = 0.0, timeout_s: float = 20.0) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                raw = self.ws.recv(timeout=quiet_s if until is None else max(0.01, deadline - time.monotonic()))
            except TimeoutError:
                break
            msg = json.loads(raw)
            out.append(msg)
            if msg.get("type") in ("registered", "desired_state"):
                self.epoch = max(self.epoch, int(msg["epoch"]))
            if until is not None and until(msg):
                break
        return out

    def probe(self) -> list[dict[str, Any]]:
        """A heartbeat with the current epoch, then a marker error (an unknown type) to know the
        heartbeat was processed: every reply in between is about the heartbeat itself."""
        self.send(json.dumps({"type": "heartbeat", "epoch": self.epoch, "generation": 0, "workers": []}))
        self.send(json.dumps({"type": "probe-marker"}))
        return self.drain(until=lambda m: m.get("type") == "error" and "probe-marker" in m.get("message", ""))

    def close(self) -> None:
        self._connection.__exit__(None, None, None)


def fuzz_link(ws_url: str, token: str, node: str, *, examples: int, seed_value: int = 0) -> LinkReport:
    report = LinkReport()
    link = Link(ws_url, token, node)
    start = time.perf_counter()

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(frame=frames(node))
    def run(frame: str) -> None:
        nonlocal link
        report.frames += 1
        try:
            link.send(frame)
            replies = link.probe()
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else None
            report.closed_1011 += code == 1011
            report.problems.append(f"closed ({code}) after {frame[:120]!r}")
            link = Link(ws_url, token, node)
            return
        report.error_replies += sum(
            1 for m in replies if m.get("type") == "error" and "probe-marker" not in m.get("message", "")
        )
        stale = [
            m
            for m in replies
            if m.get("type") == "error" and m.get("code") in ("stale_epoch", "superseded", "not_registered")
        ]
        if stale:  # the frame re-registered (a new epoch): the probe raced it; probe once more
            replies = link.probe()
            stale = [
                m
                for m in replies
                if m.get("type") == "error" and m.get("code") in ("stale_epoch", "superseded", "not_registered")
            ]
        if stale:
            report.problems.append(f"probe refused ({stale[0]['code']}) after {frame[:120]!r}")
        else:
            report.link_kept += 1

    try:
        run()
    finally:
        link.close()
    report.seconds = time.perf_counter() - start
    return report
