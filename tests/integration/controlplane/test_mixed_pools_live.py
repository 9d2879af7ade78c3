"""Mixed pools in the state model (issue 23): a job names the chip types its rollout pool accepts, the planner
gathers GPUs of those types only, a TP group never mixes types, and the job's status and the cluster map show
each worker's hardware. Through the real API, services, planner and executor (agents converge as reported)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from controlplane.core.agent_link import Register, SlotSpec
from controlplane.core.state import Pool
from controlplane.models import GPU, AgentCredential, Job, Worker
from controlplane.selectors.cluster import cluster_snapshot
from controlplane.selectors.jobs import job_status
from controlplane.services import planner
from controlplane.services.credentials import issue_agent_token
from controlplane.services.registration import register_node
from tests.support.cluster import make_job, make_node, run_transition

pytestmark = pytest.mark.django_db

BASE: dict[str, Any] = {
    "name": "mixed",
    "model": "qwen3-8b",
    "engine": "emulated",
    "hardware": "h800",
    "tp": 2,
    "batch_size": 32,
    "group_size": 8,
    "rollout_gpus": 8,
    "training_gpus": 4,
}


def _mixed_cluster() -> None:
    make_node("res-h800", slots=4, hardware="H800")
    make_node("spot-h20", pool="elastic", slots=4, hardware="H20")
    make_node("spot-a100", pool="elastic", slots=2, hardware="A100")
    make_node("train-h800", pool="training", slots=4, hardware="H800")


@pytest.mark.parametrize(
    ("types", "says"),
    [
        ("H800", "Expected a list"),  # not a list
        ([5], "JSON string"),
        (["H800", "B200"], "unknown hardware 'B200'"),
        (["H800", "h800"], "names H800 twice"),
    ],
)
def test_bad_hardware_types_get_400_naming_the_field(api, types, says):
    _mixed_cluster()
    r = api.post("/api/jobs/", BASE | {"hardware_types": types}, format="json")
    assert r.status_code == 400, r.content
    assert r.json()["field"] == "hardware_types", r.json()
    assert says in r.json()["detail"] or says in str(r.json().get("errors")), r.json()
    assert not Job.objects.exists()


def test_a_type_the_model_does_not_fit_on_gets_400(api):
    _mixed_cluster()
    r = api.post("/api/jobs/", BASE | {"tp": 1, "rollout_gpus": 4, "hardware_types": ["H800", "cpu"]}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "hardware_types", r.json()
    assert "does not fit on 1xcpu" in r.json()["detail"]


def test_accepted_types_are_kept_as_the_profiles_spell_them(api):
    _mixed_cluster()
    r = api.post("/api/jobs/", BASE | {"hardware_types": ["h800", "h20"]}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["hardware_types"] == ["H800", "H20"]
    job = Job.objects.get(name="mixed")
    assert job.rollout_hardware == ["H800", "H20"]
    plain = api.post("/api/jobs/", BASE | {"name": "plain"}, format="json").json()
    assert plain["hardware_types"] == [] and Job.objects.get(name="plain").rollout_hardware == ["h800"]


def test_the_pool_gathers_only_the_accepted_types_and_units_carry_their_chip():
    _mixed_cluster()
    job = make_job(**(BASE | {"hardware_types": ["H800", "H20"]}))
    units = planner.job_inventory(job).units
    free = [u for u in units if u.worker is None]
    assert sorted({u.hardware for u in free}) == ["H20", "H800"]  # never the A100 node
    assert sum(1 for u in free if u.hardware == "H20") == 2 and sum(1 for u in free if u.hardware == "H800") == 2
    # a job that names no types stays on its one hardware, and its units name none ("": the job's one type)
    other = make_job("h800-only", **{k: v for k, v in BASE.items() if k != "name"} | {"training_gpus": 0})
    free = [u for u in planner.job_inventory(other).units if u.worker is None]
    assert free and {u.hardware for u in free} == {""}
    assert {cast("tuple[str, int, tuple[int, ...]]", u.key)[1] for u in free} == {
        GPU.objects.filter(node__name="res-h800").first().node_id
    }

    assert run_transition(planner.plan_job(job_id=job.pk, signal="step_start")).status == "succeeded"
    rollout = Worker.objects.filter(job=job, alive=True).exclude(role="training").exclude(zone="overlap")
    assert rollout and {w.node.name for w in rollout} <= {"res-h800", "spot-h20"}  # which types: the policy's choice
    for w in rollout:  # a worker's GPUs are one node's, of one type
        assert len({(b.gpu.node_id, b.gpu.hardware) for b in w.bindings.filter(alive=True)}) == 1
    inv_units = planner.job_inventory(job).units
    assert {u.hardware for u in inv_units if not u.overlap} == {"H800", "H20"}  # bound or free, never A100
    assert all(u.hardware in ("H800", "H20") for u in inv_units if u.worker is not None)
    assert {u.hardware for u in inv_units if u.overlap} == {"H800"}  # training stays on the job's hardware


def test_status_and_cluster_map_show_each_workers_hardware():
    # the only free rollout GPUs of an accepted type are H20: the job trains on H800 and rolls out on H20
    make_node("res-h20", slots=4, hardware="H20")
    make_node("spot-a100", pool="elastic", slots=2, hardware="A100")
    make_node("train-h800", pool="training", slots=4, hardware="H800")
    job = make_job(**(BASE | {"hardware_types": ["H800", "H20"], "rollout_gpus": 4}))
    run_transition(planner.plan_job(job_id=job.pk, signal="step_start"))
    st = job_status(job.pk)
    assert st is not None and st["job"]["hardware_types"] == ["H800", "H20"]
    by_node = {w["node"]: w["hardware"] for w in st["workers"]}
    assert by_node == {"res-h20": "H20", "train-h800": "H800"}
    assert all(len(w["gpus"]) == 2 for w in st["workers"])
    assert [w["slot"] for w in st["workers"]] == sorted(w["slot"] for w in st["workers"])
    seen = {(n["name"], w["hardware"]) for n in cluster_snapshot()["nodes"] for g in n["gpus"] for w in g["workers"]}
    assert ("res-h20", "H20") in seen and ("train-h800", "H800") in seen
    assert not any(name == "spot-a100" for name, _ in seen)


def test_a_tp_group_never_mixes_types_on_a_node_with_two_kinds_of_slot():
    """A node may report slots of different types; each TP group is gathered within one type."""
    issue_agent_token(node_name="odd")
    cred = AgentCredential.objects.filter(node_name="odd").latest("created")
    slots = [SlotSpec(index=i, hardware=("H800" if i % 2 == 0 else "H20"), memory_mb=1024) for i in range(4)]
    register_node(
        credential_id=cred.pk,
        message=Register(node="odd", pool=Pool.RESERVED, hardware="H800", incarnation="i1", slots=slots),
    )
    assert GPU.objects.filter(node__name="odd", hardware="H20").count() == 2
    units = planner._free_units(2, ["H800", "H20"])
    groups = {u.hardware: cast("tuple[str, int, tuple[int, ...]]", u.key)[2] for u in units}
    assert groups == {"H800": (0, 2), "H20": (1, 3)}


def test_the_driver_is_told_each_workers_chip_speed_so_the_router_homes_by_it():
    """The driver's view gives each serving worker its chip's relative speed (the prior's `serving_rates`, the
    same the simulator gives its router)."""
    from controlplane.core.predictor import prior_serving_rates
    from controlplane.selectors.driver import cluster_view

    make_node("res-h20", slots=4, hardware="H20")
    make_node("train-h800", pool="training", slots=4, hardware="H800")
    job = make_job(**(BASE | {"hardware_types": ["H800", "H20"], "rollout_gpus": 4}))
    run_transition(planner.plan_job(job_id=job.pk, signal="step_start"))
    workers = Worker.objects.filter(job=job, alive=True).exclude(role="training").select_related("node")
    views = {v.worker: v for v in cluster_view(job).workers}
    assert views, "no serving worker to check"
    rates = prior_serving_rates("qwen3-8b", ("H20", "H800"), 2, job.max_trajectory_tokens)
    assert rates["H800"] == 1.0 and 0.0 < rates["H20"] < 0.5  # an H20 has ~15% of an H800's compute
    for w in workers:
        if w.slot in views:
            assert views[w.slot].rate == pytest.approx(rates[w.node.hardware.upper()])
    assert {views[w.slot].rate for w in workers if w.slot in views and w.node.hardware == "H20"} == {rates["H20"]}
