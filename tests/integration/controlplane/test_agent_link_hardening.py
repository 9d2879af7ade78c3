"""The audit's agent-link reproductions, over the real ASGI app and Redis channel layer: an agent is
trusted only for what it owns, every message is fenced by the socket holding the lease and by epoch,
and malformed frames get an error reply while the link stays up."""

from __future__ import annotations

import asyncio
import json

import pytest
from channels.db import database_sync_to_async

from controlplane.core import agent_link as link
from controlplane.models import Event, Job, Node, TelemetrySample, Worker
from controlplane.selectors import job_tokens
from controlplane.services import credentials, workers
from pearl_site.asgi import application
from tests.support.cluster import make_job
from tests.support.environment import redis_available
from tests.support.sockets import WebsocketCommunicator

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not redis_available(), reason="Redis is not reachable"),
]


def register_msg(name: str, pool: str = "reserved", incarnation: str = "inc-1", slots: int = 2) -> dict:
    return {
        "type": "register",
        "node": name,
        "pool": pool,
        "hardware": "cpu",
        "incarnation": incarnation,
        "slots": [{"index": i, "hardware": "cpu", "memory_mb": 1024} for i in range(slots)],
    }


def socket_for(token: str) -> WebsocketCommunicator:
    # the peer address is what the control plane records as the node's address
    ws = WebsocketCommunicator(
        application, "/ws/agent/", headers=[(b"host", b"localhost"), (b"authorization", f"Bearer {token}".encode())]
    )
    ws.scope["client"] = ("127.0.0.1", 50000)
    return ws


async def connect(name: str, token: str | None = None, **kw) -> tuple[WebsocketCommunicator, dict, dict, str]:
    token = token or await database_sync_to_async(credentials.issue_agent_token)(node_name=name)
    ws = socket_for(token)
    assert (await ws.connect())[0]
    await ws.send_json_to(register_msg(name, **kw))
    reg = await ws.receive_json_from(timeout=5)
    desired = await ws.receive_json_from(timeout=5)
    assert reg["type"] == "registered" and desired["type"] == "desired_state"
    return ws, reg, desired, token


async def receive_until(ws: WebsocketCommunicator, kind: str, timeout: float = 5) -> dict:
    while True:
        msg = await ws.receive_json_from(timeout=timeout)
        if msg["type"] == kind:
            return msg


def hb(epoch: int, workers_: list[dict] | None = None, generation: int = 0) -> dict:
    return {"type": "heartbeat", "epoch": epoch, "generation": generation, "workers": workers_ or []}


def observed(worker_id: int, role: str, **kw) -> dict:
    return {"worker_id": worker_id, "role": role, "activity": "inactive", "state": "running"} | kw


@database_sync_to_async
def cluster_with_trainer() -> tuple[Job, Worker, Worker]:
    job = make_job("victim", rollout_gpus=2, training_gpus=2)
    t = Node.objects.get(name="train-a")
    r = Node.objects.get(name="roll-a")
    trainer = workers.start_worker(job_id=job.pk, node_id=t.pk, gpu_indexes=[0], role="training", activity="inactive")
    rollout = workers.start_worker(job_id=job.pk, node_id=r.pk, gpu_indexes=[0], role="colocated", activity="active")
    return job, trainer, rollout


