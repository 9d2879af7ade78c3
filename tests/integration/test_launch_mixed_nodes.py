"""`manage.py launch`: a `--nodes` file may mix chip types (each a type the profiles know, spelled as they spell
it), and the demo's SWE job takes its shape from the cluster: training on the training nodes' chip, the rollout
pool on every chip type of the reserved and elastic nodes, the paper's group of 16 with the batch scaled to the
cluster (B = 32 on the demo's half-scale paper cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management.base import CommandError

from controlplane.management.commands.launch import DEMO_NODES, Command, read_nodes
from tests.support.cluster import make_node

ROOT = Path(__file__).resolve().parents[2]


def test_a_mixed_nodes_file_reads_with_each_chip_as_the_profiles_spell_it(tmp_path):
    nodes = read_nodes(str(ROOT / "examples" / "nodes-mixed.yaml"))
    assert {hw for _, pool, _, hw in nodes if pool == "elastic"} == {"H800", "H20", "A100"}
    f = tmp_path / "n.yaml"
    f.write_text("- {name: a, pool: elastic, slots: 2, hardware: h20}\n")
    assert read_nodes(str(f)) == [("a", "elastic", 2, "H20")]
    f.write_text("- {name: a, pool: elastic, slots: 2, hardware: B200}\n")
    with pytest.raises(CommandError, match="a: unknown hardware 'B200'"):
        read_nodes(str(f))


def _demo_jobs(cluster):
    from controlplane.models import Job

    for name, pool, slots, hw in cluster:
        make_node(name, pool=pool, slots=slots, hardware=hw)
    Command()._demo_job({"cluster": cluster})
    return {j.name.split("-")[0]: j for j in Job.objects.all()}


@pytest.mark.django_db
def test_the_demo_swe_job_is_the_papers_shape_at_half_scale():
    jobs = _demo_jobs(DEMO_NODES)
    swe = jobs["swe"]
    assert (swe.batch_size, swe.group_size, swe.tp, swe.max_trajectory_tokens) == (32, 16, 2, 32768)
    assert (swe.rollout_gpus, swe.training_gpus, swe.hardware, swe.hardware_types) == (8, 8, "H800", [])
    assert jobs["calc"].hardware == "cpu"


@pytest.mark.django_db
def test_on_a_mixed_cluster_the_demo_swe_job_rolls_out_on_every_type():
    swe = _demo_jobs(read_nodes(str(ROOT / "examples" / "nodes-mixed.yaml")))["swe"]
    assert swe.hardware == "H800" and swe.hardware_types == ["A100", "H20", "H800"]
    assert (swe.rollout_gpus, swe.training_gpus, swe.batch_size) == (8, 8, 32)


@pytest.mark.django_db
def test_the_demo_jobs_are_created_by_the_demo_operator(tmp_path):
    from controlplane.selectors.jobs import job_status

    Command()._demo_user(tmp_path)
    jobs = _demo_jobs(DEMO_NODES)
    assert {name: j.created_by.username for name, j in jobs.items() if j.created_by} == {"swe": "demo", "calc": "demo"}
    st = job_status(jobs["swe"].pk)
    assert st is not None and st["job"]["created_by"] == "demo"  # what `pearl list` and the job page show
