"""The audit's reproductions against the REST API: every one gets a clear 4xx in the one error shape
({error, field, detail}) and changes nothing. Each of these answered 500 (or an HTML page) before."""

from __future__ import annotations

import json
import socket
import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from controlplane.models import Event, Job, Override
from tests.support.cluster import make_job, make_node
from tests.support.environment import postgres_in_use

pytestmark = pytest.mark.django_db


def a_job():
    make_node("n1")
    return make_job()


def assert_error(r, status: int, field: str | None = None) -> dict:
    assert r.status_code == status, (r.status_code, r.content[:300])
    assert r["Content-Type"].startswith("application/json"), r["Content-Type"]
    body = r.json()
    assert set(body) >= {"error", "field", "detail"} and body["detail"], body
    if field is not None:
        assert body["field"] == field, body
    return body


@pytest.mark.parametrize(
    "url, field",
    [
        ("/api/jobs/%C2%B2/", "id"),  # '²'.isdigit() is True, int('²') raises
        ("/api/nodes/%D9%A3/", "id"),  # Arabic-Indic three
        ("/api/events/?job=%C2%B2", "job"),
        ("/api/decisions/?job=%EF%BC%91", "job"),  # full-width one: neither an id nor a possible job name
    ],
)
def test_unicode_digits_in_ids_and_filters(api, url, field):
    a_job()
    assert_error(api.get(url), 400, field)
    assert api.get("/api/events/?job=job1").json()["count"] >= 1


@pytest.mark.parametrize(
    "value",
    [
        "2024-02-30T00:00:00Z",  # impossible day
        "2024-13-01T00:00:00",  # impossible month
        "2024-01-01T00:00:00%2B99:00",  # impossible offset
        "2024-01-01T25:00:00Z",
        "yesterday",
    ],
)
def test_impossible_times_in_filters(api, value):
    a_job()
    assert_error(api.get(f"/api/events/?since={value}"), 400, "since")
    assert_error(api.get(f"/api/events/?until={value}"), 400, "until")


def test_possible_times_still_filter(api):
    a_job()
    # real instants whose UTC form is outside years 1..9999 (they were 500s on PostgreSQL) compare as the edge
    assert api.get("/api/events/?since=0001-01-01T00:00:00%2B05:00").json()["count"] >= 1
    assert api.get("/api/events/?since=9999-12-31T23:59:59-05:00").json()["count"] == 0
    assert api.get("/api/events/?until=0001-01-01T00:00:00%2B05:00").json()["count"] == 0
    assert api.get("/api/events/?since=2000-01-01t00:00:00z").json()["count"] >= 1  # RFC 3339 lower case
    assert api.get("/api/events/?since=2000-01-01T05:00:00%2B05:00").json()["count"] >= 1
    assert api.get("/api/events/?until=2000-01-01").json()["count"] == 0  # a date is its midnight, UTC
    assert api.get("/api/events/?until=2000-01-01T00:00:00").json()["count"] == 0


@pytest.mark.parametrize("param", ["kind", "node", "job"])
def test_nul_and_control_characters_in_filters(api, param):
    a_job()
    assert_error(api.get(f"/api/events/?{param}=a%00b"), 400, param)
    assert_error(api.get(f"/api/events/?{param}=a%0Ab"), 400, param)
    assert_error(api.get(f"/api/events/?{param}=" + "x" * 300), 400, param)


@pytest.mark.parametrize(
    "query, field",
    [
        ("limit=99999999999999999999999", "limit"),  # beyond 64 bits
        ("limit=1001", "limit"),  # above the maximum
        ("limit=0", "limit"),
        ("limit=-1", "limit"),
        ("limit=%C2%B2", "limit"),
        ("offset=99999999999999999999999", "offset"),
        ("offset=-5", "offset"),
        ("offset=1e3", "offset"),
    ],
)
def test_limits_and_offsets_are_strict(api, query, field):
    a_job()
    for url in ("/api/events/", "/api/jobs/", "/api/nodes/", "/api/decisions/", "/api/transitions/"):
        assert_error(api.get(f"{url}?{query}"), 400, field)


def test_pages_within_limits(api):
    a_job()
    body = api.get("/api/events/?limit=1000&offset=0").json()
    assert body["count"] >= 1 and len(body["results"]) >= 1
    assert api.get("/api/events/?limit=1&offset=2147483647").json()["results"] == []


