"""REST API: authentication everywhere, bad input -> 4xx naming the field and changing nothing."""

from __future__ import annotations

import json

import pytest
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from controlplane.models import Event, Job, Node, Override
from tests.support.cluster import make_job, make_node

pytestmark = pytest.mark.django_db

PUBLIC = {"healthz", "login", "logout"}


def _walk(patterns, prefix=""):
    for p in patterns:
        if isinstance(p, URLResolver):
            yield from _walk(p.url_patterns, prefix + str(p.pattern))
        elif isinstance(p, URLPattern):
            yield prefix + str(p.pattern), p.name


def _concrete(route: str) -> str:
    import re

    path = re.sub(r"\(\?P<[^>]+>[^)]*\)", "1", route)
    path = re.sub(r"<[^>]+>", "1", path)
    path = path.replace("^", "").replace("$", "").replace("\\.", ".").replace("(?P<format>[a-z0-9]+)/?", "json")
    path = re.sub(r"\[[^\]]*\]\+?", "", path)
    return "/" + path


def test_every_url_refuses_anonymous():
    make_node("n1")
    make_job()
    client = APIClient()
    checked = 0
    for route, name in _walk(get_resolver().url_patterns):
        if name in PUBLIC or route.startswith("admin/") or "format" in route:
            continue  # admin is checked below; format suffixes reach the same views
        url = _concrete(route)
        for method in ("get", "post"):
            r = getattr(client, method)(url, data={}, format="json")
            if r.status_code == 405:
                continue
            assert r.status_code in (302, 401, 403), (
                f"{method.upper()} {url} ({name}) answered {r.status_code} anonymously"
            )
            if r.status_code == 302:
                assert "/accounts/login/" in r["Location"]
            checked += 1
    assert checked >= 20


def test_admin_requires_login():
    r = APIClient().get("/admin/")
    assert r.status_code == 302 and "login" in r["Location"]


def test_viewer_cannot_change_state(viewer):
    make_node("n1")
    job = make_job()
    c = APIClient()
    c.force_authenticate(viewer)
    assert c.get("/api/jobs/").status_code == 200
    assert c.post(f"/api/jobs/{job.pk}/stop/").status_code == 403
    assert Job.objects.get(pk=job.pk).status == "pending"


def test_job_lifecycle(api):
    make_node("n1", slots=4)
    make_node("t1", pool="training", slots=4)
    r = api.post(
        "/api/jobs/",
        {"name": "grpo-1", "rollout_gpus": 4, "training_gpus": 4, "batch_size": 32, "group_size": 8},
        format="json",
    )
    assert r.status_code == 201, r.content
    jid = r.json()["id"]
    assert api.get(f"/api/jobs/{jid}/").json()["name"] == "grpo-1"
    assert api.get("/api/jobs/").json()["count"] == 1
    r = api.patch(
        f"/api/jobs/{jid}/overrides/",
        {"force_mode": "disaggregated", "force_n_prefill": 1, "force_n_decode": 3},
        format="json",
    )
    assert r.status_code == 200 and r.json()["force_n_decode"] == 3
    assert api.get(f"/api/jobs/{jid}/overrides/").json()["force_mode"] == "disaggregated"
    assert api.post(f"/api/jobs/{jid}/stop/").json()["status"] == "stopped"
    r = api.post(f"/api/jobs/{jid}/stop/")
    assert r.status_code == 409 and r.json()["error"] == "conflict"
    kinds = set(api.get(f"/api/events/?job={jid}").json()["results"][i]["kind"] for i in range(3))
    assert {"job.created", "override.set", "job.stopped"} <= kinds


