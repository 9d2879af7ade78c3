"""The names a job spec may use, read from the one place each is defined (core)."""

from __future__ import annotations

from typing import Any

from controlplane.core.policies import POLICIES
from controlplane.core.profiles import known_hardware, known_models
from controlplane.core.state import EngineKind


def catalog() -> dict[str, Any]:
    """Policies with their options, models, hardware and engines (for the API, the job form and the CLI)."""
    return {
        "policies": [
            {
                "name": name,
                "summary": cls.summary,
                "product": cls.product,
                "options": [
                    {
                        "name": o.name,
                        "type": o.kind.__name__,
                        "default": o.default,
                        "minimum": o.minimum,
                        "maximum": o.maximum,
                        "help": o.help,
                    }
                    for o in cls.options
                ],
            }
            for name, cls in POLICIES.items()
        ],
        "models": list(known_models()),
        "hardware": list(known_hardware()),
        "engines": [e.value for e in EngineKind],
    }
