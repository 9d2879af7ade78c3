"""A live Daphne on the test database with some state to fuzz against (nodes, jobs, workers, events),
an operator and a read-only user; writes are not rate-limited here, so the fuzzer reaches the logic."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.cluster import make_job, make_node
from tests.support.environment import child_env, redis_available
from tests.support.processes import free_port, start_process, stop_processes, wait_port


@dataclass
class FuzzTarget:
    base_url: str
    tokens: dict[str, str]


def seed_state() -> dict[str, str]:
    from django.contrib.auth.models import Group, User
    from rest_framework.authtoken.models import Token

    from controlplane.services.workers import start_worker

    r = make_node("fz-roll", slots=4)
    make_node("fz-spot", pool="elastic", slots=2)
    t = make_node("fz-train", pool="training", slots=2)
    job = make_job("fz-job", rollout_gpus=4, training_gpus=2)
    start_worker(job_id=job.pk, node_id=r.pk, gpu_indexes=[0], role="colocated", activity="active")
    start_worker(job_id=job.pk, node_id=t.pk, gpu_indexes=[0], role="training", activity="inactive")
    op = User.objects.create_user("fz-operator", is_staff=True)
    op.groups.add(Group.objects.get_or_create(name="operators")[0])
    reader = User.objects.create_user("fz-reader")
    return {"operator": Token.objects.create(user=op).key, "reader": Token.objects.create(user=reader).key}


@pytest.fixture
def fuzz_target(transactional_db, tmp_path) -> Iterator[FuzzTarget]:
    if not redis_available():
        pytest.skip("Redis is not reachable")
    tokens = seed_state()
    port = free_port()
    proc = start_process(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "pearl_site.asgi:application"],
        child_env(PEARL_WRITE_RATE="1000000/min"),
        tmp_path / "daphne.log",
    )
    try:
        wait_port(port, proc=proc)
        yield FuzzTarget(base_url=f"http://127.0.0.1:{port}", tokens=tokens)
    finally:
        stop_processes([proc])