def test_format_suffix_on_action_routes_is_a_json_404(api):
    job = a_job()
    assert_error(api.post(f"/api/jobs/{job.pk}/stop.json"), 404)
    assert_error(api.post(f"/api/jobs/{job.pk}/stop.json/"), 404)
    assert_error(api.get(f"/api/jobs/{job.pk}.json/"), 400, "id")
    assert Job.objects.get(pk=job.pk).status == "pending"
    assert api.get(f"/api/jobs/{job.pk}/?format=json").status_code == 200  # the query form still works


def test_docs_page_methods(api):
    r = api.options("/api/docs/")
    assert r.status_code == 200 and r["Content-Type"].startswith("application/json")
    assert_error(api.post("/api/docs/"), 405)
    assert_error(APIClient().get("/api/docs/"), 401)
    assert api.get("/api/docs/").status_code == 200


def test_deep_nan_and_malformed_bodies(api):
    make_node("n1")
    for body, fragment in [
        ("[" * 5000 + "]" * 5000, "nested"),
        ('{"a": ' * 5000 + "1" + "}" * 5000, "nested"),
        ('{"name": "j", "rollout_gpus": NaN, "training_gpus": 1}', "NaN"),
        ('{"name": "j", "rollout_gpus": 1e999, "training_gpus": 1}', "finite"),
        ('{"name": "j", "rollout_gpus": Infinity, "training_gpus": 1}', "Infinity"),
        (b'{"name": "\xff"}', "UTF-8"),
    ]:
        r = api.post("/api/jobs/", data=body, content_type="application/json")
        assert fragment in assert_error(r, 400)["detail"]
    assert Job.objects.count() == 0


def test_oversized_body_is_a_json_413(api):
    make_node("n1")
    before = Event.objects.count()
    r = api.post("/api/jobs/", data=b"x" * (10 << 20), content_type="application/json")
    assert assert_error(r, 413)["error"] == "too_large"
    r = api.post("/api/jobs/", data=json.dumps({"name": "j", "pad": "x" * 100_000}), content_type="application/json")
    assert_error(r, 413)
    assert Job.objects.count() == 0 and Event.objects.count() == before


@pytest.mark.parametrize("fmt", ["multipart", "form"])
def test_unsupported_media_is_a_json_415(api, fmt):
    make_node("n1")
    if fmt == "multipart":
        r = api.post("/api/jobs/", {"name": "j", "rollout_gpus": 1, "training_gpus": 1}, format="multipart")
    else:
        r = api.post("/api/jobs/", "name=j&rollout_gpus=1", content_type="application/x-www-form-urlencoded")
    assert_error(r, 415)
    r = api.post("/api/jobs/", b"--x\r\nbroken", content_type="multipart/form-data; boundary=")
    assert_error(r, 415)
    assert Job.objects.count() == 0


def test_impossible_override_refused_with_its_field(api):
    make_node("n1", slots=4)
    make_node("t1", pool="training", slots=2)
    job = make_job(rollout_gpus=4, training_gpus=2)
    before = Event.objects.count()
    body = assert_error(
        api.patch(
            f"/api/jobs/{job.pk}/overrides/",
            {"force_mode": "disaggregated", "force_n_prefill": 1000, "force_n_decode": 1},
            format="json",
        ),
        400,
        "force_n_prefill",
    )
    assert "1000" in body["detail"] and "at most 6" in body["detail"]
    assert_error(
        api.patch(f"/api/jobs/{job.pk}/overrides/", {"force_n_prefill": 3, "force_n_decode": 4}, format="json"),
        400,
        "force_n_prefill",
    )
    assert (
        api.patch(
            f"/api/jobs/{job.pk}/overrides/", {"force_n_prefill": 2, "force_n_decode": 2}, format="json"
        ).status_code
        == 200
    )
    assert_error(
        api.patch(f"/api/jobs/{job.pk}/overrides/", {"force_n_decode": 5}, format="json"), 400, "force_n_decode"
    )
    api.patch(f"/api/jobs/{job.pk}/overrides/", {"force_n_prefill": None, "force_n_decode": None}, format="json")
    before = Event.objects.count()
    o = Override.objects.get(job=job)
    assert (o.force_mode, o.force_n_prefill, o.force_n_decode) == ("", None, None) and Event.objects.count() == before
    r = api.patch(f"/api/jobs/{job.pk}/overrides/", {"force_n_prefill": 2, "force_n_decode": 4}, format="json")
    assert r.status_code == 200 and r.json()["force_n_decode"] == 4 and Event.objects.count() == before + 1


