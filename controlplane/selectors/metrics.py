"""The cluster state as Prometheus gauges: a prometheus_client custom collector over the database read
model, so every scrape reads the durable state (the same in every process that serves /metrics)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from django.db.models import Count
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from controlplane.core.state import Activity, NodeStatus, Role
from controlplane.models import GPU, Job, Node, Transition, Worker, WorkerGPU
from controlplane.selectors import leases


def _gauge(name: str, help_: str, labels: list[str], samples: list[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_, labels=labels)
    for values, value in samples:
        family.add_metric(values, value)
    return family


class ClusterCollector(Collector):
    """Nodes, GPU slots, workers, transitions and jobs by state, and each agent's heartbeat age."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        by_status = Counter(dict(Node.objects.values_list("status").annotate(n=Count("id"))))
        yield _gauge(
            "pearl_nodes",
            "Nodes by status.",
            ["status"],
            [([s.value], float(by_status.get(s.value, 0))) for s in NodeStatus],
        )

        active = dict(WorkerGPU.objects.filter(active=True).values_list("worker__role").annotate(n=Count("id")))
        alive: Counter[tuple[str, str]] = Counter()
        for role, activity in WorkerGPU.objects.filter(alive=True).values_list("worker__role", "worker__activity"):
            alive[(role, activity)] += 1
        present = GPU.objects.filter(present=True).count()
        bound = WorkerGPU.objects.filter(alive=True).values("gpu_id").distinct().count()
        samples = [([r.value, a.value], float(alive.get((r.value, a.value), 0))) for r in Role for a in Activity]
        samples.append((["none", "idle"], float(max(0, present - bound))))
        yield _gauge(
            "pearl_gpus",
            "GPU slots by the role and activity of the workers bound to them.",
            ["role", "activity"],
            samples,
        )
        yield _gauge(
            "pearl_gpus_active",
            "GPU slots with an active worker, by role.",
            ["role"],
            [([r.value], float(active.get(r.value, 0))) for r in Role],
        )

        workers = Counter(dict(Worker.objects.filter(alive=True).values_list("role").annotate(n=Count("id"))))
        yield _gauge(
            "pearl_workers",
            "Alive workers by role.",
            ["role"],
            [([r.value], float(workers.get(r.value, 0))) for r in Role],
        )

        transitions = Counter(dict(Transition.objects.values_list("status").annotate(n=Count("id"))))
        yield _gauge(
            "pearl_transitions",
            "Transitions by status.",
            ["status"],
            [([st.value], float(transitions.get(st.value, 0))) for st in Transition.Status],
        )

        jobs = Counter(dict(Job.objects.values_list("status").annotate(n=Count("id"))))
        yield _gauge(
            "pearl_jobs",
            "Jobs by status.",
            ["status"],
            [([st.value], float(jobs.get(st.value, 0))) for st in Job.Status],
        )

        now = timezone.now()
        leased = list(Node.objects.exclude(status=NodeStatus.GONE).values_list("id", "name", "pool", "last_heartbeat"))
        # the rows' last-seen is coarse while Redis renews the leases (services/leases.py): one round trip
        seen = leases.effective_last_seen({i: hb for i, _, _, hb in leased})
        yield _gauge(
            "pearl_agent_heartbeat_age_seconds",
            "Seconds since each node agent's last heartbeat.",
            ["node", "pool"],
            [([n, p], round((now - hb).total_seconds(), 3)) for i, n, p, _ in leased if (hb := seen[i])],
        )
