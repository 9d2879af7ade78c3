"""The latency histograms a Prometheus user expects of the control plane, observed where the work is
done: handling one node agent heartbeat, planning one job, one transition step (issued until the agents
confirm it), one trajectory turn (generation and environment, as the job's rollout driver reports it).

They live in the memory of the process that observes them (prometheus_client), one set per process:
heartbeats and turns in the web server (Daphne) that holds the agent and driver sockets, plans and
transition steps in the Celery worker. /metrics answers with the histograms of its own process; with
PROMETHEUS_MULTIPROC_DIR set, to one empty directory, for every web and Celery process of a host
(prometheus_client's multiprocess mode), each process writes its values there and /metrics sums those of
every process, behind the endpoint's own authentication (no second, open port)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from controlplane.core.context import Signal

REGISTRY = CollectorRegistry(auto_describe=True)

HEARTBEAT_SECONDS = Histogram(
    "pearl_heartbeat_handling_seconds",
    "Time to handle one node agent heartbeat (lease, observed workers).",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
    registry=REGISTRY,
)
PLAN_SECONDS = Histogram(
    "pearl_plan_seconds",
    "Time to plan one job (budget, decision, transition plan), by the signal that asked.",
    ["signal"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
TRANSITION_STEP_SECONDS = Histogram(
    "pearl_transition_step_seconds",
    "Time from issuing a transition step until the agents confirm it, by kind.",
    ["kind"],
    buckets=(0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
    registry=REGISTRY,
)
TURN_SECONDS = Histogram(
    "pearl_turn_seconds",
    "Duration of one trajectory turn (generation and environment), as the rollout driver reports it.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0),
    registry=REGISTRY,
)

_SIGNALS = frozenset(s.value for s in Signal)


def signal_label(signal: str) -> str:
    """A plan's signal as a label value: one of the paper's signals, else "other" (bounded cardinality)."""
    return str(signal) if str(signal) in _SIGNALS else "other"
