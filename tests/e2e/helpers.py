"""Helpers for the browser tests: service calls off Playwright's event loop, login, a real agent
registering over /ws/agent/, screenshots kept as artifacts under var/artifacts/e2e/."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "var" / "artifacts" / "e2e"


def off_loop(fn, *args, **kwargs):
    """Run a service call in a plain thread: Playwright's sync API keeps an event loop in this thread,
    where the after-commit websocket push (async_to_sync) may not run."""
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    def call():
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def login(page, base_url: str, username: str, password: str, path: str = "/") -> None:
    page.goto(base_url + path)
    assert "/accounts/login/" in page.url  # anonymous users are sent to the login page
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")


def shot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / (re.sub(r"[^a-z0-9_-]+", "-", name.lower()) + ".png")
    page.screenshot(path=str(path), full_page=True)
    return path


def operator_user(username: str = "ops", password: str = "ops-password-123"):
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user(username=username, password=password)
    user.groups.add(Group.objects.get_or_create(name="operators")[0])
    return user


class Agent:
    """A node agent as far as the control plane can tell: it registers over the real agent link and,
    like agents/node.py after each reconcile, reports every desired state as done (its workers running
    in their roles, idle, holding the job's weights), so transitions complete; like it, it also
    heartbeats every `heartbeat_s` the link asks for (a report the server lost is sent again, and the
    lease holds). It runs no processes."""

    def __init__(self, ws_url: str, name: str, *, pool: str = "reserved", slots: int = 4) -> None:
        import threading

        from websockets.sync.client import ClientConnection, connect

        from controlplane.core.agent_link import AGENT_LINK, Register, SlotSpec
        from controlplane.core.state import Pool
        from controlplane.services.credentials import issue_agent_token

        token = off_loop(issue_agent_token, node_name=name)
        self.ws: ClientConnection = connect(
            ws_url + "/ws/agent/", additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=10
        )
        msg = Register(
            node=name,
            pool=Pool(pool),
            hardware="cpu",
            incarnation=f"{name}-1",
            slots=[SlotSpec(index=i, hardware="cpu", memory_mb=1024) for i in range(slots)],
        )
        self.ws.send(json.dumps(AGENT_LINK.dump(msg)))
        self.registered: dict[str, Any] = json.loads(self.ws.recv(timeout=10))
        assert self.registered["type"] == "registered", self.registered
        self.epoch = self.registered["epoch"]
        self._reader = threading.Thread(target=self._serve, daemon=True)
        self._reader.start()

    def _serve(self) -> None:
        from controlplane.core.agent_link import AGENT_LINK, Heartbeat, ObservedWorker
        from controlplane.core.state import Activity

        report = Heartbeat(epoch=self.epoch, generation=0, workers=[])
        while True:
            try:
                data = json.loads(self.ws.recv(timeout=float(self.registered["heartbeat_s"])))
            except TimeoutError:  # the periodic heartbeat: the last report again
                data = {}
            except Exception:  # closed
                return
            if data.get("type") == "desired_state":
                self.epoch = data["epoch"]
                workers = [
                    ObservedWorker(
                        worker_id=w["worker_id"],
                        role=w["role"],
                        state="running",
                        inflight=0,
                        activity=Activity.INACTIVE
                        if w["role"] == "training" and w["activity"] != "active"
                        else Activity(w["activity"]),
                        weight_version=w.get("min_weight_version", 0),
                        endpoint=f"http://127.0.0.1:{20000 + w['worker_id']}",
                        generation=data["generation"],
                        devices=list(w["gpus"]),
                    )
                    for w in data["workers"]
                ]
                report = Heartbeat(epoch=self.epoch, generation=data["generation"], workers=workers)
            elif data:
                continue
            try:
                self.ws.send(json.dumps(AGENT_LINK.dump(report)))
            except Exception:
                return

    def close(self) -> None:
        self.ws.close()
