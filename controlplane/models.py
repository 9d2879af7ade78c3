"""Durable state: the unified GPU–worker–role map (docs/design.md §3) and its history.

All writes go through `controlplane.services`; these models only declare shape and the database
backstops of the invariants (partial unique constraints), so that even a buggy caller cannot bind
one GPU to two active workers.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from django.conf import settings
from django.core.validators import MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q

from controlplane.core.policies import names
from controlplane.core.state import Activity, EngineKind, Mode, NodeStatus, Pool, Role, Zone

NAME_RE = r"[a-z0-9][a-z0-9._-]{0,62}"  # also the API's query-parameter check (api/params.py)
NAME_VALIDATOR = RegexValidator(f"^{NAME_RE}$", "lowercase letters, digits, '.', '_' or '-' (max 63)")


def choices(enum: type[StrEnum]) -> list[tuple[str, str]]:
    return [(m.value, m.value) for m in enum]


class Node(models.Model):
    """A machine with GPU slots, run by one node agent. `epoch` is its fencing token."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    pool = models.CharField(max_length=16, choices=choices(Pool))
    status = models.CharField(max_length=16, choices=choices(NodeStatus), default=NodeStatus.NOT_READY)
    hardware = models.CharField(max_length=32)
    engine = models.CharField(max_length=16, choices=choices(EngineKind), default=EngineKind.EMULATED)
    data_plane = models.CharField(max_length=200, blank=True)
    incarnation = models.CharField(max_length=64, blank=True)
    address = models.CharField(max_length=64, blank=True)  # the agent's peer address, as the control plane saw it
    agent_channel = models.CharField(max_length=128, blank=True)  # the one socket that holds the lease (fencing)
    epoch = models.PositiveBigIntegerField(default=1)
    generation = models.PositiveBigIntegerField(default=0)  # desired-state generation
    applied_generation = models.PositiveBigIntegerField(default=0)  # last generation the agent applied
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    lease_expires = models.DateTimeField(null=True, blank=True)
    preemption_deadline = models.DateTimeField(null=True, blank=True)
    observed = models.JSONField(default=list, blank=True)  # last ObservedWorker list from the agent
    ray_node_id = models.CharField(max_length=64, blank=True, db_index=True)  # set by the Ray bridge
    ray_address = models.CharField(max_length=64, blank=True)  # the node's IP in Ray's node table
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def zone(self) -> Zone:
        return Zone.OVERLAP if self.pool == Pool.TRAINING else Zone.ROLLOUT


