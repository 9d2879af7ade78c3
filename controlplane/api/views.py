"""Thin REST adapters: parse, call one service or selector, answer."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import ScopedRateThrottle
from rest_framework.views import APIView

from controlplane.api import serializers as s
from controlplane.api.params import (
    JOB_PATTERN,
    KIND_PATTERN,
    NAME_PATTERN,
    job_param,
    name_param,
    parse_id,
    pattern_param,
    time_param,
)
from controlplane.models import Decision, Event, Job, Node, Transition
from controlplane.selectors import history
from controlplane.selectors import jobs as job_selectors
from controlplane.selectors import nodes as node_selectors
from controlplane.selectors.catalog import catalog
from controlplane.selectors.cluster import cluster_snapshot
from controlplane.selectors.users import is_operator
from controlplane.services import credentials, draining, jobs


def actor_of(request: Request) -> str:
    return getattr(request.user, "username", "") or "anonymous"


class IsOperator(permissions.BasePermission):
    """Reads need a login; changes need an operator (staff, or the 'operators' group)."""

    message = "only operators may change cluster state"

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        return request.method in permissions.SAFE_METHODS or is_operator(user)


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
    """Parse the `pk` URL part as an id first (a 400 for a bad one, not a 500 from the database)."""

    lookup_value_regex = "[^/]+"
    kwargs: dict[str, Any]  # set by the DRF view this is mixed into

    def get_object(self) -> Any:
        pk = parse_id(self.kwargs["pk"])
        self.kwargs["pk"] = pk
        return super().get_object()  # type: ignore[misc]  # GenericAPIView's, next in the view's MRO


class JobViewSet(IdLookupMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = s.JobSerializer
    permission_classes = [IsOperator]
    throttle_classes = [WriteThrottle]
    throttle_scope = "writes"

    def get_queryset(self) -> QuerySet[Job]:
        return job_selectors.jobs(name=_name(self.request))

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

    @extend_schema(request=None, responses={200: s.JobSerializer})
    @action(detail=True, methods=["post"])
    def pause(self, request: Request, pk: str) -> Response:
        """Release the job's rollout workers; its trainer, driver, checkpoint and records stay (409 unless running)."""
        job = jobs.pause_job(job_id=parse_id(pk), actor=actor_of(request))
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=None, responses={200: s.JobSerializer})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        """A paused job runs again where it was (409 unless paused)."""
        job = jobs.resume_job(job_id=parse_id(pk), actor=actor_of(request))
        return Response(s.JobSerializer(job).data)

    @extend_schema(request=s.TrainingSerializer, responses={200: s.JobSerializer})
    @action(detail=True, methods=["post"])
    def training(self, request: Request, pk: str) -> Response:
        """Training Begin (active=true: borrowed GPUs return first) / Training Finished (active=false)."""
        body = s.TrainingSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        job = jobs.set_training_active(
            job_id=parse_id(pk), active=body.validated_data["active"], actor=actor_of(request)
        )
        return Response(s.JobSerializer(job).data)

    @extend_schema(methods=["GET"], responses={200: s.OverrideSerializer})
    @extend_schema(methods=["PUT", "PATCH"], request=s.OverrideSerializer, responses={200: s.OverrideSerializer})
    @action(detail=True, methods=["get", "put", "patch"])
    def overrides(self, request: Request, pk: str) -> Response:
        job = self.get_object()
        if request.method == "GET":
            return Response(job_selectors.job_override(job.pk))
        body = s.OverrideSerializer(data=request.data, partial=request.method == "PATCH")
        body.is_valid(raise_exception=True)
        override = jobs.set_overrides(
            job_id=job.pk, changes=dict(body.validated_data), actor=actor_of(request), user=request.user
        )
        return Response(job_selectors.override_dict(override))


class NodeViewSet(IdLookupMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = s.NodeSerializer
    permission_classes = [IsOperator]
    throttle_classes = [WriteThrottle]
    throttle_scope = "writes"

    def get_queryset(self) -> QuerySet[Node]:
        return node_selectors.nodes(name=_name(self.request))

    @extend_schema(request=None, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str) -> Response:
        node = draining.drain_node(node_id=parse_id(pk), actor=actor_of(request))
        return Response(s.NodeSerializer(node).data)

    @extend_schema(request=s.PreemptionSerializer, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def preemption(self, request: Request, pk: str) -> Response:
        """Preemption notice: the elastic node goes away `deadline_s` seconds from now."""
        body = s.PreemptionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        deadline = timezone.now() + timedelta(seconds=body.validated_data["deadline_s"])
        node = draining.preemption_notice(node_id=parse_id(pk), deadline=deadline, actor=actor_of(request))
        return Response(s.NodeSerializer(node).data)


class AgentTokenView(APIView):
    """Issue a per-node agent token (shown once). Staff only."""

    permission_classes = [permissions.IsAdminUser]

    @extend_schema(
        request=s.AgentTokenSerializer,
        responses={
            201: inline_serializer("AgentToken", {"node": serializers.CharField(), "token": serializers.CharField()})
        },
    )
    def post(self, request: Request) -> Response:
        body = s.AgentTokenSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        token = credentials.issue_agent_token(node_name=body.validated_data["node"], actor=actor_of(request))
        return Response({"node": body.validated_data["node"], "token": token}, status=status.HTTP_201_CREATED)


class ClusterAPIView(APIView):
    """The GPU–worker–role map: nodes -> GPU slots -> workers with role and activity."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        return Response(cluster_snapshot())


def _name(request: Request) -> str | None:
    """`?name=` on the list (the CLI addresses jobs and nodes by name)."""
    return request.query_params.get("name") if getattr(request, "query_params", None) is not None else None


class CatalogView(APIView):
    """What a job spec may name: policies (with their options), models, hardware, engines."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request) -> Response:
        return Response(catalog())


JOB_PARAM = OpenApiParameter("job", {"type": "string", "pattern": JOB_PATTERN}, description="job id or name")


@extend_schema(parameters=[JOB_PARAM])
class DecisionViewSet(IdLookupMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.DecisionSerializer

    def get_queryset(self) -> QuerySet[Decision]:
        return history.decisions(job=job_param(self.request))


@extend_schema(parameters=[JOB_PARAM])
class TransitionViewSet(IdLookupMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.TransitionSerializer

    def get_queryset(self) -> QuerySet[Transition]:
        return history.transitions(job=job_param(self.request))


@extend_schema(
    parameters=[
        JOB_PARAM,
        OpenApiParameter(
            "kind",
            {"type": "string", "pattern": KIND_PATTERN},
            description="event kind, or a prefix ending in '.' (e.g. 'node.')",
        ),
        OpenApiParameter("node", {"type": "string", "pattern": NAME_PATTERN}, description="node name"),
        OpenApiParameter("since", OpenApiTypes.DATETIME),
        OpenApiParameter("until", OpenApiTypes.DATETIME),
    ]
)
class EventViewSet(IdLookupMixin, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.EventSerializer

    def get_queryset(self) -> QuerySet[Event]:
        return history.events(
            job=job_param(self.request),
            kind=pattern_param(self.request, "kind", KIND_PATTERN),
            node=name_param(self.request, "node"),
            since=time_param(self.request, "since"),
            until=time_param(self.request, "until"),
        )
