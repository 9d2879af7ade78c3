"""Request validation and response shapes. Validation only; writes happen in services."""

from __future__ import annotations

import math
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.core.agent_spec import AGENT_FIELDS
from controlplane.core.loop import MAX_STALENESS
from controlplane.core.policies import PRODUCT_POLICIES, names
from controlplane.core.profiles import known_models
from controlplane.core.state import EngineKind, Mode
from controlplane.models import NAME_VALIDATOR, Decision, Event, Job, Node, Trajectory, Transition, TransitionStep
from controlplane.selectors import leases
from controlplane.selectors.nodes import present_gpus
from controlplane.services import trajectories

MAX_GPUS = 65536


# JSON types are part of the contract: DRF's fields also take "5" for 5, 1 for true and 5 for "5".
class StrictCharField(serializers.CharField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            raise serializers.ValidationError("must be a JSON string")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise serializers.ValidationError("must be a JSON integer")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise serializers.ValidationError("must be a JSON number")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            raise serializers.ValidationError("must be true or false")
        return data


class StrictChoiceField(serializers.ChoiceField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            raise serializers.ValidationError("must be a JSON string")
        return super().to_internal_value(data)


class JobCreateSerializer(serializers.Serializer):
    name = StrictCharField(max_length=63, validators=[NAME_VALIDATOR])
    model = StrictCharField(
        max_length=512,
        default="tiny",
        help_text=f"a profile's model ({', '.join(known_models())}) or the absolute path of a save_pretrained "
        "directory of a Qwen3, Qwen2, Llama or Mistral model with its tokenizer and chat template (engine torch or "
        "vllm); the job's submission checks the directory",
    )
    engine = StrictChoiceField(choices=[e.value for e in EngineKind], default=EngineKind.EMULATED.value)
    hardware = StrictCharField(max_length=32, default="cpu")
    hardware_types = serializers.ListField(
        child=StrictCharField(max_length=32),
        required=False,
        max_length=16,
        help_text='chip types the rollout pool may gather (e.g. ["H800", "H20"]); default: only `hardware`. '
        "Training stays on `hardware`; a TP group is one node's GPUs, so it never mixes types",
    )
    environment = StrictCharField(max_length=64, default="swe-like")
    policy = StrictChoiceField(choices=list(PRODUCT_POLICIES), default=names.PEARL)
    policy_options = serializers.DictField(
        required=False, help_text="options of the policy (GET /api/catalog/ lists them)"
    )
    tp = StrictIntegerField(min_value=1, max_value=16, default=1)
    batch_size = StrictIntegerField(min_value=1, max_value=1 << 20, default=64)
    group_size = StrictIntegerField(min_value=1, max_value=1024, default=16)
    max_staleness = StrictIntegerField(min_value=0, max_value=MAX_STALENESS, default=1)
    max_trajectory_tokens = StrictIntegerField(min_value=1, max_value=1 << 21, default=32768)
    rollout_gpus = StrictIntegerField(min_value=1, max_value=MAX_GPUS)
    training_gpus = StrictIntegerField(min_value=1, max_value=MAX_GPUS)
    # sharing the cluster with other jobs (issue 35; rollout_gpus is the job's maximum)
    priority = StrictIntegerField(
        min_value=-1000, max_value=1000, default=0, help_text="higher is served first when jobs share the cluster"
    )
    weight = StrictFloatField(default=1.0, help_text="positive: the fair share among jobs of equal priority")
    min_rollout_gpus = StrictIntegerField(
        min_value=0,
        max_value=MAX_GPUS,
        default=0,
        help_text="rollout GPUs guaranteed while the job runs (at most rollout_gpus; the reserved pool must hold it "
        "beside the other live jobs' guarantees)",
    )
    # environment "agent" (issue 19): JSON as given; services.jobs checks them with core.agent_spec (400 naming
    # the field) and keeps them as the job's `agent`
    agent_command = serializers.JSONField(required=False, help_text="argv list of the agent (environment agent)")
    agent_function = serializers.JSONField(required=False, help_text="'module:function' of a Python agent")
    agent_workdir = serializers.JSONField(required=False, help_text="directory the agent runs in")
    tasks = serializers.JSONField(required=False, help_text="a JSONL file path or a list of JSON objects")
    agent_timeout_s = serializers.JSONField(required=False, help_text="wall-clock limit per trajectory (s)")
    agent_concurrency = serializers.JSONField(required=False, help_text="agents running at once")
    agent_max_attempts = serializers.JSONField(
        required=False, help_text="failed runs per group member before it is final"
    )
    agent_isolation = serializers.JSONField(
        required=False, help_text="agent_function: 'process' (a worker pool, the default) or 'inline'"
    )
    agent_processes = serializers.JSONField(required=False, help_text="agent_function's worker processes at most")
    # issue 36: exported checkpoints and experiment trackers (services.checkpoints, services.tracking check them)
    checkpoint_every = StrictIntegerField(
        required=False, min_value=1, max_value=1_000_000, help_text="trainer updates between checkpoints (10)"
    )
    checkpoint_keep = StrictIntegerField(
        required=False, min_value=0, max_value=10_000, help_text="the newest K checkpoints kept (3; 0 keeps all)"
    )
    checkpoint_dir = StrictCharField(
        required=False,
        max_length=1000,
        help_text="absolute directory the training node writes checkpoints to and the control plane reads "
        "(default: the control plane's var dir)",
    )
    init_from = serializers.JSONField(
        required=False, help_text="{job: NAME, step: N} (step: default the newest) or an absolute checkpoint directory"
    )
    tracking = serializers.JSONField(
        required=False,
        help_text="{tensorboard: LOGDIR, mlflow: URI | {uri, experiment}, wandb: PROJECT | {project, entity}}",
    )

    def validate_weight(self, value: float) -> float:
        if not (math.isfinite(value) and 0 < value <= 1e6):
            raise serializers.ValidationError("weight must be a positive number (at most 1e6)")
        return value

    def validate(self, attrs: dict) -> dict:
        if attrs["min_rollout_gpus"] > attrs["rollout_gpus"]:
            raise serializers.ValidationError(
                {
                    "min_rollout_gpus": f"min_rollout_gpus={attrs['min_rollout_gpus']} is above rollout_gpus="
                    f"{attrs['rollout_gpus']} (the job's maximum)"
                }
            )
        if attrs["batch_size"] % attrs["group_size"]:
            raise serializers.ValidationError({"batch_size": "batch_size must be a multiple of group_size"})
        agent = {k: attrs.pop(k) for k in AGENT_FIELDS if k in attrs}
        if agent or attrs["environment"] == "agent":
            attrs["agent"] = agent
        return attrs


class JobSerializer(serializers.ModelSerializer):
    created_by: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="username", read_only=True, allow_null=True
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "name",
            "model",
            "engine",
            "hardware",
            "hardware_types",
            "environment",
            "policy",
            "policy_options",
            "tp",
            "batch_size",
            "group_size",
            "max_staleness",
            "max_trajectory_tokens",
            "rollout_gpus",
            "training_gpus",
            "priority",
            "weight",
            "min_rollout_gpus",
            "allotted_rollout_gpus",
            "status",
            "mode",
            "n_prefill",
            "n_decode",
            "n_colocated",
            "step",
            "weight_version",
            "training_active",
            "created_by",
            "created",
            "updated",
            "stopped_at",
            "failure_reason",
            "status_reason",
            "remaining",
            "agent",
            "checkpoint_every",
            "checkpoint_keep",
            "checkpoint_dir",
            "init_from",
            "tracking",
            "tracking_state",
        ]
        read_only_fields = fields


class OverrideSerializer(serializers.Serializer):
    force_mode = StrictChoiceField(choices=[m.value for m in Mode], allow_blank=True, allow_null=True, required=False)
    force_n_prefill = StrictIntegerField(min_value=1, max_value=MAX_GPUS, allow_null=True, required=False)
    force_n_decode = StrictIntegerField(min_value=1, max_value=MAX_GPUS, allow_null=True, required=False)
    force_exact = StrictBooleanField(
        required=False,
        help_text="true: force_n_prefill/force_n_decode are exact worker counts (spare workers stay "
        "unused); false (default): a P:D ratio scaled to the job's worker budget",
    )
    freeze = StrictBooleanField(required=False)
    borrowing = StrictBooleanField(required=False)
    elasticity = StrictBooleanField(required=False)
    updated = serializers.DateTimeField(read_only=True, allow_null=True)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            if unknown:
                raise serializers.ValidationError({sorted(unknown)[0]: "unknown override field"})
        return super().to_internal_value(data)


LAST_SEEN = "last_seen"  # context key: node id -> effective last-seen (selectors.leases.effective_last_seen)


class NodeListSerializer(serializers.ListSerializer):
    """Nodes as a list: their effective last-seen read for the whole page in one Redis round trip (unless the
    view's context already carries it), not once per row."""

    def to_representation(self, data: Any) -> list[Any]:
        page = list(data)
        if LAST_SEEN not in self.context:
            rows = {n.pk: n.last_heartbeat for n in page}
            self._context = {**self.context, LAST_SEEN: leases.effective_last_seen(rows)}
        return super().to_representation(page)


class NodeSerializer(serializers.ModelSerializer):
    """A node; `last_heartbeat` is the effective one (the row's is coarse while Redis renews the lease)."""

    gpus = serializers.SerializerMethodField()
    last_heartbeat = serializers.SerializerMethodField()

    class Meta:
        model = Node
        fields = [
            "id",
            "name",
            "pool",
            "status",
            "hardware",
            "engine",
            "epoch",
            "generation",
            "applied_generation",
            "last_heartbeat",
            "lease_expires",
            "preemption_deadline",
            "address",
            "ray_node_id",
            "ray_address",
            "gpus",
        ]
        read_only_fields = fields
        list_serializer_class = NodeListSerializer

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_last_heartbeat(self, node: Node) -> str | None:
        seen = self.context.get(LAST_SEEN)
        if seen is None or node.pk not in seen:  # one node on its own (a drain's answer): its own round trip
            seen = leases.effective_last_seen({node.pk: node.last_heartbeat})
        hb = seen[node.pk]
        return serializers.DateTimeField().to_representation(hb) if hb else None

    def get_gpus(self, node: Node) -> int:
        return present_gpus(node)


class PreemptionSerializer(serializers.Serializer):
    deadline_s = StrictFloatField(min_value=1.0, max_value=24 * 3600, help_text="seconds from now")


class TrainingSerializer(serializers.Serializer):
    active = StrictBooleanField()


class AgentTokenSerializer(serializers.Serializer):
    node = StrictCharField(max_length=63, validators=[NAME_VALIDATOR])


class DecisionSerializer(serializers.ModelSerializer):
    job: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = Decision
        fields = [
            "id",
            "job",
            "created",
            "signal",
            "budget",
            "profile",
            "candidates",
            "mode",
            "n_prefill",
            "n_decode",
            "n_colocated",
            "borrow",
            "predicted_makespan_s",
            "expected_gain",
            "admitted",
            "reason",
        ]
        read_only_fields = fields


class StepSerializer(serializers.ModelSerializer):
    class Meta:
        model = TransitionStep
        fields = ["index", "kind", "worker_slot", "args", "key", "status", "attempts", "started", "finished", "error"]
        read_only_fields = fields


class TransitionSerializer(serializers.ModelSerializer):
    job: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(slug_field="name", read_only=True)
    steps = StepSerializer(many=True, read_only=True)

    class Meta:
        model = Transition
        fields = ["id", "job", "decision", "status", "plan", "created", "started", "finished", "error", "steps"]
        read_only_fields = fields


class EventSerializer(serializers.ModelSerializer):
    job: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )
    node: serializers.SlugRelatedField[Any] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )

    class Meta:
        model = Event
        fields = ["id", "created", "kind", "job", "node", "actor", "message", "data"]
        read_only_fields = fields


class TrajectorySerializer(serializers.ModelSerializer):
    """An agent trajectory (issue 19): mask 1 = a token the policy sampled (trained on), 0 = template, tool
    output, observation; weight_versions, workers and latency_s are per turn (a turn's workers: a list of every
    worker that served it, in order, as a turn resumed on another worker has two); `truncated`: the token lists
    were cut (token_count says how many there were); `trained`: a done trajectory was trained on (true) or left
    out of its step's update (false: its group was dropped, `reason` says why), null otherwise."""

    class Meta:
        model = Trajectory
        fields = ["id", "step", "name", *trajectories.FIELDS, "created"]  # the fields the driver reports
        read_only_fields = fields
