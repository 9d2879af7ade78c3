"""The forecast's paired runs pin the configuration forecast, typed ones on a mixed pool included (issue 23)."""

from __future__ import annotations

from controlplane.sim.forecast import _pin_overrides


def test_a_pinned_run_runs_exactly_the_forecast_configuration() -> None:
    assert _pin_overrides("8C") == {"borrowing": False, "force_mode": "colocated"}
    assert _pin_overrides("3P5D") == {"borrowing": False, "force_ratio": [3, 5], "exact_ratio": True}
    # a typed label is run exactly (the old parser split '2P(H800) 4D(H20)' on 'P' and failed)
    assert _pin_overrides("2P(H800) 4D(H20)") == {"borrowing": False, "force_configuration": "2P(H800) 4D(H20)"}
    assert _pin_overrides("6C(H20+H800)") == {"borrowing": False, "force_configuration": "6C(H20+H800)"}
