"""Prometheus text exposition of the cluster state (no client library needed for gauges)."""
from __future__ import annotations

from collections import Counter

from django.db.models import Count
from django.utils import timezone

from controlplane.core.state import Activity, NodeStatus, Role
from controlplane.models import GPU, Job, Node, Transition, Worker, WorkerGPU


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prometheus_text() -> str:
    lines: list[str] = []

    def gauge(name: str, help_: str, samples: list[tuple[dict[str, str], float]]) -> None:
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} gauge")
        for labels, value in samples:
            label = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{label}}} {value}" if label else f"{name} {value}")

    by_status = Counter(dict(Node.objects.values_list("status").annotate(n=Count("id"))))
    gauge("pearl_nodes", "Nodes by status.", [({"status": s.value}, float(by_status.get(s.value, 0))) for s in NodeStatus])

    active = dict(WorkerGPU.objects.filter(active=True).values_list("worker__role").annotate(n=Count("id")))
    alive = Counter()
    for role, activity in WorkerGPU.objects.filter(alive=True).values_list("worker__role", "worker__activity"):
        alive[(role, activity)] += 1
    present = GPU.objects.filter(present=True).count()
    bound = WorkerGPU.objects.filter(alive=True).values("gpu_id").distinct().count()
    samples = [({"role": r.value, "activity": a.value}, float(alive.get((r.value, a.value), 0))) for r in Role for a in Activity]
    samples.append(({"role": "none", "activity": "idle"}, float(max(0, present - bound))))
    gauge("pearl_gpus", "GPU slots by the role and activity of the workers bound to them.", samples)
    gauge("pearl_gpus_active", "GPU slots with an active worker, by role.", [({"role": r.value}, float(active.get(r.value, 0))) for r in Role])

    workers = Counter(dict(Worker.objects.filter(alive=True).values_list("role").annotate(n=Count("id"))))
    gauge("pearl_workers", "Alive workers by role.", [({"role": r.value}, float(workers.get(r.value, 0))) for r in Role])

    transitions = Counter(dict(Transition.objects.values_list("status").annotate(n=Count("id"))))
    gauge("pearl_transitions", "Transitions by status.", [({"status": st.value}, float(transitions.get(st.value, 0))) for st in Transition.Status])

    jobs = Counter(dict(Job.objects.values_list("status").annotate(n=Count("id"))))
    gauge("pearl_jobs", "Jobs by status.", [({"status": st.value}, float(jobs.get(st.value, 0))) for st in Job.Status])

    now = timezone.now()
    ages = [({"node": n, "pool": p}, round((now - hb).total_seconds(), 3))
            for n, p, hb in Node.objects.exclude(status=NodeStatus.GONE).exclude(last_heartbeat=None).values_list("name", "pool", "last_heartbeat")]
    gauge("pearl_agent_heartbeat_age_seconds", "Seconds since each node agent's last heartbeat.", ages)
    return "\n".join(lines) + "\n"
