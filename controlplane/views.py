"""Operations endpoints and the dashboard page (thin: read a selector, answer)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from types import SimpleNamespace

import redis
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET
from drf_spectacular.utils import extend_schema
from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.exposition import choose_encoder
from rest_framework import fields as drf_fields
from rest_framework.views import APIView

from controlplane.api.serializers import JobCreateSerializer
from controlplane.api.views import IsOperator
from controlplane.selectors.health import database_answers
from controlplane.selectors.jobs import job_series, job_status
from controlplane.selectors.metrics import ClusterCollector
from controlplane.selectors.nodes import available_gpus
from controlplane.services import latency
from controlplane.services.simulations import scenarios
from pearl_site.celery import app

log = logging.getLogger(__name__)


def _check(name: str, fn: Callable[[], None]) -> bool:
    """True when the dependency answers. The reason goes to the log, never to the (public) response."""
    try:
        fn()
        return True
    except Exception as exc:  # report, never raise: health must answer
        log.warning("health check %s failed: %s: %s", name, type(exc).__name__, exc)
        return False


def _redis() -> None:
    redis.Redis.from_url(settings.REDIS_URL, socket_timeout=1, socket_connect_timeout=1).ping()


def _celery() -> None:
    replies = app.control.ping(timeout=1.0)
    if not replies:
        raise RuntimeError("no Celery worker answered a ping")


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """Unauthenticated by design (load balancers): says only ok / fail per dependency, no internals."""
    checks = {
        name: "ok" if _check(name, fn) else "fail"
        for name, fn in (("database", database_answers), ("redis", _redis), ("celery", _celery))
    }
    healthy = all(v == "ok" for v in checks.values())
    return JsonResponse({"status": "ok" if healthy else "degraded", "checks": checks}, status=200 if healthy else 503)


def metrics_registry() -> CollectorRegistry:
    """What /metrics serves: the cluster gauges, read from the database at each scrape, and the latency
    histograms (`services.latency`): this process's, or, in prometheus_client's multiprocess mode
    (PROMETHEUS_MULTIPROC_DIR set for every web and Celery process of the host), every process's."""
    registry = CollectorRegistry()
    registry.register(ClusterCollector())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        registry.register(latency.REGISTRY)
    return registry


class MetricsView(APIView):
    """Prometheus exposition (text, or OpenMetrics when the scraper asks for it); session or token auth
    (a scraper uses `Authorization: Token ...`)."""

    @extend_schema(exclude=True)
    def get(self, request: HttpRequest) -> HttpResponse:
        encode, content_type = choose_encoder(request.META.get("HTTP_ACCEPT", ""))
        return HttpResponse(encode(metrics_registry()), content_type=content_type)


def _can_operate(request: HttpRequest) -> bool:
    """The API's own rule (IsOperator), so the pages offer exactly the actions the API will accept."""
    return IsOperator().has_permission(SimpleNamespace(user=request.user, method="POST"), None)  # type: ignore[arg-type]


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    """The cluster page: jobs, the GPU–worker–role map (live over /ws/dashboard/), events."""
    return render(request, "dashboard.html", {"can_operate": _can_operate(request)})


@login_required
def job_page(request: HttpRequest, job_id: int) -> HttpResponse:
    """One job: status, configuration and override, charts, the latest decision, transitions, events."""
    status = job_status(job_id)
    if status is None:
        raise Http404("no such job")
    return render(
        request,
        "job.html",
        {
            "job": status["job"],
            "initial": {"status": status, "series": job_series(job_id)},
            "can_operate": _can_operate(request),
        },
    )


@login_required
def launch_page(request: HttpRequest) -> HttpResponse:
    """The launch form, built from the API's own request serializer (one list of fields and bounds)."""
    fields = []
    for name, f in JobCreateSerializer().fields.items():
        default = getattr(f, "default", None)
        fields.append(
            {
                "name": name,
                "label": name.replace("_", " "),
                "help": HELP.get(name, ""),
                "choices": list(getattr(f, "choices", {}) or {}),
                "numeric": isinstance(f, (drf_fields.IntegerField, drf_fields.FloatField)),
                "float": isinstance(f, drf_fields.FloatField),
                "json": isinstance(f, drf_fields.DictField),
                "required": f.required,
                "default": ""
                if default is None or callable(default) or repr(default).startswith("<class")
                else default,
                "min": getattr(f, "min_value", None),
                "max": getattr(f, "max_value", None),
            }
        )
    return render(
        request, "launch.html", {"fields": fields, "gpus": available_gpus(), "can_operate": _can_operate(request)}
    )


HELP = {
    "name": "lowercase letters, digits, '.', '_' or '-'",
    "model": "the policy model (tiny runs on CPU)",
    "engine": "emulated: profile-timed; torch: a real transformer; vllm: the vLLM adapter",
    "hardware": "GPU model of the profile (h800, h100, h200, h20, cpu)",
    "environment": "the agentic environment",
    "policy": (
        "pearl adapts mode, P:D and borrowing; fixed = ROLL; elastic = RLBoost-style adaptive borrowing, colocated"
    ),
    "policy_options": "optional JSON object of the policy's options (GET /api/catalog/ lists them)",
    "tp": "GPUs per worker (tensor parallel)",
    "batch_size": "rollout batch size B (trajectories per step); a multiple of the group size",
    "group_size": "GRPO group size (samples per prompt)",
    "max_staleness": "how many weight versions a sample may lag",
    "max_trajectory_tokens": "sequence length: the longest trajectory, in tokens",
    "rollout_gpus": "dedicated rollout GPUs at most (reserved + preemptible)",
    "training_gpus": "training GPUs (lent to rollout between updates)",
    "priority": "sharing the cluster with other jobs: a higher priority is served first",
    "weight": "the fair share among jobs of equal priority (a positive number)",
    "min_rollout_gpus": "rollout GPUs guaranteed while the job runs (the reserved pool must hold it beside the "
    "other jobs' guarantees)",
}


@login_required
def simulator_page(request: HttpRequest) -> HttpResponse:
    """Side-by-side simulator comparisons of the policies, run on request by a Celery worker."""
    return render(request, "simulator.html", {"scenarios": scenarios(), "can_operate": _can_operate(request)})
