from django.urls import path
from rest_framework.routers import DefaultRouter

from controlplane.api import checkpoints, dashboard, views

router = DefaultRouter()
router.include_format_suffixes = False  # one URL per resource: `?format=` still works; `/stop.json` was a 500
router.register("jobs", views.JobViewSet, basename="job")
router.register("nodes", views.NodeViewSet, basename="node")
router.register("decisions", views.DecisionViewSet, basename="decision")
router.register("transitions", views.TransitionViewSet, basename="transition")
router.register("events", views.EventViewSet, basename="event")

urlpatterns = [
    path("cluster/", views.ClusterAPIView.as_view(), name="cluster"),
    path("catalog/", views.CatalogView.as_view(), name="catalog"),
    path("agent-tokens/", views.AgentTokenView.as_view(), name="agent-tokens"),
    path("jobs/<str:pk>/status/", dashboard.JobStatusView.as_view(), name="job-status"),
    path("jobs/<str:pk>/series/", dashboard.JobSeriesView.as_view(), name="job-series"),
    path("jobs/<str:pk>/trajectories/", dashboard.JobTrajectoriesView.as_view(), name="job-trajectories"),
    path("jobs/<str:pk>/trajectories/steps/", dashboard.JobTrajectoryStepsView.as_view(), name="job-trajectory-steps"),
    path("jobs/<str:pk>/checkpoints/", checkpoints.JobCheckpointsView.as_view(), name="job-checkpoints"),
    path(
        "jobs/<str:pk>/checkpoints/<str:step>/",
        checkpoints.JobCheckpointDownloadView.as_view(),
        name="job-checkpoint-download",
    ),
    path("nodes/<str:pk>/undrain/", dashboard.NodeUndrainView.as_view(), name="node-undrain"),
    path("scenarios/", dashboard.ScenarioListView.as_view(), name="scenarios"),
    path("simulations/", dashboard.SimulationListView.as_view(), name="simulations"),
    path("simulations/<str:pk>/", dashboard.SimulationDetailView.as_view(), name="simulation-detail"),
    *router.urls,
]
