"""`pearl` on a mixed pool (issue 23), against a live server: a ROLL-style spec names the chip types its
rollout pool accepts, `pearl status` says where it trains and rolls out, `pearl workers` lists each worker's
node and hardware, `pearl nodes` each node's, and a type the profiles do not know is refused naming the key."""

from __future__ import annotations

import json

import pytest

from tests.integration.test_cli import SPEC, pearl
from tests.support.cluster import make_node, run_transition

MIXED = SPEC.replace("name: grpo-cli", "name: grpo-mixed").replace(
    "hardware: h800", "hardware: h800\nhardware_types: [H800, H20]"
)


@pytest.fixture
def cp(control_plane_server, tmp_path):
    control_plane_server.tmp = tmp_path
    make_node("res-h20", slots=2, hardware="H20")
    make_node("spot-a100", pool="elastic", slots=2, hardware="A100")
    make_node("train-a", pool="training", slots=2, hardware="H800")
    return control_plane_server


def test_workers_and_nodes_show_each_workers_hardware(cp, tmp_path):
    from controlplane.services import planner

    token = cp.user_token("alice")
    spec = tmp_path / "job.yaml"
    spec.write_text(MIXED)
    job = json.loads(pearl(cp, "submit", str(spec), "--json", token=token).stdout)
    assert job["hardware_types"] == ["H800", "H20"]
    run_transition(planner.plan_job(job_id=job["id"], signal="step_start"))

    assert "hardware: training on h800, rollout on H800, H20" in pearl(cp, "status", "grpo-mixed", token=token).stdout
    text = pearl(cp, "workers", "grpo-mixed", token=token).stdout
    lines = text.splitlines()
    assert lines[0].split() == ["SLOT", "ROLE", "ACTIVITY", "NODE", "POOL", "HARDWARE", "GPUS", "WEIGHTS"]
    rows = {line.split()[3]: line.split() for line in lines[1:] if line.startswith("w")}
    assert rows["res-h20"][5] == "H20" and rows["train-a"][5] == "H800"
    assert "spot-a100" not in rows  # not an accepted type
    assert "rollout workers:" in lines[-1] and "on H20" in lines[-1] and "on H800" in lines[-1]
    listed = json.loads(pearl(cp, "workers", "grpo-mixed", "--json", token=token).stdout)
    assert {w["node"]: w["hardware"] for w in listed}["res-h20"] == "H20"

    nodes = pearl(cp, "nodes", token=token).stdout.splitlines()
    hw = {line.split()[1]: line.split()[4] for line in nodes[1:]}
    assert hw == {"res-h20": "H20", "spot-a100": "A100", "train-a": "H800"}


def test_an_unknown_type_is_refused_naming_the_users_key(cp, tmp_path):
    from controlplane.models import Job

    token = cp.user_token("alice")
    spec = tmp_path / "bad.yaml"
    spec.write_text(MIXED.replace("[H800, H20]", "[H800, B200]"))
    r = pearl(cp, "submit", str(spec), token=token, check=False)
    assert r.returncode == 1 and "hardware_types" in r.stderr and "unknown hardware 'B200'" in r.stderr
    assert not Job.objects.exists()
