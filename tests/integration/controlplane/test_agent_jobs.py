"""Agent jobs (issue 19): submission of `environment: agent` (400 naming the field, nothing changed), the
driver's JobView, the trajectories the driver reports and `GET /api/jobs/<id>/trajectories/`."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from controlplane.models import Event, Job
from controlplane.selectors.driver import job_view
from tests.support.cluster import make_node

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[3]


def _body(**agent) -> dict:
    return {"name": "calc-agent", "environment": "agent", "rollout_gpus": 1, "training_gpus": 1, "batch_size": 8,
            "group_size": 4, **agent}


@pytest.fixture
def nodes():
    make_node("n1", slots=4)
    make_node("t1", pool="training", slots=4)


def test_agent_job_is_created_and_its_driver_gets_the_spec(api, nodes, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "1+1"}\n\n{"question": "2*3"}\n')
    agent = {"agent_command": ["python", "agent.py"], "agent_workdir": str(tmp_path), "tasks": "tasks.jsonl",
             "agent_timeout_s": 30, "agent_concurrency": 4}
    r = api.post("/api/jobs/", _body(**agent), format="json")
    assert r.status_code == 201, r.content
    assert r.json()["agent"] == agent and r.json()["environment"] == "agent"
    view = job_view(Job.objects.get(pk=r.json()["id"]))
    assert view.agent == agent  # the task file is the driver's to load, where the agents run


def test_inline_tasks_and_a_python_agent(api, nodes):
    agent = {"agent_function": "examples.agents.tool_agent:run", "tasks": [{"q": 1}, {"q": 2}]}
    r = api.post("/api/jobs/", _body(**agent), format="json")
    assert r.status_code == 201, r.content
    assert Job.objects.get().agent == agent



@pytest.mark.parametrize(
    "agent, field",
    [
        ({"tasks": [{"q": 1}]}, "agent_command"),  # a missing command
        ({"agent_command": [], "tasks": [{"q": 1}]}, "agent_command"),
        ({"agent_command": "python agent.py", "tasks": [{"q": 1}]}, "agent_command"),  # argv, not a shell line
        ({"agent_command": ["python"], "agent_function": "m:f", "tasks": [{"q": 1}]}, "agent_command"),
        ({"agent_function": "nocolon", "tasks": [{"q": 1}]}, "agent_function"),
        ({"agent_command": ["python"]}, "tasks"),
        ({"agent_command": ["python"], "tasks": "/nonexistent/tasks.jsonl"}, "tasks"),  # an unreadable task file
        ({"agent_command": ["python"], "tasks": "BAD"}, "tasks"),  # bad JSON in the file (written below)
        ({"agent_command": ["python"], "tasks": [1, 2]}, "tasks"),
        ({"agent_command": ["python"], "tasks": []}, "tasks"),
        ({"agent_command": ["python"], "tasks": [{"q": 1}], "agent_workdir": "/nonexistent"}, "agent_workdir"),
        ({"agent_command": ["python"], "tasks": [{"q": 1}], "agent_timeout_s": 0}, "agent_timeout_s"),
        ({"agent_command": ["python"], "tasks": [{"q": 1}], "agent_concurrency": "8"}, "agent_concurrency"),
    ],
)
def test_bad_agent_spec_names_the_field_and_changes_nothing(api, nodes, tmp_path, agent, field):
    if agent.get("tasks") == "BAD":
        (tmp_path / "bad.jsonl").write_text('{"q": 1}\n{"q": \n')
        agent = {**agent, "tasks": str(tmp_path / "bad.jsonl")}
    events = Event.objects.count()
    r = api.post("/api/jobs/", _body(**agent), format="json")
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field, r.json()
    assert Job.objects.count() == 0 and Event.objects.count() == events


def test_agent_fields_need_environment_agent(api, nodes):
    r = api.post("/api/jobs/", {**_body(tasks=[{"q": 1}]), "environment": "calculator"}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "tasks", r.content
    r = api.post("/api/jobs/", {**_body(), "environment": "calculator"}, format="json")
    assert r.status_code == 201 and r.json()["agent"] == {}


def test_the_example_job_yaml_submits(api, nodes, monkeypatch):
    from pearl_cli.spec import load_spec

    monkeypatch.chdir(ROOT)  # the example's paths are relative to the repository root
    body, _ = load_spec(str(ROOT / "examples/agents/job.yaml"))
    body = {**body, "rollout_gpus": 1, "training_gpus": 1}
    r = api.post("/api/jobs/", body, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["agent"]["agent_command"] == ["python", "examples/agents/calculator_agent.py"]
    assert json.dumps(r.json()["agent"])  # JSON all the way
