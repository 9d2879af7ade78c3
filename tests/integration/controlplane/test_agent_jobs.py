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
    return {
        "name": "calc-agent",
        "environment": "agent",
        "rollout_gpus": 1,
        "training_gpus": 1,
        "batch_size": 8,
        "group_size": 4,
        **agent,
    }


@pytest.fixture
def nodes():
    make_node("n1", slots=4)
    make_node("t1", pool="training", slots=4)


def test_agent_job_is_created_and_its_driver_gets_the_spec(api, nodes, tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"question": "1+1"}\n\n{"question": "2*3"}\n')
    agent = {
        "agent_command": ["python", "agent.py"],
        "agent_workdir": str(tmp_path),
        "tasks": "tasks.jsonl",
        "agent_timeout_s": 30,
        "agent_concurrency": 4,
        "agent_max_attempts": 2,
    }
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
        ({"agent_command": ["python"], "tasks": [{"q": 1}], "agent_max_attempts": 0}, "agent_max_attempts"),
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
    assert r.json()["agent"]["agent_command"] == [".venv/bin/python", "examples/agents/calculator_agent.py"]
    assert json.dumps(r.json()["agent"])  # JSON all the way


# ---------------------------------------------------------------- trajectories: service and API
def _record(n_tokens: int = 6, status: str = "done", **extra) -> dict:
    """An AgentRunner record as the gateway keeps it: two samples (a fork), prompt 0 / sampled 1."""
    half = n_tokens // 2
    sample = {
        "prompt_len": half,
        "tokens": list(range(n_tokens)),
        "mask": [0] * half + [1] * (n_tokens - half),
        "logprobs": [0.0] * half + [-0.25] * (n_tokens - half),
        "weight_versions": [3],
        "workers": [2],
        "latency_s": [0.125],
    }
    return {
        "samples": [sample, {**sample, "weight_versions": [4], "workers": [[5, 6]]}],
        "forks": 1,
        "reward": 1.0,
        "turns": 2,
        "status": status,
        "messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}],
        **extra,
    }


def _agent_job(api) -> int:
    r = api.post("/api/jobs/", _body(agent_command=["python", "a.py"], tasks=[{"q": 1}]), format="json")
    assert r.status_code == 201, r.content
    return r.json()["id"]


def test_reported_trajectories_are_kept_and_listed_per_step(api, nodes):
    from agents.driver.trajectories import summarize
    from controlplane.services.trajectories import record_trajectories

    jid = _agent_job(api)
    record_trajectories(
        job_id=jid,
        step=0,
        trajectories=[
            summarize("s0-t0", _record()),
            summarize("s0-t1", _record(status="failed", reward=None, reason="exit 1", stderr="boom")),
        ],
    )
    record_trajectories(job_id=jid, step=1, trajectories=[summarize("s1-t0", _record())])
    # a later report of the same trajectory replaces it (the driver resends what it could not deliver)
    record_trajectories(job_id=jid, step=1, trajectories=[summarize("s1-t0", _record(reward=0.5))])
    r = api.get(f"/api/jobs/{jid}/trajectories/?step=0")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["count"] == 2 and [t["name"] for t in body["results"]] == ["s0-t0", "s0-t1"]
    done, failed = body["results"]
    assert done["status"] == "done" and done["reward"] == 1.0 and done["forks"] == 1 and done["turns"] == 2
    assert done["tokens"] == [0, 1, 2, 3, 4, 5] * 2 and done["mask"] == [0, 0, 0, 1, 1, 1] * 2
    assert done["logprobs"][3] == -0.25 and done["sample_lens"] == [6, 6]
    assert done["weight_versions"] == [3, 4] and done["workers"] == [[2], [5, 6]] and done["latency_s"] == [0.125] * 2
    assert done["messages"][0] == {"role": "user", "content": "1+1?"} and not done["truncated"]
    assert failed["status"] == "failed" and failed["reward"] is None and failed["reason"] == "exit 1"
    assert failed["stderr"] == "boom"
    assert api.get(f"/api/jobs/{jid}/trajectories/?step=1").json()["results"][0]["reward"] == 0.5
    assert api.get(f"/api/jobs/{jid}/trajectories/").json()["count"] == 3
    assert api.get(f"/api/jobs/{jid}/trajectories/?status=failed").json()["count"] == 1
    page = api.get(f"/api/jobs/{jid}/trajectories/?limit=1&offset=1").json()
    assert page["count"] == 3 and len(page["results"]) == 1 and page["next"]
    steps = api.get(f"/api/jobs/{jid}/trajectories/steps/").json()
    zero = {"given_up": 0, "dropped_groups": 0, "trained": 0, "untrained": 0, "rerun": 0, "resumed": 0}
    assert steps == [{"step": 1, "total": 1, "done": 1} | zero, {"step": 0, "total": 2, "done": 1, "failed": 1} | zero]
    # a step's STEP record (as the driver reports it) says which of its slots were not trained
    from controlplane.core import telemetry as tm
    from controlplane.models import TelemetrySample

    for step, given_up, dropped in ((0, 1, 1), (1, 0, 0), (5, 2, 0)):  # step 0's record has no "step" key
        rec = tm.step(job="j", step=step, batch_size=4, given_up=given_up, dropped_groups=dropped).to_json()
        TelemetrySample.objects.create(job_id=jid, kind="step", record=rec)
    steps = api.get(f"/api/jobs/{jid}/trajectories/steps/").json()
    assert [(s["step"], s["given_up"], s["dropped_groups"]) for s in steps] == [(1, 0, 0), (0, 1, 1)]


