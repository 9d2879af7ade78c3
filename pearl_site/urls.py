from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from controlplane import views
from controlplane.api.docs import DocsView

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("jobs/new/", views.launch_page, name="launch"),
    path("jobs/<int:job_id>/", views.job_page, name="job"),
    path("simulator/", views.simulator_page, name="simulator"),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", views.MetricsView.as_view(), name="metrics"),
    path("api/", include("controlplane.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", DocsView.as_view(url_name="schema"), name="api-docs"),
    path("accounts/login/", auth_views.LoginView.as_view(template_name="login.html"), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
]

# Errors raised before a view runs answer in the API's JSON error shape, not an HTML page.
handler400 = "controlplane.api.errors.bad_request"
handler403 = "controlplane.api.errors.permission_denied"
handler404 = "controlplane.api.errors.page_not_found"