def test_schema_documents_nullable_fields_and_every_4xx(api):
    schema = api.get("/api/schema/?format=json").json()
    props = schema["components"]["schemas"]
    assert props["Event"]["properties"]["job"].get("nullable") is True
    assert props["Event"]["properties"]["node"].get("nullable") is True
    assert props["Job"]["properties"]["created_by"].get("nullable") is True
    assert props["Override"]["properties"]["updated"].get("nullable") is True
    assert set(props["Error"]["required"]) >= {"error", "field", "detail"}
    for path, ops in schema["paths"].items():
        for method, op in ops.items():
            if method == "parameters":
                continue
            codes = set(op["responses"])
            assert {"400", "401", "403"} <= codes, (method, path)
            if "{id}" in path:
                assert "404" in codes and op["parameters"][0]["schema"]["type"] == "integer"
            if method in ("post", "put", "patch"):
                assert {"409", "413", "415", "429"} <= codes, (method, path)


def test_healthz_says_ok_or_fail_without_internals(client, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    r = client.get("/healthz")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "degraded" and body["checks"]["redis"] == "fail" and body["checks"]["database"] == "ok"
    assert set(body["checks"].values()) <= {"ok", "fail"}
    text = r.content.decode()
    for leak in ("Error", "refused", "127.0.0.1", "Traceback", "redis://"):
        assert leak not in text


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not postgres_in_use(), reason="concurrent unique-name races need PostgreSQL")
def test_concurrent_creates_of_one_name(operator):
    from rest_framework.authtoken.models import Token

    make_node("n1", slots=4)
    make_node("t1", pool="training", slots=4)
    key = Token.objects.create(user=operator).key
    codes: list[int] = []
    barrier = threading.Barrier(8)

    def create() -> None:
        try:
            c = APIClient()
            c.credentials(HTTP_AUTHORIZATION=f"Token {key}")
            barrier.wait()
            codes.append(
                c.post("/api/jobs/", {"name": "same", "rollout_gpus": 1, "training_gpus": 1}, format="json").status_code
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(codes) == [201] + [409] * 7, codes
    assert Job.objects.filter(name="same").count() == 1


# ------------------------------------------------------------------ over a real server (ASGI)
def _raw(port: int, request: bytes) -> tuple[int, dict, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(request)
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


@pytest.mark.django_db(transaction=True)
def test_daphne_bounds_bodies_whatever_content_length_says(control_plane_server):
    port = int(control_plane_server.base_url.rsplit(":", 1)[1])
    token = control_plane_server.user_token()
    auth = f"Authorization: Token {token}\r\nHost: localhost\r\nContent-Type: application/json\r\n"
    big = b"x" * (1 << 20)
    for headers, body in [
        (f"Content-Length: {len(big)}\r\n", big),  # honest and too large
        ("Content-Length: 10\r\n", big),  # lying: says 10
        (
            "Transfer-Encoding: chunked\r\n",
            b"".join(b"%x\r\n%s\r\n" % (65536, big[:65536]) for _ in range(8)) + b"0\r\n\r\n",
        ),
    ]:
        status, h, payload = _raw(
            port, f"POST /api/jobs/ HTTP/1.1\r\n{auth}{headers}Connection: close\r\n\r\n".encode() + body
        )
        # an understated length: the server reads the 10 declared bytes, which are not JSON
        expected = (400, "parse_error") if headers == "Content-Length: 10\r\n" else (413, "too_large")
        assert (status, json.loads(payload)["error"]) == expected, (headers, status, payload[:200])
        assert h["content-type"].startswith("application/json")
    status, h, payload = _raw(port, f"GET /api/nope/ HTTP/1.1\r\n{auth}Connection: close\r\n\r\n".encode())
    assert status == 404 and json.loads(payload)["error"] == "not_found"
    assert not Job.objects.exists()
