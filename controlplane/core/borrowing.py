"""Intra-scale borrowing of training GPUs (paper §6, Eq. 7) and the return deadline.

Borrow iff (R/B)·(T_ded − T_full) > T_toggle: the remaining fraction R/B of the batch would finish
T_ded − T_full sooner with every overlap worker, and that must pay for one activation plus one
return. T_toggle is an EMA of observed toggle costs, seeded from paper Table 3. Return is mandatory
at Training Begin; deactivation must finish before the trainer needs its GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.core.profiles import ReconfigCosts


@dataclass(frozen=True, slots=True)
class GateResult:
    admit: bool
    benefit_s: float  # (R/B)·(T_ded − T_full)
    toggle_s: float  # T_toggle used
    remaining: int
    batch_size: int
    t_dedicated_s: float
    t_full_s: float
    reason: str


def gate(*, remaining: int, batch_size: int, t_dedicated_s: float, t_full_s: float, toggle_s: float) -> GateResult:
    """Eq. 7: (R/B)·(T_ded − T_full) > T_toggle."""
    if batch_size <= 0:
        return GateResult(False, 0.0, toggle_s, remaining, batch_size, t_dedicated_s, t_full_s, "empty batch")
    frac = max(0, min(remaining, batch_size)) / batch_size
    benefit = frac * (t_dedicated_s - t_full_s)
    admit = benefit > toggle_s
    verb = "borrow" if admit else "do not borrow"
    reason = (
        f"{verb}: (R/B)·(T_ded − T_full) = {remaining}/{batch_size}·({t_dedicated_s:.1f} − {t_full_s:.1f}) "
        f"= {benefit:.1f} s {'>' if admit else '≤'} T_toggle {toggle_s:.1f} s"
    )
    return GateResult(admit, benefit, toggle_s, remaining, batch_size, t_dedicated_s, t_full_s, reason)


class ToggleCostEstimator:
    """T_toggle as an EMA of observed activation + return costs, seeded from Table 3.

    alpha = 0.3: about three observations move the estimate most of the way, so a too-high seed
    (the paper's 8B/4-GPU gate regression) is corrected within one or two training steps.
    """

    def __init__(self, seed: ReconfigCosts | float, alpha: float = 0.3) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError("alpha must be in (0, 1]")
        seed_s = seed.toggle_s if isinstance(seed, ReconfigCosts) else float(seed)
        if seed_s < 0:
            raise ValueError("toggle cost must be >= 0")
        self.alpha = alpha
        self._value = seed_s
        self.samples = 0

    @property
    def value(self) -> float:
        return self._value

    def observe(self, activation_s: float, return_s: float) -> float:
        cost = max(0.0, activation_s) + max(0.0, return_s)
        self._value = (1.0 - self.alpha) * self._value + self.alpha * cost
        self.samples += 1
        return self._value


@dataclass(frozen=True, slots=True)
class ReturnDeadline:
    """When the return of borrowed workers must start so the trainer is not delayed."""

    training_begin_s: float
    deactivation_s: float
    start_by_s: float  # latest moment to start deactivating
    missed: bool  # now > start_by: the trainer will wait
    delay_s: float  # how long the trainer waits if the return starts now


def return_deadline(
    *, training_begin_s: float, deactivation_s: float, now_s: float | None = None, margin_s: float = 0.0
) -> ReturnDeadline:
    """Return must finish by Training Begin: start by training_begin − deactivation − margin."""
    start_by = training_begin_s - max(0.0, deactivation_s) - max(0.0, margin_s)
    now = start_by if now_s is None else now_s
    delay = max(0.0, now + max(0.0, deactivation_s) - training_begin_s)
    return ReturnDeadline(training_begin_s, deactivation_s, start_by, now > start_by + 1e-12, delay)


__all__ = ["GateResult", "ReturnDeadline", "ToggleCostEstimator", "gate", "return_deadline"]
