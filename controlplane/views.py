"""Operations endpoints and the dashboard page (thin: read a selector, answer)."""
from __future__ import annotations

import logging

from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from drf_spectacular.utils import extend_schema
from rest_framework.views import APIView

from controlplane.selectors.metrics import prometheus_text

log = logging.getLogger(__name__)


def _check(name: str, fn) -> bool:  # type: ignore[no-untyped-def]
    """True when the dependency answers. The reason goes to the log, never to the (public) response."""
    try:
        fn()
        return True
    except Exception as exc:  # report, never raise: health must answer
        log.warning("health check %s failed: %s: %s", name, type(exc).__name__, exc)
        return False


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
    """Unauthenticated by design (load balancers): says only ok / fail per dependency, no internals."""
    checks = {name: "ok" if _check(name, fn) else "fail" for name, fn in
              (("database", _database), ("redis", _redis), ("celery", _celery))}
    healthy = all(v == "ok" for v in checks.values())
    return JsonResponse({"status": "ok" if healthy else "degraded", "checks": checks}, status=200 if healthy else 503)


class MetricsView(APIView):
    """Prometheus text format; session or token auth (a scraper uses `Authorization: Token ...`)."""

    @extend_schema(exclude=True)
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(prometheus_text(), content_type="text/plain; version=0.0.4; charset=utf-8")


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard.html", {})
