"""Thin REST adapters: parse, call one service or selector, answer."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from controlplane.api import serializers as s
from controlplane.models import Decision, Event, Job, Node, Transition
from controlplane.selectors.catalog import catalog
from controlplane.selectors.cluster import cluster_snapshot
from controlplane.services import credentials, jobs, nodes
from controlplane.services.errors import InvalidInput

MAX_ID = 2**63 - 1


def parse_id(value: Any, field: str = "id") -> int:
    """Ids are positive integers; anything else is a 400 that names the field."""
    text = str(value)
    if not text.isdigit() or len(text) > 19 or int(text) < 1 or int(text) > MAX_ID:
        raise InvalidInput(f"{field} must be a positive integer, got {text[:40]!r}", field=field)
    return int(text)


def actor_of(request: Request) -> str:
    return getattr(request.user, "username", "") or "anonymous"


class IsOperator(permissions.BasePermission):
    """Reads need a login; changes need an operator (staff, or the 'operators' group)."""

    message = "only operators may change cluster state"

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        if request.method in permissions.SAFE_METHODS:
            return True
        return bool(user.is_staff or user.groups.filter(name="operators").exists())


class WriteThrottle(ScopedRateThrottle):
    """Rate limit on state-changing calls per user (scope `writes`, `PEARL_WRITE_RATE`, e.g. 120/min).
    Read from settings at request time so deployments and tests can change it."""

    scope_attr = "throttle_scope"

    def allow_request(self, request: Request, view: Any) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return True
        return super().allow_request(request, view)

    def get_rate(self) -> str | None:
        from django.conf import settings

        return settings.PEARL["WRITE_RATE"]


class IdLookupMixin:
    lookup_value_regex = "[^/]+"

    def get_object(self):  # type: ignore[override]
        pk = parse_id(self.kwargs["pk"])
        self.kwargs["pk"] = pk
        return super().get_object()  # type: ignore[misc]


class JobViewSet(IdLookupMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Job.objects.select_related("created_by").all()
    serializer_class = s.JobSerializer
    permission_classes = [IsOperator]
    throttle_classes = [WriteThrottle]
    throttle_scope = "writes"

    def get_queryset(self):  # type: ignore[override]
        return _name_filter(self.request, super().get_queryset())

    @extend_schema(request=s.JobCreateSerializer, responses={201: s.JobSerializer})
    def create(self, request: Request) -> Response:
        data = s.JobCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = jobs.create_job(spec=dict(data.validated_data), actor=actor_of(request), user=request.user)
        return Response(s.JobSerializer(job).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: s.JobSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str) -> Response:
        job = jobs.stop_job(job_id=parse_id(pk), actor=actor_of(request))
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=s.TrainingSerializer, responses={200: s.JobSerializer})
    @action(detail=True, methods=["post"])
    def training(self, request: Request, pk: str) -> Response:
        """Training Begin (active=true: borrowed GPUs return first) / Training Finished (active=false)."""
        body = s.TrainingSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = jobs.set_training_active(job_id=parse_id(pk), active=body.validated_data["active"], actor=actor_of(request))
        return Response(s.JobSerializer(job).data)

    @extend_schema(methods=["GET"], responses={200: s.OverrideSerializer})
    @extend_schema(methods=["PUT", "PATCH"], request=s.OverrideSerializer, responses={200: s.OverrideSerializer})
    @action(detail=True, methods=["get", "put", "patch"])
    def overrides(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        if request.method == "GET":
            return Response(jobs.override_dict(job.override))
        body = s.OverrideSerializer(data=request.data, partial=request.method == "PATCH")
        body.is_valid(raise_exception=True)
        override = jobs.set_overrides(job_id=job.pk, changes=dict(body.validated_data), actor=actor_of(request), user=request.user)
        return Response(jobs.override_dict(override))


class NodeViewSet(IdLookupMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Node.objects.all()
    serializer_class = s.NodeSerializer
    permission_classes = [IsOperator]
    throttle_classes = [WriteThrottle]
    throttle_scope = "writes"

    def get_queryset(self):  # type: ignore[override]
        return _name_filter(self.request, super().get_queryset())

    @extend_schema(request=None, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str) -> Response:
        node = nodes.drain_node(node_id=parse_id(pk), actor=actor_of(request))
        return Response(s.NodeSerializer(node).data)

    @extend_schema(request=s.PreemptionSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def preemption(self, request: Request, pk: str) -> Response:
        """Preemption notice: the elastic node goes away `deadline_s` seconds from now."""
        body = s.PreemptionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        deadline = timezone.now() + timedelta(seconds=body.validated_data["deadline_s"])
        node = nodes.preemption_notice(node_id=parse_id(pk), deadline=deadline, actor=actor_of(request))
        return Response(s.NodeSerializer(node).data)


class AgentTokenView(APIView):
    """Issue a per-node agent token (shown once). Staff only."""

    permission_classes = [permissions.IsAdminUser]

    @extend_schema(request=s.AgentTokenSerializer, responses={201: inline_serializer("AgentToken", {"node": serializers.CharField(), "token": serializers.CharField()})})
    def post(self, request: Request) -> Response:
        body = s.AgentTokenSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        token = credentials.issue_agent_token(node_name=body.validated_data["node"], actor=actor_of(request))
        return Response({"node": body.validated_data["node"], "token": token}, status=status.HTTP_201_CREATED)


class ClusterView(APIView):
    """The GPU–worker–role map: nodes -> GPU slots -> workers with role and activity."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        return Response(cluster_snapshot())