def test_every_policy_and_its_options_can_be_set_per_job(api):
    make_node("n1", slots=4, hardware="H800")
    make_node("t1", pool="training", slots=4, hardware="H800")
    catalog = api.get("/api/catalog/").json()
    names = {p["name"]: p for p in catalog["policies"]}
    assert set(names) == {"pearl", "fixed", "fixed-large", "elastic", "oracle"} and not names["oracle"]["product"]
    assert {o["name"] for o in names["fixed-large"]["options"]} == {"workers", "trace_mean_gpus"}
    assert "qwen3-8b" in catalog["models"] and "H800" in catalog["hardware"] and "emulated" in catalog["engines"]
    r = api.post(
        "/api/jobs/",
        {
            "name": "roll-large",
            "rollout_gpus": 4,
            "training_gpus": 4,
            "tp": 2,
            "model": "qwen3-8b",
            "hardware": "h800",
            "policy": "fixed-large",
            "policy_options": {"workers": 2},
        },
        format="json",
    )
    assert r.status_code == 201, r.content
    assert r.json()["policy_options"] == {"workers": 2}
    from controlplane.services import planner

    tr = planner.plan_job(job_id=r.json()["id"], signal="step_start")  # ROLL-Large can be planned live
    assert tr is not None and tr.plan["target"] == "2C"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "j", "rollout_gpus": 0, "training_gpus": 1}, "rollout_gpus"),
        ({"name": "j", "rollout_gpus": -2, "training_gpus": 1}, "rollout_gpus"),
        ({"name": "j", "rollout_gpus": 999, "training_gpus": 1}, "rollout_gpus"),
        ({"name": "j", "rollout_gpus": 1, "training_gpus": 0}, "training_gpus"),
        ({"name": "j", "rollout_gpus": 1, "training_gpus": 1, "engine": "tensorrt"}, "engine"),
        ({"name": "j", "rollout_gpus": 1, "training_gpus": 1, "policy": "oracle"}, "policy"),
        ({"name": "Bad Name!", "rollout_gpus": 1, "training_gpus": 1}, "name"),
        ({"name": "j", "rollout_gpus": "many", "training_gpus": 1}, "rollout_gpus"),
        ({"name": "j", "rollout_gpus": 2, "training_gpus": 2, "tp": 4}, "tp"),
        ({"name": "j", "rollout_gpus": 1, "training_gpus": 1, "hardware": "h900"}, "hardware"),
        ({"name": "j", "rollout_gpus": 1, "training_gpus": 1, "policy": "fixed-large"}, "policy_options.workers"),
        ({"name": "j", "rollout_gpus": 1, "training_gpus": 1, "policy_options": {"gate": "no"}}, "policy_options.gate"),
        ({"name": "j", "rollout_gpus": 1, "training_gpus": 1, "policy_options": {"eta": 1}}, "policy_options.eta"),
        (
            {"name": "j", "rollout_gpus": 1, "training_gpus": 1, "policy": "elastic", "policy_options": {"eta": -1}},
            "policy_options.eta",
        ),
    ],
)
def test_bad_job_input_names_field_and_changes_nothing(api, body, field):
    make_node("n1", slots=4)
    make_node("t1", pool="training", slots=4)
    events = Event.objects.count()
    r = api.post("/api/jobs/", body, format="json")
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field, r.json()
    assert field in r.json()["detail"] or r.json()["detail"]
    assert Job.objects.count() == 0 and Event.objects.count() == events


def test_oversized_and_deeply_nested_json_refused(api):
    make_node("n1")
    deep: object = 1
    for _ in range(40):
        deep = [deep]
    r = api.post(
        "/api/jobs/",
        data=json.dumps({"name": "j", "rollout_gpus": 1, "training_gpus": 1, "x": deep}),
        content_type="application/json",
    )
    assert r.status_code == 400 and "nested" in r.json()["detail"]
    big = json.dumps({"name": "j", "pad": "x" * 100_000})
    r = api.post("/api/jobs/", data=big, content_type="application/json")
    assert r.status_code in (400, 413) and "larger" in r.json()["detail"]
    r = api.post("/api/jobs/", data="{not json", content_type="application/json")
    assert r.status_code == 400 and "malformed" in r.json()["detail"]
    assert Job.objects.count() == 0


@pytest.mark.parametrize("bad", ["abc", "-1", "0", "1.5", "99999999999999999999999"])
def test_malformed_ids_get_400(api, bad):
    for url in (f"/api/jobs/{bad}/", f"/api/nodes/{bad}/", f"/api/events/{bad}/"):
        r = api.get(url)
        assert r.status_code == 400 and r.json()["field"] == "id", (url, r.content)
    r = api.post(f"/api/nodes/{bad}/drain/")
    assert r.status_code == 400


def test_unknown_ids_get_404(api):
    assert api.get("/api/jobs/424242/").status_code == 404
    assert api.post("/api/nodes/424242/drain/").status_code == 404


def test_override_bad_input(api):
    make_node("n1")
    job = make_job()
    for body, field in [
        ({"force_mode": "hybrid"}, "force_mode"),
        ({"force_n_prefill": 0}, "force_n_prefill"),
        ({"teleport": True}, "teleport"),
        ({"force_mode": "colocated", "force_n_prefill": 1, "force_n_decode": 1}, "force_mode"),
    ]:
        r = api.patch(f"/api/jobs/{job.pk}/overrides/", body, format="json")
        assert r.status_code == 400 and r.json()["field"] == field, (body, r.json())
    o = Override.objects.get(job=job)
    assert o.force_mode == "" and o.force_n_prefill is None


