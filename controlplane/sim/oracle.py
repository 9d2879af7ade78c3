"""The oracle's choosing: an upper bound that chooses by *simulated* outcome, not by the predictor.

One oracle: `core.policies.OraclePolicy` (its trait `chooses_by_simulation`) carries the choices out —
PEARL's decision engine with no hysteresis, trial safeguard or gate, every choice coming in as the
context's overrides — and this module makes them.

At every signal that can change what the rollout runs on (step start, Training Finished, a capacity
change) while a step is in flight, the oracle forks the whole simulation state
(`copy.deepcopy`: engines, caches, in-flight requests, the loop, the future trace events already on
the heap) and, in each fork, applies one candidate — colocation or one of the best disaggregated
splits, with and without borrowing the idle training GPUs — then runs the fork until the step in
flight completes. It keeps the candidate whose step finishes first (ties: the current configuration,
then fewer reconfigured workers). Reconfiguration is free (as before) and new preemptible GPUs are
ready at once: the oracle knows the future, so it would have prepared them.

Candidates always include what PEARL's decision engine would pick at that moment (the predictor's
best split), so at every signal the oracle is at least as good as PEARL's choice *from the same
state*; `benchmarks/sim_report.py` checks PEARL ≤ oracle on every scenario rather than assuming it.

Within a fork the candidate's overrides stay in force for the rest of the step (later signals in the
fork re-fit the same mode/ratio to the budget), and forks never fork again. In the main run the last
choice stays in force until the next forking signal (a periodic tick does not re-choose). Cost: a
fork per candidate (≤ 4: colocation and the predictor's best split, each with and without borrowing)
per forking signal, each run to the end of the step in flight.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from controlplane.core.context import Overrides, Signal
from controlplane.core.decision import evaluate

Simulation = Any  # sim.cluster.Simulation (not imported: cluster imports this module)

SPLITS = 1  # best disaggregated splits tried per budget (by the predictor's ranking)
FORK_SIGNALS = (Signal.STEP_START, Signal.TRAINING_FINISHED, Signal.CAPACITY_CHANGE)


def candidates(sim: Simulation, signal: Signal) -> list[Overrides]:
    """Colocation and the best splits, each with and without borrowing (when anything is borrowable)."""
    inv = sim.world.inventory(sim.training_active)
    dedicated = sum(1 for u in inv.units if not u.overlap and not u.leaving)
    overlap = 0 if inv.training_active else sum(1 for u in inv.units if u.overlap and not u.leaving)
    borrow_opts = [False, True] if overlap > 0 and signal is not Signal.TRAINING_BEGIN else [False]
    fp = sim.policy.tracker.fitted()
    w, c = fp.workload, fp.coefficients
    if sim.world.mixed:
        return _mixed_candidates(sim, inv, borrow_opts, w)
    out: list[Overrides] = []
    for borrow in borrow_opts:
        n = dedicated + (overlap if borrow else 0)
        if n <= 0:
            continue
        out.append(Overrides(force_mode="colocated", borrowing=borrow))
        if n >= 2:
            t = evaluate(w, c, n)
            order = sorted(range(len(t.n_prefill)), key=lambda i: (not bool(t.feasible[i]), float(t.makespan_s[i])))
            for i in order[:SPLITS]:
                out.append(
                    Overrides(force_ratio=(int(t.n_prefill[i]), int(t.n_decode[i])), exact_ratio=True, borrowing=borrow)
                )
    return out


def _mixed_candidates(sim: Simulation, inv: Any, borrow_opts: list[bool], w: Any) -> list[Overrides]:
    """On a mixed pool: per borrow choice, the predictor's best candidate, the best on one chip type and every
    worker colocated (the baselines' configuration), as typed configurations (`force_configuration`)."""
    from controlplane.core.decision import best_homogeneous, evaluate_mixed
    from controlplane.core.placement import hardware_counts
    from controlplane.core.profiles import link_bytes_per_s

    ded = hardware_counts(inv.units)
    ovl = [u for u in inv.units if u.overlap and not u.leaving]
    tp = sim.tp
    co = {h: _coeffs(sim, h, w) for h in set(ded) | {u.hardware for u in ovl}}
    out: list[Overrides] = []
    for borrow in borrow_opts:
        pool = dict(ded)
        if borrow:
            for u in ovl:
                pool[u.hardware] = pool.get(u.hardware, 0) + 1
        cands = evaluate_mixed(w, co, pool, lambda a, b: link_bytes_per_s(a, b, tp))
        ok = sorted((x for x in cands if x.feasible), key=lambda x: x.makespan_s)
        picks = [ok[0]] if ok else []
        homo = best_homogeneous(cands)
        allcol = [x for x in cands if x.mode.value == "colocated" and x.n_colocated == sum(pool.values())]
        for x in [homo, *allcol[:1]]:
            if x is not None and all(x.configuration != p.configuration for p in picks):
                picks.append(x)
        out += [Overrides(force_configuration=x.label, borrowing=borrow) for x in picks]
    return out


def _coeffs(sim: Simulation, hardware: str, w: Any) -> Any:
    """The coefficients the policy plans with for one chip type (its per-type tracker, else the prior)."""
    trackers = getattr(sim.policy, "hw_trackers", None)
    if trackers is not None and hardware in trackers.by_type:
        return trackers.by_type[hardware].coefficients(w)[0]
    return sim.profile_for(hardware).coefficients(
        new_tokens=w.new_prompt_tokens, prefix=w.prefix_tokens, mean_context=w.mean_context
    )


def _ignore(record: Any) -> None:
    return None


def _fork(sim: Simulation) -> Simulation:
    # Share what is immutable or pure (the scenario, profiles, memoised engine costs, the drawn turn
    # specs) and the executor policy: in a fork every choice comes from the candidate's overrides and
    # the fork learns nothing (its telemetry is dropped), so the policy is only read there.
    memo: dict[int, Any] = {
        id(sim.sc): sim.sc,
        id(sim.profile): sim.profile,
        id(sim.costs): sim.costs,
        id(sim.trace): sim.trace,
        id(sim.policy): sim.policy,
        id(sim.train_profile): sim.train_profile,
        id(sim.overlap_costs): sim.overlap_costs,
        id(sim._profiles): sim._profiles,
        id(sim._costs): sim._costs,
    }
    for traj in sim.world.trajs.values():
        memo[id(traj.turns)] = traj.turns
    f = copy.deepcopy(sim, memo)
    f.in_fork = True
    f.record_timeline = False
    f.observe = _ignore
    f.world.observe = _ignore
    return f


def _outcome(sim: Simulation, ov: Overrides, signal: Signal, remaining: int, step: int) -> float:
    f = _fork(sim)
    f.overrides = ov
    f.signal(signal, remaining)
    st = f.loop.steps.get(step)
    horizon = f.sc.duration_s
    while st is not None and st.end_s <= 0 and f.heap and f.heap[0][0] <= horizon:
        f.advance(f.heap[0][0])
    return st.end_s if st is not None and st.end_s > 0 else math.inf


def choose(sim: Simulation, signal: Signal, remaining: int) -> Overrides | None:
    """The candidate whose in-flight step completes first (None: nothing to choose now)."""
    loop = sim.loop
    if signal not in FORK_SIGNALS or not loop.rollout_active or loop.step not in loop.steps:
        return None
    step = loop.step
    cands = candidates(sim, signal)
    if len(cands) <= 1:
        return cands[0] if cands else None
    best: tuple[float, int] | None = None
    pick: Overrides | None = None
    for k, ov in enumerate(cands):
        end = _outcome(sim, ov, signal, remaining, step)
        sim.oracle_forks += 1
        key = (round(end, 6), k)
        if best is None or key < best:
            best, pick = key, ov
    return pick


__all__ = ["candidates", "choose"]