class GPU(models.Model):
    """A GPU slot (on CPU machines a logical device slot)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    hardware = models.CharField(max_length=32)
    memory_mb = models.PositiveIntegerField(default=0)
    zone = models.CharField(max_length=16, choices=choices(Zone), default=Zone.ROLLOUT)
    present = models.BooleanField(default=True)  # False once the node is gone (history is kept)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node")]

    def __str__(self) -> str:
        return f"{self.node.name}:{self.index}"


class Job(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        # no rollout workers, its trainer, driver, checkpoint and records kept; resumed where it was (issue 34)
        PAUSED = "paused"
        STOPPING = "stopping"
        STOPPED = "stopped"
        FAILED = "failed"

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    # a profile's model name, or the absolute path of a save_pretrained directory (issue 36)
    model = models.CharField(max_length=512, default="tiny")
    engine = models.CharField(max_length=16, choices=choices(EngineKind), default=EngineKind.EMULATED)
    hardware = models.CharField(max_length=32, default="cpu")
    # the chip types its rollout pool may gather (issue 23), canonical names as core.profiles spells them;
    # [] = only `hardware`. Training stays on `hardware`; a TP group never mixes types (one node, one type)
    hardware_types = models.JSONField(default=list, blank=True)
    environment = models.CharField(max_length=64, default="swe-like")
    policy = models.CharField(max_length=16, default=names.PEARL)
    policy_options = models.JSONField(default=dict, blank=True)  # validated by core.policies.validate_options
    policy_state = models.JSONField(default=dict, blank=True)  # what a stateful policy carries between plans
    tp = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    batch_size = models.PositiveIntegerField(default=64, validators=[MinValueValidator(1)])
    group_size = models.PositiveIntegerField(default=16, validators=[MinValueValidator(1)])
    max_staleness = models.PositiveIntegerField(default=1)
    max_trajectory_tokens = models.PositiveIntegerField(default=32768, validators=[MinValueValidator(1)])
    rollout_gpus = models.PositiveIntegerField(default=0)  # max dedicated rollout GPUs (0 = all available)
    training_gpus = models.PositiveIntegerField(default=0)
    # sharing the cluster with other jobs (issue 35, core.arbiter): higher priority is served first, weight is
    # the fair share among equal priorities, min_rollout_gpus is guaranteed while it runs (checked at submission
    # against the reserved pool beside the other live jobs' guarantees)
    priority = models.IntegerField(default=0)
    weight = models.FloatField(default=1.0)
    min_rollout_gpus = models.PositiveIntegerField(default=0)
    # the arbiter's allotment: dedicated rollout GPUs the job may hold now (None: not arbitrated yet)
    allotted_rollout_gpus = models.PositiveIntegerField(null=True, blank=True)
    # why the arbiter's last division lent none of its idle training GPUs though it may lend ("": it lent, or
    # had none idle): `core.arbiter.Allotment.unlent`, for its status
    unlent_reason = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    mode = models.CharField(max_length=16, choices=choices(Mode), default=Mode.COLOCATED)
    n_prefill = models.PositiveIntegerField(default=0)
    n_decode = models.PositiveIntegerField(default=0)
    n_colocated = models.PositiveIntegerField(default=0)
    step = models.PositiveIntegerField(default=0)
    weight_version = models.PositiveIntegerField(default=0)
    training_active = models.BooleanField(default=False)  # the trainer is computing an update
    # borrowed workers the last Training Begin took back before its re-plan (the policy learns of them there)
    returned_at_training_begin = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    failure_reason = models.TextField(blank=True)
    status_reason = models.TextField(blank=True)  # why it is pending (what it waits for), for a person to act on
    remaining = models.PositiveIntegerField(null=True, blank=True)  # R from the rollout driver (None: no report yet)
    loop_state = models.JSONField(default=dict, blank=True)  # the rollout loop's checkpoint (core.loop)
    # environment "agent" (issue 19): agent_command / agent_function, agent_workdir, tasks, agent_timeout_s,
    # agent_concurrency as submitted (validated by core.agent_spec); the driver gets it in its JobView
    agent = models.JSONField(default=dict, blank=True)
    # exported checkpoints (issue 36, core.checkpoints): a Hugging Face directory every `checkpoint_every`
    # trainer updates and at stop, the newest `checkpoint_keep` kept (0: all), under `checkpoint_dir` (a path
    # the training node writes and the control plane reads: shared storage on several hosts)
    checkpoint_every = models.PositiveIntegerField(default=10, validators=[MinValueValidator(1)])
    checkpoint_keep = models.PositiveIntegerField(default=3)
    checkpoint_dir = models.CharField(max_length=1024, blank=True)
    init_from = models.CharField(max_length=1024, blank=True)  # the directory its policy starts from ("": model)
    # experiment trackers (issue 36, core.tracking_spec) and, per tracker, how far it logged and its last error
    tracking = models.JSONField(default=dict, blank=True)
    tracking_state = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return self.name

    @property
    def rollout_hardware(self) -> list[str]:
        """The chip types its rollout workers may run on (`hardware` alone unless it names several)."""
        return list(self.hardware_types) or [self.hardware]


class TrainingLend(models.Model):
    """Cross-job borrowing (issue 35): `gpus` of `owner`'s training GPUs, idle between its updates, serve
    `borrower`'s rollout until the owner's next Training Begin takes them back (`services.lending`). The
    cluster arbiter writes it; the borrower's planner starts workers on the lent GPUs (at most `gpus`), the
    owner's planner does not borrow them meanwhile."""

    owner = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="lends_out")
    borrower = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="lends_in")
    gpus = models.PositiveIntegerField()
    due = models.DateTimeField(null=True, blank=True)  # the owner's predicted Training Begin: back by then
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "borrower"], name="one_lend_per_job_pair")]

    def __str__(self) -> str:
        return f"{self.owner} → {self.borrower}: {self.gpus} GPUs"