async def test_an_agent_cannot_redirect_the_clusters_weights():
    """The audit: a training node's token reported its trainer at another URL with a huge version, and
    every rollout worker pulled from that URL (with the cluster-wide weights token) and got stuck."""
    tws, treg, _, _ = await connect("train-a", pool="training")
    rws, rreg, _, _ = await connect("roll-a")
    job, trainer, rollout = await cluster_with_trainer()
    await receive_until(tws, "desired_state")
    await receive_until(rws, "desired_state")
    # an honest report first: on the node's own address, one version ahead
    await tws.send_json_to(
        hb(treg["epoch"], [observed(trainer.pk, "training", endpoint="http://127.0.0.1:7001", weight_version=1)])
    )
    pushed = await receive_until(rws, "desired_state")
    (w,) = pushed["workers"]
    assert w["weights_url"] == "http://127.0.0.1:7001" and w["min_weight_version"] == 0
    assert w["weights_token"].startswith("pwt_") and "weights_key" not in json.dumps(w).replace('"weights_key": ""', "")
    # the attack: another host, a huge version
    for evil in (
        {"endpoint": "http://attacker.example:80", "weight_version": 2},
        {"endpoint": "http://127.0.0.1:7001", "weight_version": 2**31 - 1},
        {"endpoint": "http://10.9.9.9:7001/steal", "weight_version": 1},
        {"endpoint": "https://127.0.0.1:7001", "weight_version": 1},
    ):
        await tws.send_json_to(hb(treg["epoch"], [observed(trainer.pk, "training", **evil)]))
        err = await receive_until(tws, "error")
        assert err["code"] == "refused" and f"worker {trainer.pk}" in err["message"], err
    job_now = await database_sync_to_async(Job.objects.get)(pk=job.pk)
    t_now = await database_sync_to_async(Worker.objects.get)(pk=trainer.pk)
    assert job_now.weight_version == 1 and t_now.endpoint == "http://127.0.0.1:7001"
    assert await database_sync_to_async(Event.objects.filter(kind="agent.refused").count)() == 4
    assert await rws.receive_nothing(timeout=0.5)  # the rollout node heard nothing new
    # a rollout agent cannot claim a version the job never published either
    await rws.send_json_to(hb(rreg["epoch"], [observed(rollout.pk, "colocated", weight_version=5)]))
    assert "never published" in (await receive_until(rws, "error"))["message"]
    assert (await database_sync_to_async(Worker.objects.get)(pk=rollout.pk)).weight_version == 0
    for ws in (tws, rws):
        await ws.disconnect()


async def test_weights_tokens_are_scoped_per_job_and_the_key_goes_only_to_the_trainer():
    tws, treg, _, _ = await connect("train-a", pool="training")
    rws, _, _, _ = await connect("roll-a")
    _job, trainer, _ = await cluster_with_trainer()
    t_state = await receive_until(tws, "desired_state")
    await receive_until(rws, "desired_state")  # the worker's start, before the trainer has an endpoint
    await tws.send_json_to(hb(treg["epoch"], [observed(trainer.pk, "training", endpoint="http://127.0.0.1:7001")]))
    r_state = await receive_until(rws, "desired_state")
    key = t_state["workers"][0]["weights_key"]
    token = r_state["workers"][0]["weights_token"]
    assert key and not r_state["workers"][0]["weights_key"] and not t_state["workers"][0]["weights_token"]
    rotate = treg["weights_rotate_s"]
    assert link.verify_weights_token(key, "victim", token, rotate)
    assert not link.verify_weights_token(key, "other-job", token, rotate)  # scoped to its job
    other = await database_sync_to_async(make_job)("other-job", rollout_gpus=2, training_gpus=2)
    other_key = await database_sync_to_async(job_tokens.job_weights_key)(other)
    assert other_key != key and not link.verify_weights_token(other_key, "victim", token, rotate)
    import time

    assert not link.verify_weights_token(key, "victim", token, rotate, now=time.time() + 3 * rotate)  # it expires
    for ws in (tws, rws):
        await ws.disconnect()


async def test_tokens_rotate_with_the_next_heartbeat(settings):
    settings.PEARL = {**settings.PEARL, "WEIGHTS_TOKEN_ROTATE_S": 0.5}
    tws, treg, _, _ = await connect("train-a", pool="training")
    rws, rreg, _, _ = await connect("roll-a")
    _job, trainer, _ = await cluster_with_trainer()
    await receive_until(rws, "desired_state")
    await tws.send_json_to(hb(treg["epoch"], [observed(trainer.pk, "training", endpoint="http://127.0.0.1:7001")]))
    first = (await receive_until(rws, "desired_state"))["workers"][0]["weights_token"]
    minted = link.minted_bucket(first)
    assert minted is not None
    # the node resends at its own boundary (offset under half a period), and a token minted between the
    # period's boundary and the node's is still the current period's at that resend: wait for both
    start = link.resend_bucket(0.5, rreg["node_id"])
    while link.resend_bucket(0.5, rreg["node_id"]) == start or link.token_bucket(0.5) == minted:
        await asyncio.sleep(0.05)
    await rws.send_json_to(hb(rreg["epoch"]))
    again = await receive_until(rws, "desired_state")
    assert (
        again["workers"][0]["weights_token"] != first and again["workers"][0]["weights_url"] == "http://127.0.0.1:7001"
    )
    for ws in (tws, rws):
        await ws.disconnect()