def test_a_finished_trajectory_left_untrained_says_so_in_the_api_the_steps_and_the_cli(api, nodes):
    from agents.driver.trajectories import summarize
    from controlplane.services.trajectories import record_trajectories
    from pearl_cli.main import trajectories_text

    jid = _agent_job(api)
    why = "not trained: its group was dropped (fewer than 2 members left; 1 member(s) of the step gave up)"
    record_trajectories(
        job_id=jid,
        step=0,
        trajectories=[
            summarize("s0-t0", _record(trained=True)),
            summarize("s0-t2", _record(trained=False, reason=why)),
            summarize("s0-t3", _record(status="failed", reward=None, reason="exit 1")),
        ],
    )
    rows = api.get(f"/api/jobs/{jid}/trajectories/?step=0").json()["results"]
    by = {t["name"]: t for t in rows}
    assert by["s0-t0"]["trained"] is True and by["s0-t0"]["reason"] == ""
    assert by["s0-t2"]["trained"] is False and by["s0-t2"]["status"] == "done" and by["s0-t2"]["reason"] == why
    assert by["s0-t3"]["trained"] is None  # failed: not a question of training
    (step,) = api.get(f"/api/jobs/{jid}/trajectories/steps/").json()
    assert step["untrained"] == 1 and step["done"] == 2
    text = trajectories_text(0, rows, len(rows))
    line = next(ln for ln in text.splitlines() if ln.startswith("s0-t2"))
    assert "done untrained" in line and "not trained: its group was dropped" in line
    assert "untrained" not in next(ln for ln in text.splitlines() if ln.startswith("s0-t0"))


def test_long_trajectories_are_truncated_and_say_so(api, nodes):
    from agents.driver.trajectories import summarize
    from controlplane.core import driver_link as dl
    from controlplane.services.trajectories import record_trajectories

    jid = _agent_job(api)
    long = summarize("s0-t0", _record(n_tokens=dl.MAX_TRAJECTORY_TOKENS))  # two samples: twice the bound
    assert long.truncated and long.token_count == 2 * dl.MAX_TRAJECTORY_TOKENS
    assert len(long.tokens) == len(long.mask) == len(long.logprobs) == dl.MAX_TRAJECTORY_TOKENS
    record_trajectories(job_id=jid, step=0, trajectories=[long])
    t = api.get(f"/api/jobs/{jid}/trajectories/?step=0").json()["results"][0]
    assert t["truncated"] and t["token_count"] == 2 * dl.MAX_TRAJECTORY_TOKENS
    assert len(t["tokens"]) == dl.MAX_TRAJECTORY_TOKENS