class Checkpoint(models.Model):
    """An exported checkpoint of a job's policy (a Hugging Face directory, core.checkpoints), as the control
    plane found it complete under the job's checkpoint directory; gone once retention removed it."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()  # the rollout step whose trainer update produced it
    weight_version = models.PositiveIntegerField()
    written = models.DateTimeField()  # when the trainer finished writing it
    size_bytes = models.PositiveBigIntegerField(default=0)
    path = models.CharField(max_length=1100)
    files = models.JSONField(default=dict, blank=True)  # name -> bytes
    tokenizer = models.CharField(max_length=16, blank=True)  # "hf": the model directory's; "byte": the tiny model's
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["job_id", "step"]
        constraints = [models.UniqueConstraint(fields=["job", "step"], name="checkpoint_job_step")]


class Override(models.Model):
    """Manual policy overrides for a job; they always win over the decision engine."""

    job = models.OneToOneField(Job, on_delete=models.CASCADE, related_name="override")
    force_mode = models.CharField(max_length=16, choices=choices(Mode), blank=True)
    force_n_prefill = models.PositiveIntegerField(null=True, blank=True)
    force_n_decode = models.PositiveIntegerField(null=True, blank=True)
    # False: force_n_prefill:force_n_decode is a ratio scaled to the worker budget; True: exact worker counts
    force_exact = models.BooleanField(default=False)
    freeze = models.BooleanField(default=False)
    borrowing = models.BooleanField(default=True)
    elasticity = models.BooleanField(default=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    updated = models.DateTimeField(auto_now=True)


class Worker(models.Model):
    """w -> (G_w, R_w, a_w). `slot` is stable per job: survivors are never renumbered."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="workers")
    slot = models.PositiveIntegerField()
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="workers")
    zone = models.CharField(max_length=16, choices=choices(Zone))
    role = models.CharField(max_length=16, choices=choices(Role))
    activity = models.CharField(max_length=16, choices=choices(Activity), default=Activity.TRANSITIONING)
    engine = models.CharField(max_length=16, choices=choices(EngineKind))
    endpoint = models.CharField(max_length=200, blank=True)
    weight_version = models.PositiveIntegerField(default=0)
    generation = models.PositiveBigIntegerField(default=0)  # node generation at the last change
    inflight = models.PositiveIntegerField(default=0)
    alive = models.BooleanField(default=True)  # False once stopped (the row stays as history)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "slot", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "slot"], condition=Q(alive=True), name="worker_stable_slot"),
        ]

    def __str__(self) -> str:
        return f"{self.job.name}/w{self.slot}:{self.role}"


class WorkerGPU(models.Model):
    """G_w, with the database backstop of the GPU invariants.

    `kind` is rollout or training; `alive`/`active` mirror the worker. At most one alive worker of
    each kind per GPU (the overlap zone pairs one training and one rollout worker) and at most one
    active worker per GPU at all.
    """

    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="bindings")
    gpu = models.ForeignKey(GPU, on_delete=models.PROTECT, related_name="bindings")
    kind = models.CharField(max_length=16)
    alive = models.BooleanField(default=True)
    active = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "kind"], condition=Q(alive=True), name="gpu_one_alive_worker_per_kind"
            ),
            models.UniqueConstraint(fields=["gpu"], condition=Q(active=True), name="gpu_one_active_worker"),
        ]


class Decision(models.Model):
    """One run of the PD decision engine: inputs, every candidate, the choice and the gate."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="decisions")
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    signal = models.CharField(max_length=32)
    budget = models.JSONField(default=dict)
    profile = models.JSONField(default=dict)
    candidates = models.JSONField(default=list)
    mode = models.CharField(max_length=16, choices=choices(Mode))
    n_prefill = models.PositiveIntegerField(default=0)
    n_decode = models.PositiveIntegerField(default=0)
    n_colocated = models.PositiveIntegerField(default=0)
    borrow = models.PositiveIntegerField(default=0)
    predicted_makespan_s = models.FloatField(null=True, blank=True)
    expected_gain = models.FloatField(default=0.0)
    admitted = models.BooleanField(default=False)
    reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-created", "-id"]


class Transition(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="transitions")
    decision = models.ForeignKey(Decision, null=True, blank=True, on_delete=models.SET_NULL, related_name="transitions")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    plan = models.JSONField(default=dict)  # {"add": ..., "remove": ..., "reassign": ..., "cost": ...}
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    lease_owner = models.CharField(max_length=32, blank=True)  # the executor running it now
    lease_until = models.DateTimeField(null=True, blank=True)  # a crashed executor's lease runs out

    class Meta:
        ordering = ["-created", "-id"]


class TransitionStep(models.Model):
    """An ordered, idempotent step; `key` makes re-execution after a crash a no-op."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        SKIPPED = "skipped"

    transition = models.ForeignKey(Transition, on_delete=models.CASCADE, related_name="steps")
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=32)
    worker_slot = models.PositiveIntegerField(null=True, blank=True)
    args = models.JSONField(default=dict)
    key = models.CharField(max_length=128)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    started = models.DateTimeField(null=True, blank=True)
    finished = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["transition_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["transition", "index"], name="step_unique_index"),
            models.UniqueConstraint(fields=["transition", "key"], name="step_unique_key"),
        ]


