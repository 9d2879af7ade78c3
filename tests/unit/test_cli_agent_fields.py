"""Every agent job field a user writes in a spec file reaches the API body under its own name (the CLI reads
the list from core, `controlplane.core.agent_spec.AGENT_FIELDS`, so a new field cannot be dropped on the way,
as agent_max_attempts once was when the CLI kept a copy)."""

from __future__ import annotations

from controlplane.core.agent_spec import AGENT_FIELDS
from pearl_cli import spec


def test_every_agent_field_in_a_spec_file_reaches_the_api_body(tmp_path) -> None:
    f = tmp_path / "job.yaml"
    f.write_text("name: a\nenvironment: agent\n" + "".join(f"{k}: {i}\n" for i, k in enumerate(AGENT_FIELDS)))
    body, wrote = spec.load_spec(str(f))
    assert {k: body[k] for k in AGENT_FIELDS} == {k: i for i, k in enumerate(AGENT_FIELDS)}
    assert all(wrote[k] == k for k in AGENT_FIELDS)
