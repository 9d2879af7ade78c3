"""Create (or reuse) a user and print an API token for automation."""

from typing import Any

from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand, CommandParser
from rest_framework.authtoken.models import Token

from controlplane.selectors.users import OPERATORS_GROUP


class Command(BaseCommand):
    help = "Create a user (operator by default) and print its API token."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--password", help="set a password for browser login")
        parser.add_argument("--viewer", action="store_true", help="read-only user (not an operator)")
        parser.add_argument("--staff", action="store_true", help="staff: may also issue agent tokens and use /admin/")

    def handle(self, *args: Any, **opts: Any) -> None:
        user, _created = User.objects.get_or_create(username=opts["username"])
        if opts["password"]:
            user.set_password(opts["password"])
        if opts["staff"]:
            user.is_staff = user.is_superuser = True
        user.save()
        if not opts["viewer"]:
            user.groups.add(Group.objects.get_or_create(name=OPERATORS_GROUP)[0])
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(token.key)