def test_node_drain_and_preemption(api):
    r_node = make_node("r1")
    e_node = make_node("e1", pool="elastic")
    r = api.post(f"/api/nodes/{r_node.pk}/preemption/", {"deadline_s": 30}, format="json")
    assert r.status_code == 409
    r = api.post(f"/api/nodes/{e_node.pk}/preemption/", {"deadline_s": -3}, format="json")
    assert r.status_code == 400 and r.json()["field"] == "deadline_s"
    r = api.post(f"/api/nodes/{e_node.pk}/preemption/", {"deadline_s": 30}, format="json")
    assert r.status_code == 200 and r.json()["status"] == "draining" and r.json()["preemption_deadline"]
    assert api.post(f"/api/nodes/{r_node.pk}/drain/").json()["status"] == "draining"
    assert api.post(f"/api/nodes/{r_node.pk}/drain/").status_code == 409
    assert Node.objects.get(pk=r_node.pk).status == "draining"


def test_cluster_snapshot_shape(api):
    n = make_node("n1", slots=2)
    job = make_job()
    from controlplane.services.workers import start_worker

    start_worker(job_id=job.pk, node_id=n.pk, gpu_indexes=[1], role="decode", activity="inactive")
    data = api.get("/api/cluster/").json()
    (node,) = data["nodes"]
    assert [g["index"] for g in node["gpus"]] == [0, 1]
    assert node["gpus"][1]["workers"][0]["role"] == "decode" and node["gpus"][0]["workers"] == []


def test_event_filters(api):
    make_node("n1")
    make_node("n2")
    assert {e["node"] for e in api.get("/api/events/?kind=node.registered").json()["results"]} == {"n1", "n2"}
    assert api.get("/api/events/?node=n2").json()["count"] == 1
    assert api.get("/api/events/?kind=node.").json()["count"] >= 2
    assert api.get("/api/events/?since=2999-01-01T00:00:00Z").json()["count"] == 0
    r = api.get("/api/events/?since=yesterday")
    assert r.status_code == 400 and r.json()["field"] == "since"


def test_agent_token_endpoint_staff_only(api, operator):
    assert api.post("/api/agent-tokens/", {"node": "gpu-7"}, format="json").status_code == 403
    operator.is_staff = True
    operator.save()
    r = api.post("/api/agent-tokens/", {"node": "gpu-7"}, format="json")
    assert r.status_code == 201 and r.json()["token"].startswith("pna_")
    assert api.post("/api/agent-tokens/", {"node": "Bad Node"}, format="json").status_code == 400


def test_openapi_schema_builds_and_docs_need_login(api):
    r = api.get("/api/schema/")
    assert r.status_code == 200
    body = r.content.decode()
    for path in (
        "/api/jobs/",
        "/api/cluster/",
        "/api/nodes/{id}/preemption/",
        "/api/jobs/{id}/overrides/",
        "/api/events/",
    ):
        assert path in body
    assert api.get("/api/docs/").status_code == 200
    assert APIClient().get("/api/schema/").status_code in (401, 403)


def test_user_token_is_not_an_agent_token_and_vice_versa(api, operator):
    from rest_framework.authtoken.models import Token

    from controlplane.services.credentials import authenticate_agent, issue_agent_token

    assert authenticate_agent(Token.objects.get(user=operator).key) is None
    agent = issue_agent_token(node_name="n9")
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Token {agent}")
    assert c.get("/api/jobs/").status_code == 401


def test_state_changes_are_rate_limited(api, settings):
    from django.core.cache import cache

    cache.clear()
    settings.PEARL = {**settings.PEARL, "WRITE_RATE": "3/min"}
    make_node("n1")
    job = make_job()
    codes = [
        api.patch(f"/api/jobs/{job.pk}/overrides/", {"freeze": i % 2 == 0}, format="json").status_code for i in range(5)
    ]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429]
    assert api.get(f"/api/jobs/{job.pk}/").status_code == 200  # reads are not limited
    cache.clear()


def test_create_api_user_makes_an_operator_unless_viewer(capsys):
    """The command's users and the API's permission read one group name: an operator may drain, a viewer may read."""
    from django.core.management import call_command

    node = make_node("r1")
    for name, viewer, drain_status in (("viewer1", True, 403), ("ops1", False, 200)):
        call_command("create_api_user", name, *(["--viewer"] if viewer else []))
        client = APIClient(HTTP_AUTHORIZATION=f"Token {capsys.readouterr().out.strip()}")
        assert client.get("/api/nodes/").status_code == 200
        assert client.post(f"/api/nodes/{node.pk}/drain/").status_code == drain_status


def test_the_launch_page_counts_the_clusters_gpus(client, django_user_model):
    make_node("r1", slots=4)
    make_node("e1", pool="elastic", slots=2)
    client.force_login(django_user_model.objects.create_user("page-viewer", password="x"))
    page = client.get("/jobs/new/")
    assert page.status_code == 200
    assert "GPUs in the cluster: 4 reserved, 2 elastic (preemptible), 0 training." in page.content.decode()
