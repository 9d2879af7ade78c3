"""PEARL models in the Django admin: browse and search everything; history (events, decisions,
transitions, telemetry) is read-only there, since every state change goes through a service."""

from __future__ import annotations

from typing import Any

from django.contrib import admin

from controlplane import models as m
from controlplane.selectors.jobs import OVERRIDE_FIELDS


class ReadOnlyAdmin(admin.ModelAdmin):
    """History and the cluster map are written by services only (invariants, events, deltas)."""

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False


class GPUInline(admin.TabularInline):
    model = m.GPU
    extra = 0
    can_delete = False
    readonly_fields = ("index", "hardware", "memory_mb", "zone", "present")

    def has_add_permission(self, request: Any, obj: Any = None) -> bool:
        return False


@admin.register(m.Node)
class NodeAdmin(ReadOnlyAdmin):
    list_display = ("name", "pool", "status", "hardware", "engine", "epoch", "last_heartbeat", "preemption_deadline")
    list_filter = ("pool", "status", "hardware")
    search_fields = ("name",)
    inlines = [GPUInline]


@admin.register(m.GPU)
class GPUAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "hardware", "memory_mb", "zone", "present")
    list_filter = ("zone", "present", "hardware")
    search_fields = ("node__name",)


class OverrideInline(admin.StackedInline):
    model = m.Override
    can_delete = False
    readonly_fields = (*OVERRIDE_FIELDS, "updated_by", "updated")


@admin.register(m.Job)
class JobAdmin(ReadOnlyAdmin):
    list_display = (
        "name",
        "status",
        "policy",
        "model",
        "engine",
        "mode",
        "n_prefill",
        "n_decode",
        "n_colocated",
        "step",
        "priority",
        "weight",
        "min_rollout_gpus",
        "allotted_rollout_gpus",
        "created_by",
        "created",
    )
    list_filter = ("status", "policy", "engine", "model", "priority")
    search_fields = ("name",)
    inlines = [OverrideInline]


@admin.register(m.Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ("job", "slot", "node", "zone", "role", "activity", "engine", "weight_version", "alive")
    list_filter = ("alive", "role", "activity", "zone")
    search_fields = ("job__name", "node__name")


@admin.register(m.TrainingLend)
class TrainingLendAdmin(ReadOnlyAdmin):
    list_display = ("owner", "borrower", "gpus", "due", "created")
    search_fields = ("owner__name", "borrower__name")


@admin.register(m.Decision)
class DecisionAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "job",
        "created",
        "signal",
        "mode",
        "n_prefill",
        "n_decode",
        "n_colocated",
        "borrow",
        "predicted_makespan_s",
        "expected_gain",
        "admitted",
    )
    list_filter = ("admitted", "mode", "signal")
    search_fields = ("job__name", "reason")


class StepInline(admin.TabularInline):
    model = m.TransitionStep
    extra = 0
    readonly_fields = ("index", "kind", "worker_slot", "args", "status", "attempts", "started", "finished", "error")
    exclude = ("key",)


@admin.register(m.Transition)
class TransitionAdmin(ReadOnlyAdmin):
    list_display = ("id", "job", "status", "created", "started", "finished")
    list_filter = ("status",)
    search_fields = ("job__name",)
    inlines = [StepInline]


@admin.register(m.Event)
class EventAdmin(ReadOnlyAdmin):
    list_display = ("created", "kind", "job", "node", "actor", "message")
    list_filter = ("kind",)
    search_fields = ("message", "actor", "kind")
    date_hierarchy = "created"


@admin.register(m.AgentCredential)
class AgentCredentialAdmin(ReadOnlyAdmin):
    """Tokens are issued with `manage.py issue_agent_token` (shown once); only the prefix is stored in clear."""

    list_display = ("node_name", "prefix", "created", "revoked", "last_used")
    search_fields = ("node_name",)
    exclude = ("key_hash",)


@admin.register(m.TelemetrySample)
class TelemetrySampleAdmin(ReadOnlyAdmin):
    list_display = ("created", "job", "node", "kind")
    list_filter = ("kind",)
    search_fields = ("job__name",)


@admin.register(m.SimulationRun)
class SimulationRunAdmin(ReadOnlyAdmin):
    list_display = ("id", "scenario", "seed", "status", "wall_s", "created_by", "created")
    list_filter = ("status", "scenario")
