"""Operations endpoints and the dashboard page (thin: read a selector, answer)."""
from __future__ import annotations

import time

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from drf_spectacular.utils import extend_schema
from rest_framework.views import APIView

from controlplane.selectors.metrics import prometheus_text


def _check(fn) -> dict:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    try:
        fn()
        return {"ok": True, "ms": round((time.perf_counter() - start) * 1000, 1)}
    except Exception as exc:  # report, never raise: health must answer
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}


def _database() -> None:
    with connection.cursor() as cur:
        cur.execute("SELECT 1")


def _redis() -> None:
    import redis
    from django.conf import settings

    redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1).ping()


def _celery() -> None:
    from pearl_site.celery import app

    replies = app.control.ping(timeout=1.0)
    if not replies:
        raise RuntimeError("no Celery worker answered a ping")


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Unauthenticated by design (load balancers); says only ok/not ok per dependency."""
    checks = {"database": _check(_database), "redis": _check(_redis), "celery": _check(_celery)}
    healthy = all(c["ok"] for c in checks.values())
    return JsonResponse({"status": "ok" if healthy else "degraded", "checks": checks}, status=200 if healthy else 503)


class MetricsView(APIView):
    """Prometheus text format; session or token auth (a scraper uses `Authorization: Token ...`)."""

    @extend_schema(exclude=True)
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(prometheus_text(), content_type="text/plain; version=0.0.4; charset=utf-8")


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard.html", {})
