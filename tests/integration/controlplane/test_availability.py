"""Preemptible capacity held at a trace's level: preemption notices and returns, in a stable order,
idempotent, never undoing an operator's drain; the replay command plays a trace file."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from controlplane.services.availability import elastic_target, set_elastic_capacity
from controlplane.services.errors import InvalidInput
from tests.support.cluster import make_node

pytestmark = pytest.mark.django_db


def status() -> dict[str, tuple[str, bool]]:
    from controlplane.models import Node

    return {n.name: (n.status, n.preemption_deadline is not None) for n in Node.objects.filter(pool="elastic")}


@pytest.mark.parametrize("trace_gpus, want", [(16, 8), (14, 6), (8, 2), (4, 0), (0, 0), (12, 5)])
def test_a_trace_level_scales_to_this_cluster(trace_gpus, want):
    # the trace's peak (16) maps to reserved + elastic (4 + 8); above the reserved pool is elastic supply
    assert elastic_target(trace_gpus, 16, reserved=4, elastic=8) == want


def test_capacity_follows_the_level_by_notices_and_returns():
    make_node("r1", slots=4, hardware="H800")
    make_node("e1", pool="elastic", slots=4, hardware="H800")
    make_node("e2", pool="elastic", slots=4, hardware="H800")

    down = set_elastic_capacity(gpus=6, notice_s=30, actor="trace")  # whole nodes: 4 of 6 fit
    assert (down.before_gpus, down.after_gpus, down.preempted, down.returned) == (8, 4, ("e2",), ())
    assert status() == {"e1": ("ready", False), "e2": ("draining", True)}
    again = set_elastic_capacity(gpus=6, notice_s=30, actor="trace")
    assert (again.preempted, again.returned, again.after_gpus) == ((), (), 4)  # idempotent

    up = set_elastic_capacity(gpus=8, notice_s=30, actor="trace")
    assert (up.after_gpus, up.returned) == (8, ("e2",))
    assert status() == {"e1": ("ready", False), "e2": ("ready", False)}


def test_an_operators_drain_is_not_undone():
    from controlplane.models import Node
    from controlplane.services.draining import drain_node

    make_node("e1", pool="elastic", slots=4, hardware="H800")
    make_node("e2", pool="elastic", slots=4, hardware="H800")
    drain_node(node_id=Node.objects.get(name="e1").pk, actor="op")
    change = set_elastic_capacity(gpus=8, notice_s=30, actor="trace")
    assert change.returned == () and status()["e1"] == ("draining", False)


def test_bad_arguments_change_nothing():
    make_node("e1", pool="elastic", slots=4, hardware="H800")
    for kw, field in (({"gpus": -1, "notice_s": 5}, "gpus"), ({"gpus": 0, "notice_s": 0}, "notice_s")):
        with pytest.raises(InvalidInput) as exc:
            set_elastic_capacity(actor="t", **kw)
        assert exc.value.field == field
    assert status() == {"e1": ("ready", False)}


def test_replay_plays_a_trace_file(tmp_path):
    make_node("r1", slots=4, hardware="H800")
    make_node("e1", pool="elastic", slots=4, hardware="H800")
    make_node("e2", pool="elastic", slots=4, hardware="H800")
    trace = tmp_path / "t.csv"
    trace.write_text("time_s,available_gpus\n0,16\n5,8\n")  # peak 16 → 12 GPUs here; then 8 → 6: no elastic node
    with open(tmp_path / "out", "w") as out:
        call_command("replay_availability", trace=str(trace), speedup=10.0, once=True, stdout=out)
    assert status() == {"e1": ("draining", True), "e2": ("draining", True)}
    assert "notice to e2, e1" in (tmp_path / "out").read_text()
