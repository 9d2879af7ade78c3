"""The Swagger UI page. drf-spectacular renders it with a template renderer only, so an OPTIONS or
an error (401, 405) had no template to render and became a 500; those answer JSON here."""

from __future__ import annotations

from typing import Any

from drf_spectacular.views import SpectacularSwaggerView
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response


class DocsView(SpectacularSwaggerView):
    def finalize_response(self, request: Request, response: Response, *args: Any, **kwargs: Any) -> Response:
        if request.method not in ("GET", "HEAD") or response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)
