"""Who a user is to the control plane: what the API lets them do."""

from __future__ import annotations

from typing import Any

OPERATORS_GROUP = "operators"


def is_operator(user: Any) -> bool:
    """Staff, or a member of the 'operators' group: may change cluster state (reads need only a login)."""
    if not (user and user.is_authenticated):
        return False
    return bool(user.is_staff or user.groups.filter(name=OPERATORS_GROUP).exists())
