"""`manage.py launch --nodes FILE`: a logical cluster from YAML, refused with the item named when wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.core.management.base import CommandError

from controlplane.management.commands.launch import read_nodes

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_cluster_reads_as_nodes():
    nodes = read_nodes(str(ROOT / "benchmarks" / "nodes-paper32.yaml"))
    assert nodes[0] == ("train-0", "training", 16, "H800")
    assert sum(s for _, pool, s, _ in nodes if pool == "elastic") == 12


@pytest.mark.parametrize(
    "text, problem",
    [
        ("- {name: a, pool: spare, slots: 2}", "pool must be one of"),
        ("- {name: a, pool: reserved, slots: 0}", "slots must be"),
        ("- {name: a, pool: reserved, slots: 2}\n- {name: a, pool: elastic, slots: 2}", "unique"),
        ("- {name: a, pool: reserved, slots: 2, gpus: 3}", "exactly name, pool, slots, hardware"),
        ("{}", "expected a list"),
        ("[", "--nodes"),
    ],
)
def test_bad_node_files_are_refused_naming_the_problem(tmp_path, text, problem):
    f = tmp_path / "nodes.yaml"
    f.write_text(text)
    with pytest.raises(CommandError, match=problem):
        read_nodes(str(f))
