"""Agent fencing and reconnect logic against a fake agent-link server (no workers started)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from agents.node import AgentConfig, NodeAgent, run_agent
from controlplane.core import agent_link as link
from tests.unit.agents.fake_control_plane import FakeControlPlane


def desired(generation: int, epoch: int, workers: list | None = None, **kw) -> link.DesiredState:
    return link.DesiredState(generation=generation, epoch=epoch, status="ready", workers=workers or [], **kw)


def make_agent(url: str, tmp_path: Path, token: str = "node-token") -> NodeAgent:
    return NodeAgent(
        AgentConfig(
            control_plane=url,
            token=token,
            node="n1",
            pool="elastic",
            hardware="H800",
            slots=2,
            state_dir=tmp_path,
            time_factor=0.01,
        )
    )


def test_stale_generation_and_epoch_are_refused(tmp_path):
    agent = make_agent("http://127.0.0.1:1", tmp_path)
    assert agent.apply(desired(5, 2))
    assert not agent.apply(desired(4, 2))  # older generation
    assert not agent.apply(desired(6, 1))  # older epoch (fencing token)
    assert agent.generation == 5 and agent.epoch == 2
    assert agent.apply(desired(5, 2))  # the same state again (reconnect): idempotent
    assert agent.apply(desired(6, 3))  # a newer epoch is adopted
    faults = [agent.outbox.get_nowait() for _ in range(agent.outbox.qsize())]
    assert [f["kind"] for f in faults] == ["stale_command", "stale_command"]
    assert all(link.AGENT_LINK.parse(f, link.AGENT_MESSAGES) for f in faults)


def test_malformed_control_messages_change_nothing(tmp_path):
    agent = make_agent("http://127.0.0.1:1", tmp_path)
    agent.on_control({"type": "desired_state", "generation": -1, "epoch": 0, "status": "ready", "workers": []})
    agent.on_control({"type": "explode"})
    agent.on_control(["not", "an", "object"])
    assert agent.desired is None and agent.generation == -1


def test_a_socket_the_control_plane_calls_unregistered_registers_again(tmp_path):
    """A registration that did not take on the control plane's side (its channel layer failed while Redis
    restarted) is answered `not_registered` at every heartbeat: the agent registers again on that socket
    instead of heartbeating into it for good; other errors send nothing."""
    agent = make_agent("http://127.0.0.1:1", tmp_path)
    agent.on_control({"type": "error", "code": "refused", "message": "no"})
    assert agent.outbox.qsize() == 0
    agent.on_control({"type": "error", "code": "not_registered", "message": "send a register message first"})
    sent = [agent.outbox.get_nowait() for _ in range(agent.outbox.qsize())]
    assert [m["type"] for m in sent] == ["register"]
    assert link.AGENT_LINK.parse(sent[0], link.AGENT_MESSAGES).node == "n1"
    agent.on_control({"type": "error", "code": "superseded", "message": "another agent socket registered"})
    agent.on_control({"type": "error", "code": "not_registered", "message": "send a register message first"})
    assert agent.outbox.qsize() == 0  # superseded by another socket: it does not take the node back


async def test_registers_heartbeats_and_reconnects_with_same_incarnation(tmp_path):
    cp = FakeControlPlane()
    await cp.start()
    agent = make_agent(cp.url, tmp_path)
    task = asyncio.create_task(agent.run())
    try:
        reg = await cp.wait_for(lambda c: c.of_type("register"))
        r = link.AGENT_LINK.parse(reg[0], link.AGENT_MESSAGES)
        assert r.node == "n1" and r.pool == "elastic" and [s.index for s in r.slots] == [0, 1]
        await cp.wait_for(lambda c: len(c.of_type("heartbeat")) >= 2)
        assert agent.epoch == 1 and agent.node_id == 7
        await cp.push(desired(3, 1))
        await cp.wait_for(lambda c: any(h["generation"] == 3 for h in c.of_type("heartbeat")))
        # the server drops the connection: the agent reconnects, re-registers, gets the state again
        for ws in list(cp.sockets):
            await ws.close()
        regs = await cp.wait_for(lambda c: len(c.of_type("register")) >= 2 and c.of_type("register"))
        assert regs[0]["incarnation"] == regs[1]["incarnation"] == agent.incarnation
        assert cp.connections >= 2
        # a stale desired state over the link is refused and reported
        await cp.push_raw(link.AGENT_LINK.dump(desired(2, 1)))
        fault = await cp.wait_for(lambda c: c.of_type("fault"))
        assert fault[0]["kind"] == "stale_command" and agent.generation == 3
    finally:
        agent.stopping.set()
        await asyncio.wait_for(task, 30)
        await cp.stop()


async def test_bad_token_keeps_retrying_without_registering(tmp_path):
    cp = FakeControlPlane()
    await cp.start()
    agent = make_agent(cp.url, tmp_path, token="wrong")
    task = asyncio.create_task(agent.run())
    try:
        await asyncio.sleep(1.0)
        assert cp.connections == 0 and not cp.received and not task.done()
    finally:
        agent.stopping.set()
        await asyncio.wait_for(task, 30)
        await cp.stop()


async def test_run_agent_serves_until_its_stop_event(tmp_path):
    """The programmatic entry point (a Ray actor, a test): no signal handler, a caller's stop event."""
    cp = FakeControlPlane()
    await cp.start()
    stop = asyncio.Event()
    cfg = AgentConfig(control_plane=cp.url, token="node-token", node="n1", slots=1, state_dir=tmp_path)
    task = asyncio.create_task(run_agent(cfg, stop=stop))
    try:
        await cp.wait_for(lambda c: c.of_type("heartbeat"))
        await asyncio.sleep(0.3)
        assert not task.done()  # it serves until told
        stop.set()
        agent = await asyncio.wait_for(task, 30)  # the caller's event stops it, as SIGTERM stops the CLI
        assert agent.epoch == 1 and agent.node_id == 7
    finally:
        stop.set()
        await cp.stop()
