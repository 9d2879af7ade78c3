"""The CLI keeps its own copy of the agent job fields (it imports no control-plane code); the copy must be
the control plane's list, or a field a user writes in a spec file is dropped on the way (as
agent_max_attempts once was)."""

from __future__ import annotations

from controlplane.core.agent_spec import AGENT_FIELDS
from pearl_cli import spec


def test_the_clis_agent_fields_are_the_control_planes() -> None:
    assert spec.AGENT_FIELDS == AGENT_FIELDS