async def test_a_second_socket_supersedes_the_first_whatever_incarnation_it_claims():
    """The audit: a second socket with the same token registered while the first kept heartbeating."""
    ws1, reg1, _, token = await connect("gpu-a", incarnation="same")
    ws2, reg2, _, _ = await connect("gpu-a", token=token, incarnation="same")
    assert reg2["epoch"] == reg1["epoch"] + 1  # reusing the incarnation still bumps the epoch
    err = await receive_until(ws1, "error")
    assert err["code"] == "superseded"
    closed = await ws1.receive_output(timeout=5)
    assert closed == {"type": "websocket.close", "code": link.CLOSE_SUPERSEDED}
    # the holder's heartbeats count; a third socket that only replays the new epoch does not
    ws3 = socket_for(token)
    assert (await ws3.connect())[0]
    await ws3.send_json_to(hb(reg2["epoch"]))
    assert (await ws3.receive_json_from(timeout=5))["code"] == "not_registered"
    before = await database_sync_to_async(lambda: Node.objects.get(name="gpu-a").last_heartbeat)()
    await ws2.send_json_to(hb(reg2["epoch"]))
    await asyncio.sleep(0.3)
    after = await database_sync_to_async(lambda: Node.objects.get(name="gpu-a").last_heartbeat)()
    assert after > before
    for ws in (ws1, ws2, ws3):
        await ws.disconnect()  # ws1's consumer is closed already; this lets its task end


async def test_stale_epoch_faults_and_telemetry_are_not_stored():
    ws, reg, _, _ = await connect("gpu-a")
    job = await database_sync_to_async(make_job)("j1", rollout_gpus=1, training_gpus=0)
    w = await database_sync_to_async(workers.start_worker)(
        job_id=job.pk, node_id=reg["node_id"], gpu_indexes=[0], role="colocated"
    )
    await receive_until(ws, "desired_state")
    record = {"kind": "decode_iteration", "job": "j1", "running_batch": 8, "duration_s": 0.01}
    faults = await database_sync_to_async(Event.objects.filter(kind="worker.fault").count)()
    await ws.send_json_to({"type": "telemetry", "epoch": reg["epoch"] - 1, "records": [record]})
    assert (await receive_until(ws, "error"))["code"] == "stale_epoch"
    await ws.send_json_to({"type": "fault", "epoch": reg["epoch"] + 5, "worker_id": w.pk, "kind": "crashed"})
    assert (await receive_until(ws, "error"))["code"] == "stale_epoch"
    assert await database_sync_to_async(TelemetrySample.objects.count)() == 0
    assert await database_sync_to_async(Event.objects.filter(kind="worker.fault").count)() == faults
    # with the current epoch both are stored
    await ws.send_json_to({"type": "telemetry", "epoch": reg["epoch"], "records": [record | {"worker": w.pk}]})
    await ws.send_json_to({"type": "fault", "epoch": reg["epoch"], "worker_id": w.pk, "kind": "crashed"})
    await asyncio.sleep(0.5)
    assert await database_sync_to_async(TelemetrySample.objects.filter(job=job).count)() == 1
    assert await database_sync_to_async(Event.objects.filter(kind="worker.fault").count)() == faults + 1
    await ws.disconnect()


async def test_telemetry_and_faults_only_about_what_the_node_runs():
    """The audit: telemetry naming another node's job was accepted and fed that job's predictor."""
    aws, areg, _, _ = await connect("gpu-a")
    bws, breg, _, _ = await connect("gpu-b")
    job = await database_sync_to_async(make_job)("theirs", rollout_gpus=1, training_gpus=0)
    wb = await database_sync_to_async(workers.start_worker)(
        job_id=job.pk, node_id=breg["node_id"], gpu_indexes=[0], role="colocated"
    )
    for bad in (
        {"kind": "decode_iteration", "job": "theirs", "running_batch": 999, "duration_s": 99.0},
        {"kind": "decode_iteration", "job": "nobody", "running_batch": 1, "duration_s": 0.1},
        {"kind": "decode_iteration", "job": "", "running_batch": 1, "duration_s": 0.1},
    ):
        await aws.send_json_to({"type": "telemetry", "epoch": areg["epoch"], "records": [bad]})
        err = await receive_until(aws, "error")
        assert err["code"] in ("not_owned", "invalid") and "records[0].job" in err["message"], err
    await aws.send_json_to(
        {"type": "fault", "epoch": areg["epoch"], "worker_id": wb.pk, "kind": "crashed", "detail": "lies"}
    )
    assert (await receive_until(aws, "error"))["code"] == "not_owned"
    # node b's own agent can report both; a record naming one of b's workers from a is refused too
    await bws.send_json_to(
        {
            "type": "telemetry",
            "epoch": breg["epoch"],
            "records": [
                {"kind": "decode_iteration", "job": "theirs", "worker": wb.pk, "running_batch": 4, "duration_s": 0.01}
            ],
        }
    )
    await asyncio.sleep(0.3)
    assert await database_sync_to_async(TelemetrySample.objects.filter(job=job).count)() == 1
    assert not await database_sync_to_async(Event.objects.filter(kind="worker.fault").exists)()
    # the link stayed up through every refusal
    await aws.send_json_to(hb(areg["epoch"]))
    if not await aws.receive_nothing(timeout=0.5):  # a fresh heartbeat has no answer but at a resend boundary
        assert (await aws.receive_json_from())["type"] == "desired_state"
    for ws in (aws, bws):
        await ws.disconnect()


