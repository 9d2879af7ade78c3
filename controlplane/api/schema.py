"""OpenAPI generation: every operation documents the 4xx answers it can give, in the one error shape
(`ErrorSerializer`), so clients and the schema-driven fuzzer know what a refusal looks like."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema

from controlplane.api.errors import ErrorSerializer
from controlplane.api.params import MAX_ID

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ERROR_MEANINGS = {
    "400": "bad input: the field or parameter is named; nothing changed",
    "401": "no or bad credentials",
    "403": "not allowed for this user (changes need an operator)",
    "404": "no such object",
    "409": "the state machine forbids this change now",
    "413": "request body too large",
    "415": "request body is not JSON",
    "429": "too many state-changing calls (PEARL_WRITE_RATE)",
}


class PearlAutoSchema(AutoSchema):
    def _error_codes(self) -> list[str]:
        codes = ["400", "401", "403"]
        if "{" in self.path:
            codes.append("404")
        if self.method in WRITE_METHODS:
            codes += ["409", "413", "415", "429"]
        return codes

    def _resolve_path_parameters(self, variables: list[str]) -> list[dict[str, Any]]:
        """Path ids route on any segment (so `abc` gets a 400 naming `id`, not a 404), but are integers."""
        parameters = super()._resolve_path_parameters(variables)
        for p in parameters:
            if p["name"] == "id":
                p["schema"] = {"type": "integer", "minimum": 1, "maximum": MAX_ID}
        return parameters

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        for code in self._error_codes():
            if code not in responses:
                body = self._get_response_for_code(ErrorSerializer, code, direction=direction)
                body["description"] = ERROR_MEANINGS[code]
                responses[code] = body
        return responses
