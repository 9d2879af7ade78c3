"""Schema-driven fuzzing of the REST API with schemathesis: every operation of the OpenAPI schema, with
generated valid (positive) and invalid (negative) input, as each of several users; seeded and bounded.

Each response must be no server error, and conform to the schema: a documented status code and
content type, the documented body shape, and negative input refused with a 4xx. Schema-valid input
may still be refused with a 400 by a rule the schema cannot state (more GPUs than the cluster has,
batch_size not a multiple of group_size), so schemathesis' positive_data_acceptance check is off. Used by the CI test
(tests/fuzz/test_api_fuzz.py, small) and by benchmarks/bench_fuzz.py (>= 20,000 calls).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance
from schemathesis.core.failures import Failure


@dataclass
class FuzzReport:
    calls: int = 0
    server_errors: list[str] = field(default_factory=list)  # one line per 5xx
    nonconforming: list[str] = field(default_factory=list)  # one line per other check failure
    statuses: Counter = field(default_factory=Counter)
    unsatisfiable: list[str] = field(default_factory=list)  # (operation, mode) with no such input to generate
    failure_kinds: Counter = field(default_factory=Counter)  # distinct non-conformances and how often
    seconds: float = 0.0

    def merge(self, other: FuzzReport) -> None:
        self.calls += other.calls
        self.server_errors += other.server_errors
        self.nonconforming += other.nonconforming
        self.statuses.update(other.statuses)
        self.unsatisfiable += other.unsatisfiable
        self.failure_kinds.update(other.failure_kinds)
        self.seconds += other.seconds


def load_schema(base_url: str, token: str) -> Any:
    raw = requests.get(f"{base_url}/api/schema/?format=json", headers={"Authorization": f"Token {token}"}, timeout=30)
    raw.raise_for_status()
    return schemathesis.openapi.from_dict(raw.json())


def fuzz(
    base_url: str,
    tokens: dict[str, str],
    *,
    examples: int,
    seed_value: int = 0,
    modes: tuple[GenerationMode, ...] = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE),
) -> FuzzReport:
    """`examples` generated cases per operation, mode and user (hypothesis `max_examples`)."""
    report = FuzzReport()
    schema = load_schema(base_url, next(iter(tokens.values())))
    session = requests.Session()
    start = time.perf_counter()
    for user, token in tokens.items():
        headers = {"Authorization": f"Token {token}"}
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in modes:
                strategy = operation.as_strategy(generation_mode=mode)

                @seed(seed_value)
                @settings(
                    max_examples=examples,
                    deadline=None,
                    database=None,
                    derandomize=False,
                    suppress_health_check=list(HealthCheck),
                    report_multiple_bugs=True,
                )
                @given(case=strategy)
                def run(case: Any) -> None:
                    response = case.call(base_url=base_url, session=session, headers=headers, timeout=30)  # noqa: B023  (run() is called within this iteration, before the loop variables move on)
                    report.calls += 1
                    report.statuses[response.status_code] += 1
                    where = f"{user} {case.method} {case.formatted_path} ({mode.value})"  # noqa: B023  (run() is called within this iteration, before the loop variables move on)
                    if response.status_code >= 500:
                        report.server_errors.append(f"{where}: {response.status_code} {response.text[:200]}")
                        return
                    try:
                        case.validate_response(response, headers=headers, excluded_checks=[positive_data_acceptance])  # noqa: B023  (run() is called within this iteration, before the loop variables move on)
                    except (Failure, BaseExceptionGroup) as exc:  # one failed check, or a group of them
                        text = str(exc)
                        report.nonconforming.append(f"{where}: {type(exc).__name__}: {text[:400]}")
                        why = [
                            line.strip()
                            for line in text.splitlines()
                            if line.strip().startswith(("- ST", "Invalid component", "- violates"))
                        ]
                        report.failure_kinds[f"{case.method} {operation.path}: " + " | ".join(why)[:200]] += 1  # noqa: B023  (run() is called within this iteration, before the loop variables move on)

                try:
                    run()
                except Unsatisfiable:  # e.g. no negative input exists for an operation without parameters
                    report.unsatisfiable.append(f"{operation.label} ({mode.value})")
    report.seconds = time.perf_counter() - start
    return report
