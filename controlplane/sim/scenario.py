"""Scenario files: cluster, model, workload, trace and duration of one simulated experiment.

Schema (YAML or JSON; documented with examples in `controlplane/sim/README.md`). Shipped scenarios
live in `controlplane/sim/scenarios/*.yaml`; their traces in `controlplane/sim/traces/*.csv`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from controlplane.core.batching import CHUNK_TOKENS
from controlplane.core.loop import MAX_STALENESS
from controlplane.core.policies import POLICY_NAMES
from controlplane.core.sharing import SHARING_NAMES
from controlplane.core.workload import WorkloadSpec
from controlplane.sim.traces import AvailabilityTrace, TraceError, load_trace

SIM_DIR = Path(__file__).resolve().parent
SCENARIO_DIR = SIM_DIR / "scenarios"
TRACE_DIR = SIM_DIR / "traces"


DEFAULT_POLICIES: tuple[str, ...] = POLICY_NAMES


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the file and the key."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    training_gpus: int = 16
    reserved_gpus: int = 4  # dedicated rollout GPUs, never preempted
    preemptible_gpus: int = 12  # cap on preemptible GPUs (the trace may not exceed reserved + this)
    hardware: str = "H800"  # the rollout pool's chip (reserved and preemptible GPUs)
    tp: int = 2
    # the training GPUs' chip ("" = `hardware`): the trainer's step time and the overlap rollout workers
    # borrowed from it run on it (e.g. an H20 elastic pool beside an H800 trainer, RollArt's split)
    training_hardware: str = ""
    # Mixed elastic pool (issue 23): the chip of each elastic TP group, by its place in the pool: the k-th
    # elastic unit is `elastic_hardware[k % len]` for life (a node keeps its chips; the trace takes the most
    # recently joined first, so the list's head is the most stable part). Empty: every elastic unit is
    # `hardware`.
    elastic_hardware: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.tp < 1 or self.training_gpus < 0 or self.reserved_gpus < self.tp or self.preemptible_gpus < 0:
            raise ScenarioError("cluster: need tp >= 1, reserved_gpus >= tp, training/preemptible >= 0")
        if isinstance(self.elastic_hardware, str) or not all(isinstance(h, str) for h in self.elastic_hardware):
            raise ScenarioError("cluster: elastic_hardware must be a list of chip names")
        object.__setattr__(self, "elastic_hardware", tuple(self.elastic_hardware))

    @property
    def chips(self) -> tuple[str, ...]:
        """Every chip type of the cluster (rollout pool, elastic pool, trainer), upper-case, sorted."""
        return tuple(
            sorted(
                {h.upper() for h in (self.hardware, self.training_hardware or self.hardware, *self.elastic_hardware)}
            )
        )

    @property
    def mixed(self) -> bool:
        """More than one chip type: the units name their hardware and the policies see a mixed pool."""
        return len(self.chips) > 1


@dataclass(frozen=True, slots=True)
class EngineSpec:
    chunk_tokens: int = CHUNK_TOKENS  # chunked-prefill token budget per iteration
    weight_sync_s: float = 3.0  # trainer -> rollout weight publication after each update
    periodic_s: float = 60.0  # PERIODIC re-evaluation tick while a batch is in flight
    return_deadline_s: float = 30.0  # borrowed GPUs must be back this long after Training Begin
    drain_timeout_s: float = 10.0  # a draining worker's leftover requests are then interrupted (partials kept)
    warmup_steps: int = 2  # steps excluded from throughput and predictor MAPE
    # Multiplier on every simulated iteration and prefill-pass time over the roofline profile
    # (serving-stack overheads the roofline omits). 1.0 = the core profile as is.
    engine_slowdown: float = 1.0
    # Prefix caches flushed at every weight update (SGLang's update_weights; RLBoost flush_cache=True)
    flush_cache_on_weight_update: bool = True
    # What-if only (no source; never set in a shipped scenario): multiplies the prefill time of a chunk
    # that carries running decodes on a colocated worker. 1.0 = the additive roofline, the calibrated model.
    mixed_prefill_penalty: float = 1.0
    # What-if only (never set in a shipped scenario): multiplies every KV hand-off's time (0: free, 2: twice).
    kv_transfer_scale: float = 1.0


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job of a multi-job scenario (`jobs:`): its model, trainer, workload and share of the cluster."""

    name: str
    model: str = "qwen3-8b"
    training_gpus: int = 8
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    arrival_s: float = 0.0
    priority: int = 0  # higher is served first (guarantees)
    weight: float = 1.0  # the fair share among equal priorities
    min_rollout_gpus: int = 0  # guaranteed while the job runs
    rollout_gpus: int = 1 << 20  # the job's maximum
    steps: int = 0  # the job ends after this many trainer updates (0: it runs to the scenario's end)
    max_staleness: int = 1  # as a live job's: 0 is on-policy (each rollout waits for the update before it)
    tp: int = 0  # its workers' TP (0: the cluster's); jobs of different TPs are divided in GPUs, as live

    def __post_init__(self) -> None:
        if min(self.training_gpus, self.min_rollout_gpus, self.rollout_gpus, self.arrival_s, self.steps, self.tp) < 0:
            raise ScenarioError(f"job {self.name}: training_gpus, *_rollout_gpus, arrival_s, steps, tp must be >= 0")
        if self.tp and (self.training_gpus % self.tp or self.min_rollout_gpus % self.tp):
            raise ScenarioError(
                f"job {self.name}: training_gpus and min_rollout_gpus must be multiples of tp={self.tp}"
            )
        _check_staleness(self.max_staleness, f"job {self.name}")
        if not self.weight > 0:
            raise ScenarioError(f"job {self.name}: weight must be > 0")
        if self.min_rollout_gpus > self.rollout_gpus:
            raise ScenarioError(f"job {self.name}: min_rollout_gpus > rollout_gpus")


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str = ""
    model: str = "qwen3-8b"
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    engine: EngineSpec = field(default_factory=EngineSpec)
    trace: AvailabilityTrace = field(default_factory=lambda: AvailabilityTrace((0.0,), (4,)))
    duration_s: float = 7200.0
    seed: int = 0
    fixed_large_gpus: int | None = None  # ROLL-Large pool; default: trace mean rounded up to TP
    policies: tuple[str, ...] = DEFAULT_POLICIES
    policy_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # per policy name (or variant)
    # variant name -> base policy, or {base, overrides, gate, options} (ablation; sim.adapters.parse_variant)
    variants: dict[str, str | dict[str, Any]] = field(default_factory=dict)
    paper: dict[str, Any] = field(default_factory=dict)  # the paper's figures for this scenario
    # several jobs sharing `cluster` and `trace` (issue 35; `sim.multi`); empty: the one-job form above
    jobs: tuple[JobSpec, ...] = ()
    max_staleness: int = 1  # the one-job form's (a job of `jobs` has its own): 0 is on-policy

    @property
    def large_pool_gpus(self) -> int:
        if self.fixed_large_gpus is not None:
            return self.fixed_large_gpus
        tp = self.cluster.tp
        return int(math.ceil(self.trace.mean(self.duration_s) / tp - 1e-9)) * tp

    def with_seed(self, seed: int) -> Scenario:
        return replace(self, seed=seed)


