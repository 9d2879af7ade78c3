"""Issue (or revoke) a per-node agent token."""

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from controlplane.services.credentials import issue_agent_token, revoke_agent_tokens
from controlplane.services.errors import ServiceError


class Command(BaseCommand):
    help = "Print a new agent token for NODE (shown once; stored hashed). --revoke revokes all of NODE's tokens."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("node")
        parser.add_argument("--revoke", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        try:
            if opts["revoke"]:
                n = revoke_agent_tokens(node_name=opts["node"], actor="cli")
                self.stdout.write(f"revoked {n} token(s)")
            else:
                self.stdout.write(issue_agent_token(node_name=opts["node"], actor="cli"))
        except ServiceError as exc:
            raise CommandError(exc.message) from exc
