"""The one wire codec writes the bytes each protocol wrote before it (recorded in `wire_frames.json` from
the three codecs it replaced) and reads them back into equal messages: the agent link and the driver link
as their sockets send them (`json.dumps`), the data plane as the worker and client send it (orjson), and
the answers the trainer and the weight store built as raw dicts (aiohttp's `json_response`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from agents import dataplane as dp
from controlplane.core import agent_link as link
from controlplane.core import driver_link as dl
from controlplane.core.context import Signal
from controlplane.core.state import Activity, Pool, Role
from controlplane.core.wire import ErrorReply, WireError, WireProtocol

FRAMES = json.loads((Path(__file__).parent / "wire_frames.json").read_text())


def as_recorded(sent: Any, recorded: Any) -> Any:
    """`sent` without the keys the recording lacks: a field a protocol gained since the recording (with a
    default, so older senders still parse) is not a change of the bytes the recording pins; every key the
    recording has keeps its place, spelling and value."""
    if isinstance(sent, dict) and isinstance(recorded, dict):
        return {k: as_recorded(v, recorded[k]) for k, v in sent.items() if k in recorded}
    if isinstance(sent, list) and isinstance(recorded, list) and len(sent) == len(recorded):
        return [as_recorded(v, r) for v, r in zip(sent, recorded, strict=True)]
    return sent


def agent_messages() -> dict[str, Any]:
    w = link.ObservedWorker(
        3, Role.DECODE, Activity.ACTIVE, "running", weight_version=2, endpoint="http://10.0.0.2:4001", inflight=5,
        generation=7, devices=[0, 1],
    )  # fmt: skip
    dw = link.DesiredWorker(
        3, [0, 1], Role.DECODE, Activity.ACTIVE, "emulated", model="qwen3-8b", job="j1", min_weight_version=1,
        weights_url="http://10.0.0.1:5000", weights_token="pwt_1.ab", weights_key="", dataplane_token="dpt",
    )  # fmt: skip
    slots = [link.SlotSpec(0, "H800", 81920), link.SlotSpec(1, "H800", 81920)]
    aborted = [
        {"request_id": "r1", "tokens": [1, 2], "logprobs": [-0.5, -0.25], "finish_reason": "abort", "worker_id": 3}
    ]
    return {
        "register": link.Register(
            "n1", Pool.ELASTIC, "H800", slots, "inc-1", engine="torch", data_plane="http://10.0.0.2:9000"
        ),
        "heartbeat": link.Heartbeat(4, 7, [w]),
        "telemetry": link.TelemetryBatch(4, [{"kind": "TURN", "time_s": 1.5, "job": "j1", "tokens": 12}]),
        "fault": link.Fault(4, 3, "drained", "2 requests aborted", aborted),
        "registered": link.Registered(11, 4, 10.0, 2.5, weights_rotate_s=300.0),
        "desired_state": link.DesiredState(
            7, 4, "ready", [dw], preemption_deadline=1.5e9, drivers=[link.DesiredDriver("j1", "drv")]
        ),
        "error": ErrorReply("stale_epoch", "epoch 3 < 4"),
    }


def driver_messages() -> dict[str, Any]:
    rw = dl.RoutableWorker(2, Role.COLOCATED, "http://w:1", overlap=True, gpus=2, weight_version=3, rate=0.5)
    decision = dl.DecisionView(9, "periodic", "colocated", 0, 0, 4, 12.5, True)
    cv = dl.ClusterView([rw], 3, True, 1, trainer="http://t:2", stopped=False, decision=decision)
    jv = dl.JobView(
        "j1", "math", "tiny", "emulated", 8, 4, 1, 4096, 30.0, seed=5, training_gpus=1, agent={"tasks": [{"q": 1}]},
        dispatch="jsq", dispatch_cap=2,
    )  # fmt: skip
    ts = dl.TrajectorySummary(
        "s0-t1", "done", reward=1.0, turns=2, forks=0, reason="", stderr="",
        messages=[{"role": "user", "content": "hi"}],
        tokens=[5, 6, 7], mask=[0, 1, 1], logprobs=[0.0, -0.5, -0.25], sample_lens=[3], token_count=3, truncated=False,
        weight_versions=[2], workers=[[2]], latency_s=[0.25], trained=True,
    )  # fmt: skip
    return {
        "hello": dl.Hello("j1", "inc-2"),
        "progress": dl.ProgressReport(3, 17),
        "signal": dl.SignalReport(Signal.TRAINING_BEGIN, 0),
        "telemetry": dl.TelemetryReport([{"kind": "STEP", "step": 3, "makespan_s": 9.5}]),
        "checkpoint": dl.CheckpointReport({"clock_epoch": 1.5, "loop": {"step": 3}}),
        "trajectories": dl.TrajectoryReport(3, [ts]),
        "update_request": dl.UpdateRequest(3),
        "welcome": dl.Welcome(jv, cv, "dpt", checkpoint={"clock_epoch": 2.0}),
        "cluster": cv,
        "update_granted": dl.UpdateGranted(3),
        "error": ErrorReply("conflict", "Training Begin first", "training_active"),
    }


def data_plane_messages() -> dict[str, Any]:
    sp = dp.SamplingParams(max_tokens=64, temperature=0.75, top_p=0.5, seed=42, stop_at_eos=False)
    gr = dp.GenerationResult("r1", [5, 6], [-0.5, -0.25], "stop", 3, 2, worker_id=4, text="ab")
    ts = dp.TrainSample("0-1", [1, 2, 3], [5, 6], [-0.5, -0.25], 1.0, 2, temperature=0.75, trajectory="s0-t1")
    return {
        "sampling": sp,
        "generate_request": dp.GenerateRequest("r1", [1, 2, 3], "", sp, min_weight_version=2, job="j1"),
        "decode_request": dp.DecodeRequest("r1", "http://p:1", "h1", "kvt", sp, min_weight_version=2, job="j1"),
        "abort_request": dp.AbortRequest("r1"),
        "drain_request": dp.DrainRequest("wait", 12.5),
        "sleep_request": dp.SleepRequest(1),
        "load_weights_request": dp.LoadWeightsRequest("http://t:2", 0, "pwt_1.ab"),
        "set_role_request": dp.SetRoleRequest("decode"),
        "resume_request": dp.ResumeRequest(),
        "generation_result": gr,
        "prefill_result": dp.PrefillResult("r1", "h1", "kvt", 3, 5, -0.5, 4096, 2, worker_id=4),
        "drain_result": dp.DrainResult([gr], False),
        "worker_stats": dp.WorkerStats(
            4, "emulated", "decode", "running", 2, 3, 1, 100, 0.02, 500, 0.5, 300, 1500.0, 4096, 0, 1, epoch=4
        ),
        "health": dp.Health(True, 4, "decode", "running", 2, 1234, devices=[0, 1], sleep_mode="levels"),
        "train_sample": ts,
        "submit_samples": dp.SubmitSamples([ts], train=False, step=3),
        "step_request": dp.StepRequest(all=False, step=3, trajectories=["s0-t1"], dropped=["s0-t2"], training_gpus=1),
    }


STATS = {"version": 4, "loss": 0.5, "grad_norm": 1.25, "mean_reward": 0.75, "accepted": 8, "rejected_stale": 0,
         "kl": 0.0, "duration_s": 2.5}  # fmt: skip
# the answers the servers built as raw dicts: (recorded name, message, its encoder)
RAW_ANSWERS: dict[str, tuple[Any, Callable[[Any], str | bytes]]] = {
    "worker_error": (ErrorReply(detail="body is not JSON: bad"), orjson.dumps),
    "worker_telemetry": (dp.TelemetryRecords([{"kind": "TURN", "time_s": 1.5}]), orjson.dumps),
    "trainer_error": (ErrorReply(detail="SubmitSamples.samples: bad"), json.dumps),
    "trainer_samples_buffered": (dp.SamplesKept(3, 2), json.dumps),
    "trainer_samples_queued": (dp.SamplesQueued(5, 2, STATS), json.dumps),
    "trainer_step": (dp.UpdateAnswer(4, STATS, already=False, missing=["s0-t3"]), json.dumps),
    "trainer_step_queued": (dp.QueuedUpdateAnswer(4, None), json.dumps),
    "weights_latest": (dp.WeightsIndex(4, [3, 4]), json.dumps),
    "weights_error": (ErrorReply(detail="missing or bad weights token"), json.dumps),
}

LINKS = [
    ("agent_link", link.AGENT_LINK, agent_messages, link.AGENT_MESSAGES, link.CONTROL_MESSAGES),
    ("driver_link", dl.DRIVER_LINK, driver_messages, dl.DRIVER_MESSAGES, dl.CONTROL_MESSAGES),
]


@pytest.mark.parametrize("name,proto,build,inbound,outbound", LINKS, ids=[x[0] for x in LINKS])
def test_links_write_the_recorded_frames_and_read_them_back(name, proto, build, inbound, outbound):
    recorded = FRAMES[name]
    messages = build()
    assert sorted(messages) == sorted(recorded)  # every recorded message type is replayed
    for key, msg in messages.items():
        frame = json.dumps(as_recorded(proto.dump(msg), json.loads(recorded[key])))
        assert frame == recorded[key], key
        table = outbound if msg.type in outbound and type(msg) is outbound[msg.type] else inbound
        assert proto.parse(proto.decode(recorded[key]), table) == msg, key


def test_the_data_plane_writes_the_recorded_bodies_and_reads_them_back():
    recorded, messages = FRAMES["data_plane"], data_plane_messages()
    assert sorted(messages) == sorted(recorded)
    for key, msg in messages.items():
        sent = as_recorded(dp.DATA_PLANE.dump(msg), json.loads(recorded[key]))
        assert orjson.dumps(sent).decode() == recorded[key], key
        assert dp.DATA_PLANE.parse(orjson.loads(recorded[key]), type(msg)) == msg, key


@pytest.mark.parametrize("key", sorted(RAW_ANSWERS))
def test_answers_once_built_as_raw_dicts_keep_their_bytes(key):
    msg, encode = RAW_ANSWERS[key]
    raw = encode(as_recorded(dp.DATA_PLANE.dump(msg), json.loads(FRAMES["data_plane_raw"][key])))
    assert (raw.decode() if isinstance(raw, bytes) else raw) == FRAMES["data_plane_raw"][key]
    assert dp.DATA_PLANE.parse(json.loads(FRAMES["data_plane_raw"][key]), type(msg)) == msg


def test_one_error_type_and_one_error_message_across_the_protocols():
    spelled = {
        "agent_link": {"type": "error", "code": "bad_message", "message": "why"},
        "driver_link": {"type": "error", "error": "bad_message", "detail": "why", "field": ""},
    }
    for proto, table, name in (
        (link.AGENT_LINK, link.CONTROL_MESSAGES, "agent_link"),
        (dl.DRIVER_LINK, dl.CONTROL_MESSAGES, "driver_link"),
    ):
        sent = proto.dump(ErrorReply("bad_message", "why"))
        assert sent == spelled[name] and proto.parse(sent, table) == ErrorReply("bad_message", "why")
    assert dp.DATA_PLANE.parse({"error": "why"}, ErrorReply) == ErrorReply(detail="why")
    for proto in (link.AGENT_LINK, dl.DRIVER_LINK):
        with pytest.raises(WireError, match="JSON object"):
            proto.parse(None, link.AGENT_MESSAGES)
        with pytest.raises(WireError, match="unknown message type"):
            proto.parse({"type": "boss"}, link.AGENT_MESSAGES)
    with pytest.raises(WireError, match=r"DrainRequest\.mode"):
        dp.DATA_PLANE.parse({"mode": "later"}, dp.DrainRequest)
    with pytest.raises(WireError, match="unknown fields"):
        dp.DATA_PLANE.parse({"error": "x", "code": "y"}, ErrorReply)
    assert isinstance(link.AGENT_LINK, WireProtocol) and isinstance(dp.DATA_PLANE, WireProtocol)
