"""Issue 21 (3): agents on separate hosts use the addresses they are given, not loopback. An agent started
with `--bind-address 127.0.0.2` (another address of this host, standing in for a node's own address)
binds its data plane, its workers and its trainer there, advertises them there, and the control plane
records and routes to those endpoints; nothing of it listens on 127.0.0.1. Off loopback the agent
refuses to start without a data-plane secret; the control plane still records only endpoints on the
address it saw the agent connect from."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from agents import dataplane as dp
from agents.node.config import AgentConfig
from agents.worker_client import WorkerClient, session
from tests.integration.agents.test_agents_via_control_plane import observed, train_one_step
from tests.integration.agents.test_control_plane_link import wait_for
from tests.support.processes import stop_processes

ROOT = Path(__file__).resolve().parents[3]
SECRET = "dp-secret-e2e"  # train_one_step authenticates with this one
OTHER = "127.0.0.2"
THIRD = "127.0.0.3"


def refused_on(host: str, port: int) -> bool:
    """True if nothing listens on host:port."""
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((host, port)) != 0


def test_config_binds_off_loopback_only_with_a_data_plane_secret():
    with pytest.raises(ValueError, match="needs a secret"):
        AgentConfig(control_plane="", token="t", node="n", bind_address="10.77.0.11")
    with pytest.raises(ValueError, match="advertise address"):
        AgentConfig(control_plane="", token="t", node="n", bind_address="0.0.0.0", dataplane_secret="s")
    cfg = AgentConfig(control_plane="", token="t", node="n", bind_address="10.77.0.11", dataplane_secret="s")
    assert (cfg.advertise_address, cfg.advertised_host) == ("10.77.0.11", "10.77.0.11")
    wild = AgentConfig(
        control_plane="", token="t", node="n", bind_address="::", advertise_address="fd00::7", dataplane_secret="s"
    )
    assert wild.advertised_host == "[fd00::7]"
    assert AgentConfig(control_plane="", token="t", node="n", bind_address=OTHER).advertise_address == OTHER


def test_agent_cli_refuses_a_public_bind_without_a_data_plane_secret(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PEARL_DATAPLANE_SECRET"}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agents.node",
            "--control-plane",
            "http://127.0.0.1:9",
            "--token",
            "t",
            "--bind-address",
            "10.77.0.11",
            "--state-dir",
            str(tmp_path),
        ],
        cwd=ROOT,
        env=env | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "needs a secret" in out.stderr


def test_endpoint_on_keeps_the_bound_loopback_address_and_only_the_nodes_own_elsewhere():
    from controlplane.models import Node
    from controlplane.services.heartbeat import _endpoint_on

    local = Node(name="a", address="127.0.0.1")
    assert _endpoint_on(local, "http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert _endpoint_on(local, "http://localhost:5000") == "http://127.0.0.1:5000"
    assert _endpoint_on(local, f"http://{OTHER}:5000") == f"http://{OTHER}:5000"  # same host, the bound address
    assert _endpoint_on(local, "http://10.77.0.12:5000") is None
    remote = Node(name="b", address="10.77.0.11")
    assert _endpoint_on(remote, "http://10.77.0.11:5000") == "http://10.77.0.11:5000"
    assert _endpoint_on(remote, "http://127.0.0.1:5000") is None  # its loopback is not the control plane's
    assert _endpoint_on(remote, "http://10.77.0.12:5000") is None


async def generate_and_list(endpoint: str, data_plane: str) -> tuple[dp.GenerationResult, list[dict], int]:
    s = session()
    try:
        out = await WorkerClient(endpoint, SECRET, s).generate(
            dp.GenerateRequest(
                request_id="addr-1",
                prompt="the quick brown fox",
                sampling=dp.SamplingParams(max_tokens=6, stop_at_eos=False),
            )
        )
        async with s.get(f"{data_plane}/workers", headers={"Authorization": f"Bearer {SECRET}"}) as r:
            listing = (await r.json())["workers"]
        async with s.get(f"{data_plane}/workers") as r:
            anonymous = r.status
        return out, listing, anonymous
    finally:
        await s.close()


def start_agent(cp, name: str, pool: str, address: str, tmp_path: Path) -> subprocess.Popen:
    env = dict(os.environ, PEARL_AGENT_TOKEN=cp.agent_token(name), PEARL_DATAPLANE_SECRET=SECRET, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agents.node",
            "--control-plane",
            cp.base_url,
            "--node",
            name,
            "--slots",
            "1",
            "--pool",
            pool,
            "--hardware",
            "cpu",
            "--engine",
            "emulated",
            "--time-factor",
            "0.05",
            "--bind-address",
            address,
            "--state-dir",
            str(tmp_path / name),
        ],
        cwd=ROOT,
        env=env,
        stdout=open(tmp_path / f"{name}.log", "wb"),
        stderr=subprocess.STDOUT,
    )


@pytest.mark.django_db(transaction=True)
def test_agents_bound_to_other_addresses_advertise_serve_and_are_routed_there(control_plane_server, tmp_path):
    from controlplane.models import Node
    from controlplane.services.workers import WorkerChange, change_workers, start_worker
    from tests.support.cluster import make_job

    for address in (OTHER, THIRD):
        with socket.socket() as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                pytest.skip(f"{address} is not a local address here")
    cp = control_plane_server
    agents = [
        start_agent(cp, "addr-roll", "reserved", OTHER, tmp_path),
        start_agent(cp, "addr-train", "training", THIRD, tmp_path),
    ]
    try:
        r_node = wait_for(
            lambda: Node.objects.filter(name="addr-roll", last_heartbeat__isnull=False).first(), what="node"
        )
        t_node = wait_for(
            lambda: Node.objects.filter(name="addr-train", last_heartbeat__isnull=False).first(), what="node"
        )
        for node, address in ((r_node, OTHER), (t_node, THIRD)):
            dp_url = urlsplit(node.data_plane)
            assert dp_url.hostname == address and refused_on("127.0.0.1", dp_url.port)
        job = make_job("addr", engine="emulated", model="tiny", rollout_gpus=1, training_gpus=1)
        trainer = start_worker(job_id=job.pk, node_id=t_node.pk, gpu_indexes=[0], role="training", activity="inactive")
        roll = start_worker(job_id=job.pk, node_id=r_node.pk, gpu_indexes=[0], role="colocated", activity="inactive")
        change_workers(job_id=job.pk, changes=[WorkerChange(roll.slot, activity="active")])
        w = wait_for(lambda: observed(r_node.pk, roll.pk, role="colocated"), what="rollout worker")
        t = wait_for(lambda: observed(t_node.pk, trainer.pk), what="trainer")
        for ep, address in ((w["endpoint"], OTHER), (t["endpoint"], THIRD)):  # as the control plane records them
            url = urlsplit(ep)
            assert url.hostname == address, ep
            assert refused_on("127.0.0.1", url.port), f"{ep} also listens on 127.0.0.1"
        out, listing, anonymous = asyncio.run(generate_and_list(w["endpoint"], r_node.data_plane))
        assert len(out.tokens) == 6
        assert anonymous == 401
        assert [urlsplit(x["endpoint"]).hostname for x in listing] == [OTHER]
        assert asyncio.run(train_one_step(t["endpoint"])) == 1
    finally:
        stop_processes(agents, grace_s=60)
