"""Agentic multi-turn workload: SWE-bench-like trajectories for one rollout batch.

One definition for the simulator's batches and the live `swe-like` environment (`agents.envs.swe_like`).

A trajectory is a sequence of turns. Each turn appends new prompt tokens (the first turn: system
prompt + issue, shared by the trajectories of one GRPO group; later turns: the tool observation),
then the policy model generates a response, then the environment runs the tool call for a
heavy-tailed time. A trajectory stops when the agent is done (its drawn turn count) or when its
context reaches the maximum trajectory length (the last response is truncated to fit).

Why pre-drawn: every policy sees the very same batch for a given (seed, step), so a comparison
between policies is paired and deterministic.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Parameters of the agentic workload (scenario file: `workload:`)."""

    batch_size: int = 64  # B trajectories per rollout batch
    group_size: int = 16  # GRPO group: trajectories sharing the first prompt
    max_length: int = 32768  # max trajectory length (prompt + responses), tokens
    turns_mean: float = 30.0  # mean agent turns it wants; most trajectories hit the 32K cap first
    turns_max: int = 50
    first_prompt_tokens: int = 2500  # system prompt + issue
    observation_tokens_mean: float = 1100.0  # ΔL of later turns (tool output), log-normal
    observation_sigma: float = 0.9
    response_tokens_mean: float = 900.0  # r per turn (reasoning + tool call), log-normal
    response_sigma: float = 0.7
    env_latency_median_s: float = 1.2  # environment (tool) latency, log-normal body
    env_latency_sigma: float = 0.8
    env_tail_prob: float = 0.04  # Pareto tail: test runs, builds
    env_tail_scale_s: float = 8.0
    env_tail_alpha: float = 1.6
    env_latency_cap_s: float = 300.0
    # Fraction of a trajectory's previous context an engine may reuse from its prefix cache on the
    # next turn: 1.0 = append-only history (the predictor's model: a turn prefills ΔL new tokens).
    # Lower values model agents whose history processors rewrite old observations. Whether the
    # prefix is still resident is decided by the engine's KV pressure (see cluster._route).
    prefix_reuse: float = 1.0

    def __post_init__(self) -> None:
        if self.batch_size < 1 or self.group_size < 1:
            raise ValueError("batch_size and group_size must be >= 1")
        if self.max_length < self.first_prompt_tokens + 16:
            raise ValueError("max_length must exceed the first prompt")
        if self.turns_mean < 1 or self.turns_max < 1:
            raise ValueError("turns must be >= 1")


@dataclass(frozen=True, slots=True)
class TurnSpec:
    new_prompt_tokens: int  # ΔL of this turn
    generated_tokens: int  # r of this turn
    env_latency_s: float  # environment time after this turn (0 after the last)


@dataclass(slots=True)
class Trajectory:
    """One trajectory of a rollout batch and its progress (partial progress survives preemption)."""

    tid: str
    step: int
    group: int
    turns: tuple[TurnSpec, ...]
    # progress
    turn: int = 0  # index of the turn being served / next turn
    generated_in_turn: int = 0  # tokens of the current turn's response already generated
    context: int = 0  # tokens in the context so far (prompt + responses of finished turns + partial)
    done: bool = False
    cached_on: int | None = None  # worker slot holding this trajectory's prefix (KV) cache
    cached_gen: int = -1  # that worker's generation (a re-created slot has an empty cache)
    cached_len: int = 0  # tokens of this trajectory's context in that cache
    cached_epoch: int = 0  # weight epoch of that cache (a weight update flushes it)
    where: int | None = None  # worker slot holding this trajectory's request now (-1: on a KV link)
    turn_start_s: float = 0.0
    prefilled_total: int = 0  # prompt tokens engines actually prefilled (not served from a cache)
    prefilled_in_turn: int = 0
    home: int | None = None  # sticky worker (colocated) or prefill worker (disaggregated)
    start_s: float = 0.0
    end_s: float = 0.0
    gen_time_s: float = 0.0  # time spent being served (queue + prefill + decode)
    env_time_s: float = 0.0
    interruptions: int = 0
    generated_total: int = 0  # tokens generated into this trajectory's sample
    prompt_total: int = 0  # prompt tokens appended (first prompt + observations)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.prompt_total + self.generated_total


def _lognormal(rng: random.Random, mean: float, sigma: float) -> float:
    mu = math.log(mean) - 0.5 * sigma * sigma
    return rng.lognormvariate(mu, sigma)


def draw_batch(spec: WorkloadSpec, *, seed: int, step: int) -> list[Trajectory]:
    """Draw the B trajectories of rollout batch `step` (deterministic in (seed, step))."""
    return [Trajectory(tid=tid, step=step, group=g, turns=turns) for tid, g, turns in _draw_specs(spec, seed, step)]


@lru_cache(maxsize=512)
def _draw_specs(spec: WorkloadSpec, seed: int, step: int) -> tuple[tuple[str, int, tuple[TurnSpec, ...]], ...]:
    """The immutable part of a batch, cached: every policy of a comparison draws the same batches."""
    out: list[tuple[str, int, tuple[TurnSpec, ...]]] = []
    rng = random.Random(hash_seed(seed, step))
    n_groups = max(1, math.ceil(spec.batch_size / spec.group_size))
    for g in range(n_groups):
        # Task difficulty is shared by the group (same issue): it scales the turn count.
        difficulty = _lognormal(rng, 1.0, 0.35)
        for j in range(spec.group_size):
            idx = g * spec.group_size + j
            if idx >= spec.batch_size:
                break
            n_turns = min(
                spec.turns_max,
                max(
                    1,
                    round(
                        rng.expovariate(1.0) * 0.6 * spec.turns_mean * difficulty + 0.4 * spec.turns_mean * difficulty
                    ),
                ),
            )
            turns: list[TurnSpec] = []
            ctx = 0
            for k in range(n_turns):
                new = (
                    spec.first_prompt_tokens
                    if k == 0
                    else max(16, int(_lognormal(rng, spec.observation_tokens_mean, spec.observation_sigma)))
                )
                if ctx + new >= spec.max_length - 1:
                    break
                gen = max(8, int(_lognormal(rng, spec.response_tokens_mean, spec.response_sigma)))
                gen = min(gen, spec.max_length - ctx - new)
                ctx += new + gen
                if rng.random() < spec.env_tail_prob:
                    env = spec.env_tail_scale_s * (rng.paretovariate(spec.env_tail_alpha))
                else:
                    env = rng.lognormvariate(math.log(spec.env_latency_median_s), spec.env_latency_sigma)
                turns.append(TurnSpec(new, gen, min(env, spec.env_latency_cap_s)))
                if ctx >= spec.max_length - 1:
                    break
            last = turns[-1]
            turns[-1] = TurnSpec(last.new_prompt_tokens, last.generated_tokens, 0.0)
            out.append((f"s{step}-t{idx}", g, tuple(turns)))
    return tuple(out)


def hash_seed(seed: int, step: int) -> int:
    """A stable (not Python-hash-randomised) per-step seed."""
    return (seed * 1_000_003 + step * 7_919 + 12_345) & 0xFFFFFFFF