@pytest.mark.parametrize(
    "query, field",
    [("step=-1", "step"), ("step=x", "step"), ("status=odd", "status"), ("limit=0", "limit"), ("limit=201", "limit")],
)
def test_trajectory_queries_are_checked(api, nodes, query, field):
    jid = _agent_job(api)
    r = api.get(f"/api/jobs/{jid}/trajectories/?{query}")
    assert r.status_code == 400 and r.json()["field"] == field, r.content


def test_trajectories_need_a_login_and_a_job(api, nodes):
    from rest_framework.test import APIClient

    jid = _agent_job(api)
    assert APIClient().get(f"/api/jobs/{jid}/trajectories/").status_code in (401, 403)
    assert api.get("/api/jobs/999999/trajectories/").status_code == 404
    assert api.get("/api/jobs/999999/trajectories/steps/").status_code == 404
    assert api.get("/api/jobs/abc/trajectories/").status_code == 400


def test_a_report_with_a_bad_status_or_mismatched_lists_changes_nothing(api, nodes):
    from controlplane.core import driver_link as dl
    from controlplane.models import Trajectory
    from controlplane.services.errors import InvalidInput
    from controlplane.services.trajectories import record_trajectories

    jid = _agent_job(api)
    for bad in (dl.TrajectorySummary("s0-t0", "weird"), dl.TrajectorySummary("s0-t0", "done", tokens=[1], mask=[])):
        with pytest.raises(InvalidInput):
            record_trajectories(job_id=jid, step=0, trajectories=[bad])
    assert Trajectory.objects.count() == 0


# ---------------------------------------------------------------- the job page's read model
def test_staleness_counts_the_serving_workers_and_the_asleep_apart(nodes):
    from controlplane.models import Node, Worker
    from controlplane.selectors.jobs import staleness
    from controlplane.services import workers
    from tests.support.cluster import make_job

    job = make_job("healthy", rollout_gpus=2)
    Job.objects.filter(pk=job.pk).update(weight_version=168, max_staleness=1)
    node = Node.objects.get(name="n1")
    serving = workers.start_worker(job_id=job.pk, node_id=node.pk, gpu_indexes=[0], role="colocated", activity="active")
    asleep = workers.start_worker(
        job_id=job.pk, node_id=node.pk, gpu_indexes=[1], role="colocated", activity="inactive"
    )
    Worker.objects.filter(pk=serving.pk).update(weight_version=168)
    Worker.objects.filter(pk=asleep.pk).update(weight_version=0)  # an overlap worker that pulls lazily
    s = staleness(Job.objects.get(pk=job.pk))
    assert s["lag"] == 0 and s["within_bound"] and s["workers_min"] == 168
    assert s["asleep"] == 1 and s["asleep_min"] == 0
    Worker.objects.filter(pk=serving.pk).update(weight_version=160)  # a serving worker behind is still over
    assert not staleness(Job.objects.get(pk=job.pk))["within_bound"]


def test_submitted_by_names_the_launcher_for_jobs_it_created(api, nodes):
    from controlplane.selectors.jobs import job_status
    from tests.support.cluster import make_job

    launched = make_job("launched")  # created with actor "test", no user (as the launcher does)
    launched_status = job_status(launched.pk)
    assert launched_status is not None
    assert launched_status["job"]["submitted_by"] == "test"
    r = api.post(
        "/api/jobs/", {**_body(agent_command=["python", "a.py"], tasks=[{"q": 1}]), "name": "mine"}, format="json"
    )
    st = job_status(r.json()["id"])
    assert st is not None
    assert st["job"]["submitted_by"] == st["job"]["created_by"] and st["job"]["agent"]["tasks"] == [{"q": 1}]