class Event(models.Model):
    """Append-only timeline that outlives the processes."""

    created = models.DateTimeField(auto_now_add=True, db_index=True)
    kind = models.CharField(max_length=48, db_index=True)
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="events")
    actor = models.CharField(max_length=150, blank=True)  # user name, "agent:<node>", "system"
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise ValueError("events are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise ValueError("events are append-only")


class Trajectory(models.Model):
    """One finished agent trajectory of a step, as its rollout driver reported it (bounded: see
    `core.driver_link.TrajectorySummary`); what the job page's trajectory browser shows."""

    class Status(models.TextChoices):
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        ABORTED = "aborted"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="trajectories")
    step = models.PositiveIntegerField()
    name = models.CharField(max_length=128)  # the loop's trajectory id
    status = models.CharField(max_length=16, choices=Status.choices)
    reward = models.FloatField(null=True, blank=True)
    turns = models.PositiveIntegerField(default=0)
    forks = models.PositiveIntegerField(default=0)
    reason = models.TextField(blank=True)  # why it failed or was aborted
    stderr = models.TextField(blank=True)  # the tail of a failed agent's standard error
    messages = models.JSONField(default=list, blank=True)  # the chat, as the agent last sent it (+ the answer)
    tokens = models.JSONField(default=list, blank=True)  # every sample's token ids, concatenated
    mask = models.JSONField(default=list, blank=True)  # 1 = sampled by the policy (trained on), 0 = not
    logprobs = models.JSONField(default=list, blank=True)  # per token (0.0 where not sampled)
    sample_lens = models.JSONField(default=list, blank=True)  # tokens per sample (a fork starts a new one)
    token_count = models.PositiveIntegerField(default=0)  # before truncation
    truncated = models.BooleanField(default=False)  # tokens, mask and logprobs were cut to the bound
    weight_versions = models.JSONField(default=list, blank=True)  # per turn
    workers = models.JSONField(default=list, blank=True)  # the worker that served each turn
    latency_s = models.JSONField(default=list, blank=True)  # per turn
    # a done trajectory: true once the trainer's update that consumed it committed; false when it was left out
    # of its step's update (`reason` says why); null until its update commits, and where it does not apply
    trained = models.BooleanField(null=True, blank=True)
    # regenerated after a crash: it replaces a trajectory of its task that had started before its rollout
    # driver restarted and was lost with it (a finished one is never regenerated: it is recovered)
    rerun = models.BooleanField(default=False)
    resumed = models.BooleanField(default=False)  # continued from a kept prefix after a restart
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["step", "name"]
        constraints = [models.UniqueConstraint(fields=["job", "step", "name"], name="trajectory_job_step_name")]
        indexes = [models.Index(fields=["job", "step"], name="trajectory_job_step")]


class AgentCredential(models.Model):
    """A per-node agent token, stored as a SHA-256 hash; distinct from user API tokens. scope "bridge":
    a cluster bridge's own token (named node_name), which opens no agent link."""

    node_name = models.CharField(max_length=63, validators=[NAME_VALIDATOR], db_index=True)
    scope = models.CharField(max_length=8, default="node")  # node | bridge
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=8)
    created = models.DateTimeField(auto_now_add=True)
    revoked = models.DateTimeField(null=True, blank=True)
    last_used = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node_name", "-created"]


class TelemetrySample(models.Model):
    """A core TelemetryRecord as received from an agent or the rollout driver (input of the
    Runtime Tracker). Bounded retention: the sweeper keeps the newest ones per job."""

    created = models.DateTimeField(auto_now_add=True, db_index=True)
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE, related_name="telemetry")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.SET_NULL, related_name="telemetry")
    kind = models.CharField(max_length=32)
    record = models.JSONField()

    class Meta:
        ordering = ["-created", "-id"]
        indexes = [
            models.Index(fields=["job", "kind", "-created"], name="telemetry_job_kind"),
            models.Index(fields=["job", "kind", "-id"], name="telemetry_job_kind_id"),
        ]


class SimulationRun(models.Model):
    """A simulator comparison asked for from the dashboard: the scenario's policies on one seed, run by a
    Celery worker; `result` is `controlplane.sim.cli.compare_json` plus per-policy series for the charts."""

    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    scenario = models.CharField(max_length=64)
    seed = models.PositiveIntegerField(default=0)
    policies = models.JSONField(default=list, blank=True)  # empty: the scenario's own list
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    result = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)
    wall_s = models.FloatField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    finished = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.scenario} (seed {self.seed})"
