"""CI's schema-driven fuzz run (bounded and seeded: 8 cases per operation, mode and user, about 1,000 calls):
no 5xx, every answer as the schema documents it. The large run (>= 20,000 calls) is benchmarks/bench_fuzz.py."""

from __future__ import annotations

import os

import pytest

from tests.fuzz.schema_fuzz import fuzz

EXAMPLES = int(os.environ.get("PEARL_FUZZ_EXAMPLES", "8"))


@pytest.mark.slow
def test_schema_fuzz_no_server_errors_and_conformant(fuzz_target):
    report = fuzz(fuzz_target.base_url, fuzz_target.tokens, examples=EXAMPLES, seed_value=20251130)
    assert report.calls >= 200
    assert report.server_errors == [], "\n".join(report.server_errors[:20])
    assert report.nonconforming == [], "\n".join(f"{n}× {k}" for k, n in report.failure_kinds.most_common(20))
    assert {c // 100 for c in report.statuses} <= {2, 4}