def _check_staleness(value: Any, where: str) -> None:
    """A live job's bound (the API's): an integer from 0 (on-policy) to MAX_STALENESS versions behind."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_STALENESS:
        raise ScenarioError(f"{where}: max_staleness must be an integer from 0 to {MAX_STALENESS}, not {value!r}")


def _dataclass_from(cls: type, data: Any, where: str) -> Any:
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: must be a mapping")
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ScenarioError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(names)}")
    try:
        return cls(**data)
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{where}: {exc}") from None


def _trace_from(spec: Any, base: Path, where: str) -> AvailabilityTrace:
    if isinstance(spec, str):
        spec = {"file": spec}
    if not isinstance(spec, dict):
        raise ScenarioError(f"{where}: must be a file name or a mapping")
    if "file" in spec:
        p = Path(spec["file"])
        candidates = [p] if p.is_absolute() else [base / p, TRACE_DIR / p, Path.cwd() / p]
        scale = spec.get("scale", 1)
        if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
            raise ScenarioError(f"{where}: scale must be an integer >= 1")
        for c in candidates:
            if c.exists():
                try:
                    tr = load_trace(c)
                except TraceError as exc:
                    raise ScenarioError(str(exc)) from None
                # a larger cluster's pool with the same shape: every row's GPUs times `scale`
                if scale == 1:
                    return tr
                return AvailabilityTrace(tr.times, tuple(g * scale for g in tr.gpus), name=f"{tr.name}x{scale}")
        raise ScenarioError(f"{where}: trace file {spec['file']!r} not found")
    if "constant_gpus" in spec:
        g = int(spec["constant_gpus"])
        return AvailabilityTrace((0.0,), (g,), name=f"constant-{g}")
    if "points" in spec:
        pts = spec["points"]
        try:
            return AvailabilityTrace(tuple(float(p[0]) for p in pts), tuple(int(p[1]) for p in pts), name="inline")
        except (TypeError, ValueError, IndexError) as exc:
            raise ScenarioError(f"{where}: bad points: {exc}") from None
    raise ScenarioError(f"{where}: give one of file, constant_gpus, points")


def _jobs_from(spec: Any, source: str) -> tuple[JobSpec, ...]:
    if spec is None:
        return ()
    if not isinstance(spec, list) or not spec:
        raise ScenarioError(f"{source}: jobs must be a non-empty list")
    out: list[JobSpec] = []
    for i, item in enumerate(spec):
        where = f"{source}: jobs[{i}]"
        if not isinstance(item, dict) or "name" not in item:
            raise ScenarioError(f"{where}: must be a mapping with a name")
        item = dict(item)
        item["workload"] = _dataclass_from(WorkloadSpec, item.get("workload"), f"{where}: workload")
        out.append(_dataclass_from(JobSpec, item, where))
    names = [j.name for j in out]
    if len(set(names)) != len(names):
        raise ScenarioError(f"{source}: job names must be unique")
    return tuple(out)


def scenario_from_dict(data: dict[str, Any], *, base: Path = SCENARIO_DIR, source: str = "<scenario>") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario must be a mapping")
    known = {
        "name",
        "description",
        "model",
        "cluster",
        "workload",
        "engine",
        "trace",
        "duration_s",
        "seed",
        "fixed_large_gpus",
        "policies",
        "policy_options",
        "variants",
        "paper",
        "jobs",
        "max_staleness",
    }
    # keys starting with "x-" hold YAML anchors shared by the jobs (as in compose files) and are ignored
    unknown = {k for k in set(data) - known if not str(k).startswith("x-")}
    if unknown:
        raise ScenarioError(f"{source}: unknown keys {sorted(unknown)}")
    if "name" not in data:
        raise ScenarioError(f"{source}: 'name' is required")
    cluster = _dataclass_from(ClusterSpec, data.get("cluster"), f"{source}: cluster")
    trace = _trace_from(data.get("trace", {"constant_gpus": cluster.reserved_gpus}), base, f"{source}: trace")
    max_g = cluster.reserved_gpus + cluster.preemptible_gpus
    if max(trace.gpus) > max_g:
        raise ScenarioError(f"{source}: trace reaches {max(trace.gpus)} GPUs > reserved + preemptible = {max_g}")
    if min(trace.gpus) < cluster.reserved_gpus:
        raise ScenarioError(f"{source}: trace drops below the {cluster.reserved_gpus} reserved GPUs")
    variants = data.get("variants") or {}
    jobs = _jobs_from(data.get("jobs"), source)
    max_staleness = data.get("max_staleness", 1)
    _check_staleness(max_staleness, source)
    policies = tuple(data.get("policies") or (SHARING_NAMES if jobs else DEFAULT_POLICIES))
    if jobs:
        bad = [p for p in policies if p not in SHARING_NAMES]
        if bad:
            raise ScenarioError(f"{source}: multi-job policies are {', '.join(SHARING_NAMES)}; not {bad}")
    try:
        return Scenario(
            name=str(data["name"]),
            description=str(data.get("description", "")),
            model=str(data.get("model", "qwen3-8b")),
            cluster=cluster,
            workload=_dataclass_from(WorkloadSpec, data.get("workload"), f"{source}: workload"),
            engine=_dataclass_from(EngineSpec, data.get("engine"), f"{source}: engine"),
            trace=trace,
            duration_s=float(data.get("duration_s", 7200.0)),
            seed=int(data.get("seed", 0)),
            fixed_large_gpus=data.get("fixed_large_gpus"),
            policies=policies,
            policy_options=dict(data.get("policy_options") or {}),
            variants=dict(variants),
            paper=dict(data.get("paper") or {}),
            jobs=jobs,
            max_staleness=max_staleness,
        )
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{source}: {exc}") from None


def load_scenario_file(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ScenarioError(f"{p}: cannot read ({exc.strerror})") from None
    try:
        data = json.loads(text) if p.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ScenarioError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'YAML'}: {exc}") from None
    return scenario_from_dict(data, base=p.parent, source=str(p))


def list_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def get_scenario(name: str) -> Scenario:
    p = SCENARIO_DIR / f"{name}.yaml"
    if not p.exists():
        raise ScenarioError(f"unknown scenario {name!r}; known: {', '.join(list_scenarios())}")
    return load_scenario_file(p)
