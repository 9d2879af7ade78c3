"""Read models and actions the dashboard and the `pearl` CLI need beyond the core resources: a job's
status and per-step history, returning a node to service, and simulator comparisons. Thin, as the rest."""

from __future__ import annotations

from typing import Any, cast

from django.db.models import QuerySet
from drf_spectacular.plumbing import build_array_type, build_basic_type
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api import serializers as s
from controlplane.api.params import StrictLimitOffsetPagination, parse_count
from controlplane.api.views import IsOperator, WriteThrottle, actor_of, parse_id
from controlplane.core.driver_link import TRAJECTORY_STATUSES
from controlplane.models import Trajectory
from controlplane.selectors import trajectories as trajectory_selectors
from controlplane.selectors.jobs import job_exists, job_series, job_status
from controlplane.selectors.simulations import run_dict, simulation_run, simulation_runs
from controlplane.services import draining, simulations
from controlplane.services.errors import InvalidInput, NotFound

# a JSON array of objects (the schema said object); build_basic_type is None only for OpenApiTypes.NONE
OBJECT_LIST = build_array_type(cast("dict[str, Any]", build_basic_type(OpenApiTypes.OBJECT)))


class JobStatusView(APIView):
    """The job with its live configuration, the override in force, the latest decision (every candidate),
    recent decisions, transitions with their steps, staleness and recent events."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, pk: str) -> Response:
        data = job_status(parse_id(pk))
        if data is None:
            raise NotFound(f"job {pk} does not exist", field="id")
        return Response(data)


class JobSeriesView(APIView):
    """Per-step history (STEP and TRAIN records): makespan predicted vs observed, throughput, reward,
    borrowed GPU-seconds, training steps."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, pk: str) -> Response:
        job_id = parse_id(pk)
        if not job_exists(job_id):
            raise NotFound(f"job {pk} does not exist", field="id")
        return Response(job_series(job_id))


class NodeUndrainView(APIView):
    """Return a draining or preempted node to service (cancels a pending preemption notice)."""

    permission_classes = [IsOperator]
    throttle_classes = [WriteThrottle]
    throttle_scope = "writes"

    @extend_schema(request=None, responses={200: s.NodeSerializer})
    def post(self, request: Request, pk: str) -> Response:
        node = draining.undrain_node(node_id=parse_id(pk), actor=actor_of(request))
        return Response(s.NodeSerializer(node).data)


class SimulationRequestSerializer(serializers.Serializer):
    scenario = serializers.CharField(max_length=64)
    seed = serializers.IntegerField(min_value=0, max_value=2**31 - 1, required=False, allow_null=True)
    policies = serializers.ListField(child=serializers.CharField(max_length=32), required=False, max_length=10)


class ScenarioListView(APIView):
    """The shipped simulator scenarios (name, description, policies)."""

    @extend_schema(responses={200: OBJECT_LIST})
    def get(self, request: Request) -> Response:
        return Response(simulations.scenarios())


class SimulationListView(APIView):
    """Simulator comparisons: list (newest first, without results) or ask for one (a Celery worker runs it)."""

    permission_classes = [IsOperator]
    throttle_classes = [WriteThrottle]
    throttle_scope = "writes"

    @extend_schema(
        responses={200: OBJECT_LIST}, operation_id="simulations_list"
    )  # not simulations_retrieve (the detail's)
    def get(self, request: Request) -> Response:
        return Response(simulation_runs())

    @extend_schema(request=SimulationRequestSerializer, responses={201: OpenApiTypes.OBJECT})
    def post(self, request: Request) -> Response:
        body = SimulationRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        v: dict[str, Any] = body.validated_data
        run = simulations.request_run(
            scenario=v["scenario"], seed=v.get("seed"), policies=v.get("policies") or [], user=request.user
        )
        return Response(run_dict(run), status=status.HTTP_201_CREATED)


class SimulationDetailView(APIView):
    """One comparison with its result: `compare --json` plus per-policy series for the charts."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request: Request, pk: str) -> Response:
        run = simulation_run(parse_id(pk))
        if run is None:
            raise NotFound(f"simulation {pk} does not exist", field="id")
        return Response(run)


class TrajectoryPagination(StrictLimitOffsetPagination):
    """Trajectories carry their tokens: smaller pages than the other lists."""

    default_limit = 20
    max_limit = 200


@extend_schema(
    parameters=[
        OpenApiParameter("step", {"type": "integer", "minimum": 0}, description="the step (all steps if absent)"),
        OpenApiParameter("status", {"type": "string", "enum": list(TRAJECTORY_STATUSES)}),
    ]
)
class JobTrajectoriesView(ListAPIView):
    """A job's agent trajectories (environment agent), per step: status, reward, turns, the chat, tokens with
    their loss mask and log-probs, the weight version, worker and latency of each turn, and why one failed."""

    serializer_class = s.TrajectorySerializer
    pagination_class = TrajectoryPagination

    def get_queryset(self) -> QuerySet[Trajectory]:
        job_id = parse_id(self.kwargs["pk"])
        if not job_exists(job_id):
            raise NotFound(f"job {self.kwargs['pk']} does not exist", field="id")
        raw, status_ = self.request.query_params.get("step"), self.request.query_params.get("status")
        step = None if raw in (None, "") else parse_count(raw, "step", lo=0, hi=2**31)
        if status_ and status_ not in TRAJECTORY_STATUSES:
            raise InvalidInput(f"status must be one of {list(TRAJECTORY_STATUSES)}", field="status")
        return trajectory_selectors.trajectories(job_id, step, status_ or None)


class JobTrajectoryStepsView(APIView):
    """The steps of a job that have trajectories, newest first, with counts per status (the browser's index) and
    the audit counts: trained (its committed update consumed it), untrained, rerun (regenerated after a crash),
    resumed (continued from a kept prefix). A step's trajectories are listed as they end, before it trains."""

    @extend_schema(responses={200: OBJECT_LIST})
    def get(self, request: Request, pk: str) -> Response:
        job_id = parse_id(pk)
        if not job_exists(job_id):
            raise NotFound(f"job {pk} does not exist", field="id")
        return Response(trajectory_selectors.steps(job_id))