def _name_filter(request: Request, qs: Any) -> Any:
    """`?name=` on the list (the CLI addresses jobs and nodes by name)."""
    name = request.query_params.get("name") if getattr(request, "query_params", None) is not None else None
    return qs.filter(name=name) if name else qs


class CatalogView(APIView):
    """What a job spec may name: policies (with their options), models, hardware, engines."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        return Response(catalog())


def _job_filter(request: Request, qs: Any) -> Any:
    job = request.query_params.get("job")
    if job:
        qs = qs.filter(job_id=parse_id(job, "job")) if job.isdigit() else qs.filter(job__name=job)
    return qs


def _time_param(request: Request, name: str) -> datetime | None:
    raw = request.query_params.get(name)
    if not raw:
        return None
    value = parse_datetime(raw)
    if value is None:
        raise InvalidInput(f"{name} must be an ISO 8601 time, got {raw[:40]!r}", field=name)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


JOB_PARAM = OpenApiParameter("job", str, description="job id or name")


@extend_schema(parameters=[JOB_PARAM])
class DecisionViewSet(IdLookupMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.DecisionSerializer

    def get_queryset(self):  # type: ignore[override]
        return _job_filter(self.request, Decision.objects.select_related("job"))


@extend_schema(parameters=[JOB_PARAM])
class TransitionViewSet(IdLookupMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.TransitionSerializer

    def get_queryset(self):  # type: ignore[override]
        return _job_filter(self.request, Transition.objects.select_related("job").prefetch_related("steps"))


@extend_schema(parameters=[
    JOB_PARAM,
    OpenApiParameter("kind", str, description="event kind, or a prefix ending in '.' (e.g. 'node.')"),
    OpenApiParameter("node", str, description="node name"),
    OpenApiParameter("since", OpenApiTypes.DATETIME), OpenApiParameter("until", OpenApiTypes.DATETIME),
])
class EventViewSet(IdLookupMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.EventSerializer

    def get_queryset(self):  # type: ignore[override]
        qs = _job_filter(self.request, Event.objects.select_related("job", "node"))
        kind = self.request.query_params.get("kind")
        if kind:
            qs = qs.filter(kind__startswith=kind) if kind.endswith(".") else qs.filter(kind=kind)
        node = self.request.query_params.get("node")
        if node:
            qs = qs.filter(node__name=node)
        since, until = _time_param(self.request, "since"), _time_param(self.request, "until")
        if since:
            qs = qs.filter(created__gte=since)
        if until:
            qs = qs.filter(created__lte=until)
        return qs
