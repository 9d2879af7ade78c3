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


class NotOwned(ServiceError):
    """A link principal spoke about a job or worker it does not run (refused; the link stays up)."""

    status = 403
    code = "not_owned"


class Superseded(Conflict):
    """Another socket registered for this node since: this one no longer holds the lease."""

    code = "superseded"


class StaleEpoch(Conflict):
    """A message fenced by an older epoch than the node's current one."""

    code = "stale_epoch"