MALFORMED = [
    ("[" * 5000 + "]" * 5000, "nested"),
    (
        json.dumps(
            {
                "type": "fault",
                "epoch": 1,
                "worker_id": 0,
                "kind": "x",
                "aborted": [{"a": [[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]}],
            }
        ),
        "nested",
    ),
    ('{"type": "heartbeat", "epoch": NaN, "generation": 0}', "NaN"),
    ('{"type": "heartbeat", "epoch": 1e999, "generation": 0}', "finite"),
    ('{"type": "fault", "epoch": 1, "worker_id": 0, "kind": "x", "detail": "a\\u0000b"}', "NUL"),
    ('{"type": "fault", "epoch": 1, "worker_id": 0, "kind": "x", "detail": "\\ud800"}', "surrogate"),
    ('{"type": "fault", "epoch": 1, "worker_id": 0, "kind": "x", "aborted": [{"k\\u0000": 1}]}', "NUL"),
    ('{"type": "heartbeat", "epoch": 99999999999999999999999, "generation": 0}', "<="),
    (
        '{"type": "heartbeat", "epoch": 1, "generation": 0, "workers": [{"worker_id": 1, "role": "decode", '
        '"activity": "active", "state": "running", "weight_version": 4294967296}]}',
        "<=",
    ),
    ("9" * 5000, "malformed"),
    (" ", "malformed"),
    ("null", "JSON object"),
]


async def test_malformed_frames_get_an_error_and_the_link_stays_up():
    ws, reg, _, _ = await connect("gpu-a")
    for frame, fragment in MALFORMED:
        await ws.send_to(text_data=frame)
        err = await ws.receive_json_from(timeout=5)
        assert err["type"] == "error" and fragment in err["message"], (frame[:60], err)
    await ws.send_to(bytes_data=b"\x00\x01")
    assert (await ws.receive_json_from(timeout=5))["code"] == "bad_message"
    assert not await database_sync_to_async(Event.objects.filter(kind="worker.fault").exists)()
    before = await database_sync_to_async(Node.objects.get)(name="gpu-a")
    await ws.send_json_to(hb(reg["epoch"]))  # still registered, still the lease holder: the heartbeat renews it
    for _ in range(50):
        node = await database_sync_to_async(Node.objects.get)(name="gpu-a")
        if node.last_heartbeat > before.last_heartbeat:
            break
        await asyncio.sleep(0.1)
    assert node.last_heartbeat > before.last_heartbeat and node.lease_expires > before.lease_expires
    assert node.status == "ready" and node.epoch == reg["epoch"]
    await ws.disconnect()


async def test_a_worker_on_other_devices_than_its_slots_is_reported():
    ws, reg, _, _ = await connect("gpu-a")
    job = await database_sync_to_async(make_job)("j2", rollout_gpus=1, training_gpus=0)
    w = await database_sync_to_async(workers.start_worker)(
        job_id=job.pk, node_id=reg["node_id"], gpu_indexes=[1], role="colocated"
    )
    await receive_until(ws, "desired_state")
    await ws.send_json_to(hb(reg["epoch"], [observed(w.pk, "colocated", devices=[1])]))
    await ws.send_json_to(hb(reg["epoch"], [observed(w.pk, "colocated", devices=[0])]))
    err = await receive_until(ws, "error")
    assert err["code"] == "refused" and "runs on devices [0], bound to slots [1]" in err["message"]
    assert await database_sync_to_async(Event.objects.filter(kind="agent.refused").count)() == 1
    await ws.disconnect()
