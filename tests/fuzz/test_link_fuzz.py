"""CI's agent-link fuzz run over a real Daphne websocket (bounded, seeded): every generated frame gets
an answer, never a 1011 close, and the socket keeps its lease. The larger run is benchmarks/bench_fuzz.py."""

from __future__ import annotations

import os

import pytest

from controlplane.models import Event, TelemetrySample
from tests.fuzz.link_fuzz import fuzz_link

EXAMPLES = int(os.environ.get("PEARL_LINK_FUZZ_EXAMPLES", "150"))


@pytest.mark.slow
def test_link_fuzz_keeps_the_link(fuzz_target):
    from controlplane.services.credentials import issue_agent_token

    token = issue_agent_token(node_name="fz-link")
    ws_url = fuzz_target.base_url.replace("http", "ws") + "/ws/agent/"
    report = fuzz_link(ws_url, token, "fz-link", examples=EXAMPLES, seed_value=20251130)
    assert report.frames >= EXAMPLES * 0.9
    assert report.problems == [], "\n".join(report.problems[:10])
    assert report.closed_1011 == 0 and report.link_kept == report.frames
    assert report.error_replies >= report.frames * 0.5  # most frames are refused, each with an answer
    assert not TelemetrySample.objects.exists()  # nothing the node does not own was stored
    assert not Event.objects.filter(kind="worker.fault", node__name="fz-link").exists()
