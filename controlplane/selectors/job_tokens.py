"""Per-job secrets derived from SECRET_KEY and the job's identity: the weights key and its scoped,
rotating tokens (see core.agent_link), the driver-link token and the data-plane token. Nothing is
stored, so they are read like any other fact of a job (the desired states and the driver's welcome
carry them); checking a presented token is `services.credentials`."""

from __future__ import annotations

from django.conf import settings
from django.utils.crypto import salted_hmac

from controlplane.core import agent_link as link
from controlplane.models import Job

DRIVER_TOKEN_PREFIX = "pdr_"  # "PEARL driver": the driver link (/ws/driver/) of one job


def _job_identity(job: Job) -> str:
    """Changes when a job of the same name is recreated, so its secrets change too."""
    return f"{job.pk}|{job.name}|{job.created.isoformat() if job.created else ''}"


def job_weights_key(job: Job) -> str:
    """The job's weights key (hex): derived from SECRET_KEY and the job's identity, so nothing is stored
    and a recreated job of the same name gets another key. Given only to the job's trainer."""
    return salted_hmac("pearl.weights-key", _job_identity(job), algorithm="sha256").hexdigest()


def job_weights_token(job: Job, *, now: float | None = None) -> str:
    """A token that opens this job's weights (and nothing else) for the current rotation period."""
    rotate_s = settings.PEARL["WEIGHTS_TOKEN_ROTATE_S"]
    return link.weights_token(job_weights_key(job), job.name, link.token_bucket(rotate_s, now))


def job_dataplane_token(job: Job) -> str:
    """Opens this job's workers and trainer to its rollout driver (and nothing of any other job)."""
    return "pdp_" + salted_hmac("pearl.dataplane", _job_identity(job), algorithm="sha256").hexdigest()


def job_driver_token(job: Job) -> str:
    """The job's driver link token: the job id and an HMAC over its identity."""
    mac = salted_hmac("pearl.driver", _job_identity(job), algorithm="sha256").hexdigest()
    return f"{DRIVER_TOKEN_PREFIX}{job.pk}.{mac}"
