"""Per-node agent tokens: random, shown once, stored as SHA-256, revocable, bound to one node name.
Per-job driver tokens checked: derived (nothing stored, `selectors.job_tokens`), valid while the job lives."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from django.db import transaction
from django.utils import timezone

from controlplane.models import NAME_VALIDATOR, AgentCredential, Job, Node
from controlplane.selectors.job_tokens import DRIVER_TOKEN_PREFIX, job_driver_token
from controlplane.services import leases
from controlplane.services.errors import InvalidInput, NotFound
from controlplane.services.events import emit

TOKEN_PREFIX = "pna_"  # "PEARL node agent": never accepted where a user token is expected, and vice versa


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_agent_token(*, node_name: str, actor: str = "system") -> str:
    """Create a token for the agent of `node_name`; returns the plaintext (the only time it exists)."""
    try:
        NAME_VALIDATOR(node_name)
    except Exception as exc:
        raise InvalidInput(f"node name {node_name!r}: {exc}", field="node") from exc
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        AgentCredential.objects.create(node_name=node_name, key_hash=_hash(token), prefix=token[4:12])
        emit(
            kind="agent.token_issued",
            message=f"agent token issued for node {node_name}",
            actor=actor,
            data={"node": node_name},
        )
    return token


def authenticate_agent(token: str) -> AgentCredential | None:
    """The credential for a valid, unrevoked token, else None (constant work for unknown tokens). One read, no
    write: a socket's handshake must not wait for a commit (a thousand agents reconnecting at once after a
    restart each did one); its registration records `last_used` in its own transaction."""
    if not token or not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    return AgentCredential.objects.filter(key_hash=_hash(token), revoked__isnull=True).first()


def revoke_agent_tokens(*, node_name: str, actor: str = "system") -> int:
    with transaction.atomic():
        n = AgentCredential.objects.filter(node_name=node_name, revoked__isnull=True).update(revoked=timezone.now())
        if n == 0:
            raise NotFound(f"no active agent token for node {node_name!r}", field="node")
        # a heartbeat renewed in Redis checks no token: the node's record goes, its next one checks it
        dropped = list(Node.objects.filter(name=node_name).values_list("pk", flat=True))
        transaction.on_commit(lambda: leases.drop_records(dropped))
        emit(
            kind="agent.token_revoked",
            message=f"{n} agent token(s) revoked for node {node_name}",
            actor=actor,
            data={"node": node_name},
        )
    return n


def credential_is_valid(credential_id: int) -> bool:
    """Re-checked on every agent message so a revoked token stops working within one message."""
    return AgentCredential.objects.filter(pk=credential_id, revoked__isnull=True).exists()


# ---------------------------------------------------------------- per-job driver tokens
def authenticate_driver(token: str) -> Job | None:
    """The live job a driver token belongs to, else None (ended jobs take no driver)."""
    if not token or not token.startswith(DRIVER_TOKEN_PREFIX) or len(token) > 200:
        return None
    job_id, _, _ = token[len(DRIVER_TOKEN_PREFIX) :].partition(".")
    if not job_id.isascii() or not job_id.isdigit() or len(job_id) > 18:
        return None
    job = Job.objects.filter(pk=int(job_id)).exclude(status__in=[Job.Status.STOPPED, Job.Status.FAILED]).first()
    if job is None or not hmac.compare_digest(job_driver_token(job).encode(), token.encode()):
        return None
    return job
