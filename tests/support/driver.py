"""The job a rollout driver is handed in the driver unit tests (`JobView`, as the control plane sends it)."""

from __future__ import annotations

from typing import Any

from controlplane.core import driver_link as dl


def job_view(**overrides: Any) -> dl.JobView:
    """A small calculator job on the emulated engine (B = 4 in groups of 2, staleness 1); `overrides` win."""
    fields: dict[str, Any] = {
        "name": "j",
        "environment": "calculator",
        "model": "tiny",
        "engine": "emulated",
        "batch_size": 4,
        "group_size": 2,
        "max_staleness": 1,
        "max_trajectory_tokens": 4096,
        "return_deadline_s": 30.0,
    }
    return dl.JobView(**(fields | overrides))
