"""ASGI entry point: HTTP through Django; websockets for the dashboard (session, origin-checked) and
the agent and driver links (per-node / per-job bearer tokens, no cookies)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pearl_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.conf import settings  # noqa: E402
from django.urls import path  # noqa: E402

from controlplane.api.limits import BodyLimit  # noqa: E402
from controlplane.consumers.agent import AgentConsumer  # noqa: E402
from controlplane.consumers.dashboard import DashboardConsumer  # noqa: E402
from controlplane.consumers.driver import DriverConsumer  # noqa: E402

dashboard_routes = AllowedHostsOriginValidator(
    AuthMiddlewareStack(URLRouter([path("ws/dashboard/", DashboardConsumer.as_asgi())]))
)
token_routes = URLRouter([path("ws/agent/", AgentConsumer.as_asgi()), path("ws/driver/", DriverConsumer.as_asgi())])


async def websocket_router(scope, receive, send):
    """Agents and drivers are not browsers: they authenticate by token, so they skip the origin/session stack."""
    if scope["path"] in ("/ws/agent/", "/ws/driver/"):
        return await token_routes(scope, receive, send)
    return await dashboard_routes(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": BodyLimit(django_asgi_app, settings.DATA_UPLOAD_MAX_MEMORY_SIZE),  # JSON 413 before Django reads a byte
        "websocket": websocket_router,
    }
)
