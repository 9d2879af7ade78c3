"""Service errors map one-to-one onto HTTP answers (see controlplane.api.errors)."""
from __future__ import annotations


class ServiceError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


class InvalidInput(ServiceError):
    status = 400
    code = "invalid"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    """The state machine forbids this change now (HTTP 409)."""

    status = 409
    code = "conflict"


class InvariantViolation(Conflict):
    code = "invariant_violation"


class PermissionDenied(ServiceError):
    status = 403
    code = "forbidden"
