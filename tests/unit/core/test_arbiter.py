"""The cluster arbiter (issue 35): guarantees by priority, weighted shares, caps, hysteresis, lending."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from controlplane.core.arbiter import (
    Allotment,
    ArbiterConfig,
    Idle,
    JobDemand,
    arbitrate,
    fair_shares,
    lend_saving,
)
from controlplane.core.sharing import split_fcfs, split_rlix, split_static


def amdahl(serial: float = 20.0, work: float = 1200.0):
    """A step-time curve with diminishing returns: serial + work / n."""
    return lambda n: math.inf if n <= 0 else serial + work / n


def job(name: str, **kw) -> JobDemand:
    kw.setdefault("max_units", 64)
    kw.setdefault("step_time", amdahl())
    return JobDemand(name=name, **kw)


def test_equal_jobs_get_equal_shares_and_the_pool_is_used():
    a = arbitrate(12, [job("A"), job("B"), job("C")])
    assert dict(a.units) == {"A": 4, "B": 4, "C": 4}


def test_weights_set_the_shares():
    a = arbitrate(12, [job("A", weight=2.0), job("B", weight=1.0)])
    assert a.units["A"] == 8 and a.units["B"] == 4


def test_maximum_is_never_exceeded_and_the_rest_goes_elsewhere():
    a = arbitrate(12, [job("A", max_units=2), job("B")])
    assert a.units["A"] == 2 and a.units["B"] == 10


def test_a_tp2_job_counted_in_gpus_gets_its_fair_share():
    """Jobs of different TPs are divided in units of one GPU: a TP2 job's odd GPU buys nothing alone, its next
    two do. It got 2 of 8 GPUs (one worker) beside a TP1 job before the arbiter looked past the flat unit."""
    tp2 = amdahl()

    def workers_of_two(n: int) -> float:
        return tp2(n // 2)

    a = arbitrate(8, [job("tp1", max_units=8), job("tp2", max_units=8, step_time=workers_of_two, arrival_s=1)])
    assert dict(a.units) == {"tp1": 4, "tp2": 4}


def test_a_jagged_curve_never_makes_a_unit_worth_less_than_nothing():
    """The predictor's raw curve may rise at a size (its mode or P:D choice there): n + 1 units are never
    slower than n (one can stand idle), so the job is not stopped below the sizes that help it."""
    raw = {1: 900.0, 2: 500.0, 3: 560.0, 4: 300.0, 5: 280.0}

    def jagged(n: int) -> float:
        return math.inf if n <= 0 else raw.get(n, 270.0)

    a = arbitrate(8, [job("jagged", step_time=jagged), job("smooth", step_time=amdahl(serial=200.0, work=100.0))])
    assert a.units["jagged"] >= 4


def test_a_job_at_its_share_gives_the_units_it_gains_nothing_from():
    """Held at its fair share, a job whose trainer bounds its step (flat from 1 unit) keeps one unit and gives the
    rest to a job that gains from them; a job that gains keeps its share (the fair share protects only what is
    worth something to its holder)."""
    flat = job("flat", step_time=lambda n: math.inf if n <= 0 else 500.0)
    prev = Allotment({"flat": 4, "gains": 4})
    a = arbitrate(8, [flat, job("gains")], prev)
    assert dict(a.units) == {"flat": 1, "gains": 7}
    b = arbitrate(8, [job("A"), job("gains")], prev)
    assert dict(b.units) == {"A": 4, "gains": 4}


def test_a_job_its_predictor_has_not_measured_keeps_its_share_whatever_its_prior_says():
    """A prior can be off by several times (sim draw 105, 8 jobs: a 2,048-trajectory job's prior put its rollout
    under its update, so it gave its share away and got 0.78 of its static throughput). Until its predictor
    has measured it, a job keeps its fair share and is served first when units come free."""
    flat = job("new", step_time=lambda n: math.inf if n <= 0 else 500.0, measured=False)
    prev = Allotment({"new": 4, "gains": 4})
    assert dict(arbitrate(8, [flat, job("gains")], prev).units) == {"new": 4, "gains": 4}
    grown = arbitrate(12, [flat, job("gains")], Allotment({"new": 2, "gains": 4}))
    assert grown.units["new"] == 6  # up to its share of the larger pool, first
    # measured, the same curve gives its units away (the test above)
    assert arbitrate(8, [replace(flat, measured=True), job("gains")], prev).units["new"] == 1


def test_guarantees_first_by_priority():
    # 6 units: the high-priority job's guarantee of 5 is met before the low one's of 4
    jobs = [job("low", min_units=4, priority=0, arrival_s=0), job("high", min_units=5, priority=1, arrival_s=10)]
    a = arbitrate(6, jobs)
    assert a.units["high"] >= 5
    assert a.units["low"] == 6 - a.units["high"]
    assert any("guarantee" in e and "low" in e for e in a.explanation)


def test_guarantee_takes_from_a_lower_priority_holder():
    prev = Allotment({"low": 8})
    a = arbitrate(8, [job("low", arrival_s=0), job("high", priority=1, min_units=3, arrival_s=5)], prev)
    assert a.units["high"] >= 3 and a.units["low"] + a.units["high"] == 8


def test_a_saturated_job_gives_way():
    # B gains nothing beyond 2 units (its trainer is the bottleneck): A takes the rest
    flat = lambda n: math.inf if n <= 0 else max(100.0, 400.0 / n)
    a = arbitrate(12, [job("A"), job("B", step_time=flat)])
    assert a.units["B"] <= 4 and a.units["A"] >= 8


def test_a_move_is_gated_by_its_cost():
    # 8/4 is off the 6/6 optimum; without costs or hysteresis it is corrected, but a move reloads weights
    # and loses KV caches: a move whose cost its gain does not pay back is not made
    prev = Allotment({"A": 8, "B": 4})
    free = ArbiterConfig(hysteresis=0.0, payback_steps=1.0)
    assert dict(arbitrate(12, [job("A"), job("B")], prev, config=free).units) == {"A": 6, "B": 6}
    costly = [job("A", reload_s=3000.0, kv_loss_s=200.0), job("B", reload_s=3000.0, kv_loss_s=200.0)]
    a = arbitrate(12, costly, prev, config=free)
    assert dict(a.units) == {"A": 8, "B": 4}
    assert not a.changed


def test_no_flapping_over_repeated_events():
    jobs = [job("A", reload_s=30.0), job("B", reload_s=30.0), job("C", reload_s=30.0)]
    a = arbitrate(13, jobs, reason="start")
    seen = [dict(a.units)]
    for i in range(10):
        a = arbitrate(13, jobs, a, reason=f"tick {i}")
        seen.append(dict(a.units))
    assert all(s == seen[0] for s in seen)


def test_a_large_imbalance_is_corrected_despite_costs():
    prev = Allotment({"A": 11, "B": 1})
    a = arbitrate(12, [job("A", reload_s=60.0), job("B", reload_s=60.0)], prev, reason="rebalance")
    assert a.units["B"] >= 4


def test_arrival_explanation_text():
    prev = arbitrate(6, [job("A", arrival_s=0)], reason="job A arrived")
    assert prev.explanation == ("job A arrived: A 0→6",)
    a = arbitrate(6, [job("A", arrival_s=0), job("B", arrival_s=100)], prev, reason="job B arrived")
    assert a.explanation == ("job B arrived: A 6→3, B 0→3",)


def test_job_end_frees_its_units():
    prev = Allotment({"A": 3, "B": 3})
    a = arbitrate(6, [job("A")], prev, reason="job B ended")
    assert a.units == {"A": 6}
    assert a.explanation == ("job B ended: B 3→0, A 3→6",)


def test_pool_shrink_takes_cheapest_first_and_keeps_guarantees():
    prev = Allotment({"A": 6, "B": 6})
    a = arbitrate(8, [job("A", min_units=5), job("B")], prev)
    assert a.units["A"] >= 5 and sum(a.units.values()) == 8


def test_idle_training_units_are_lent_until_the_owners_training_begin():
    now = 100.0
    owner = job("A", lendable_units=4, training_begin_s=now + 600.0, deactivation_s=3.0)
    borrower = job("B", reload_s=50.0)
    a = arbitrate(4, [owner, borrower], now_s=now)
    lent = a.borrowed("B")
    assert lent > 0 and a.lent("A") == lent and a.total("B") == a.units["B"] + lent
    assert a.unlent == {}  # it lends: nothing to explain
    assert all(x.due_s == owner.training_begin_s for x in a.lends)
    # the owner's Training Begin: it is training now, nothing of it is lent any more
    back = arbitrate(4, [job("A", training=True), borrower], a, now_s=now + 600.0, reason="A Training Begin")
    assert back.lends == ()
    assert back.explanation and f"B {a.total('B')}→{back.units['B']}" in back.explanation[0]


def test_a_lend_between_jobs_of_different_tps_moves_whole_workers_of_both():
    """In GPU units: a TP2 owner's training units (2 each) lent to a TP1 job move 2 at a time; a TP1 owner's to a
    TP2 job too (two of its units hold one TP2 worker), and an odd one left over is not lent."""
    now = 0.0
    tp2_owner = job("A", lendable_units=4, training_begin_s=now + 600.0, worker_units=2)
    a = arbitrate(4, [tp2_owner, job("B", reload_s=10.0)], now_s=now)
    assert a.lent("A") > 0 and all(x.units % 2 == 0 for x in a.lends)

    def workers_of_two(n: int) -> float:
        return amdahl()(n // 2)

    tp1_owner = job("A", lendable_units=3, training_begin_s=now + 600.0)
    tp2 = job("B", reload_s=10.0, worker_units=2, step_time=workers_of_two)
    b = arbitrate(4, [tp1_owner, tp2], now_s=now)
    assert b.lent("A") == 2  # one TP2 worker; the third unit alone holds none
    # one idle unit holds no TP2 worker: nothing is lent, and the owner's status says why
    c = arbitrate(4, [replace(tp1_owner, lendable_units=1), tp2], now_s=now)
    assert c.lends == () and c.unlent["A"].endswith("B's workers need 2 of its units on one lend, it has 1 idle")
    # a TP2 job holding an odd GPU it cannot use (3 of 4) still borrows a whole worker up to its maximum
    odd = arbitrate(3, [replace(tp1_owner, max_units=0), replace(tp2, max_units=4)], now_s=now)
    assert odd.units["B"] == 3 and odd.lent("A") == 2


def test_a_larger_borrowers_lend_needs_the_owners_idle_units_side_by_side_on_one_node():
    """Where its idle units lie: a TP1 owner's 4 idle units make two TP2 workers only if pairs of them share a
    node; on four nodes, none, and its status says so; a TP1 borrower beside them takes what is left."""
    now = 0.0

    def workers_of_two(n: int) -> float:
        return amdahl()(n // 2)

    tp2 = job("B", reload_s=10.0, worker_units=2, step_time=workers_of_two)
    paired = job("A", lendable_units=4, training_begin_s=now + 600.0, lendable_groups={2: 2})
    assert arbitrate(4, [paired, tp2], now_s=now).lent("A") == 4
    one_pair = arbitrate(4, [replace(paired, lendable_groups={2: 1}), tp2], now_s=now)
    assert one_pair.lent("A") == 2 and [x.borrower for x in one_pair.lends] == ["B"]
    spread = arbitrate(4, [replace(paired, lendable_groups={2: 0}), tp2], now_s=now)
    assert spread.lends == ()
    assert spread.unlent["A"].endswith(
        "B's workers need 2 of its units side by side on one node; its 4 idle ones are not"
    )
    # a TP1 borrower fills single units wherever they are
    tp1 = job("C", reload_s=10.0)
    mixed = arbitrate(6, [replace(paired, lendable_groups={2: 0}), tp2, tp1], now_s=now)
    assert mixed.lent("A") > 0 and {x.borrower for x in mixed.lends} == {"C"}
    with pytest.raises(ValueError, match="lendable groups"):
        replace(paired, lendable_groups={2: -1})


def test_no_lend_when_the_window_cannot_pay_for_the_reload():
    now = 0.0
    owner = job("A", lendable_units=4, training_begin_s=now + 40.0, deactivation_s=3.0)
    a = arbitrate(4, [owner, job("B", reload_s=50.0)], now_s=now)
    assert a.lends == ()
    # what the owner's status says: its window (40 s less the 3 s return and the 5 s margin) ends before B's reload does
    assert a.unlent == {
        "A": "no lend pays in the 32 s before its return must start: B would save 0 s of its step before the "
        "return, less than the 53 s the lend costs (50 s B's reload, 3 s the return)"
    }
    # a job at its maximum is named as such (the owner rolls out on none of the pool: B holds all of it)
    full = arbitrate(4, [replace(owner, max_units=0), job("B", reload_s=50.0, max_units=4)], now_s=now)
    assert full.unlent["A"] == "no lend pays in the 32 s before its return must start: B at its maximum"


def test_a_lend_pays_for_its_reload_and_the_owners_return():
    # 100 s until the return must start, 20 s of them reloading: the unit serves 80 s of the borrower's 100 s
    # makespan, which one more unit cuts to 60 s: 40 s · 80/100 = 32 s saved, less the 20 s reload and the 2 s return
    assert lend_saving(
        window_s=100.0, reload_s=20.0, deactivation_s=2.0, makespan_s=100.0, makespan_more_s=60.0
    ) == pytest.approx(10.0)
    assert lend_saving(window_s=100.0, reload_s=20.0, deactivation_s=2.0, makespan_s=100.0, makespan_more_s=80.0) < 0
    assert lend_saving(window_s=20.0, reload_s=20.0, deactivation_s=0.0, makespan_s=100.0, makespan_more_s=0.0) < 0


def test_a_job_never_borrows_its_own_units_through_the_arbiter():
    a = arbitrate(2, [job("A", lendable_units=4, training_begin_s=1e6)], now_s=0.0)
    assert a.lends == ()


def test_bad_demands_are_refused():
    with pytest.raises(ValueError):
        job("A", weight=0.0)
    with pytest.raises(ValueError):
        job("A", min_units=-1)


def test_fair_shares_water_fill():
    assert fair_shares(10, [job("A", max_units=2), job("B"), job("C")]) == {"A": 2, "B": 4, "C": 4}


def test_baselines():
    jobs = [job("A", arrival_s=0, outstanding=60), job("B", arrival_s=5, outstanding=20)]
    assert split_static(10, ["A", "B", "C"], jobs) == {"A": 4, "B": 3}
    assert split_fcfs(10, jobs, {"A": 10}) == {"A": 10, "B": 0}
    assert split_fcfs(10, jobs, {}) == {"A": 10, "B": 0}
    r = split_rlix(8, jobs)
    assert r["A"] > r["B"] >= 1 and sum(r.values()) == 8


def test_a_job_allotted_nothing_says_why():
    # the pool is empty: nothing went to anyone
    assert arbitrate(0, [job("A"), job("B")]).idle == {"A": Idle.NO_CAPACITY, "B": Idle.NO_CAPACITY}
    # a higher-priority guarantee took every unit: the low job's units went elsewhere
    a = arbitrate(4, [job("low"), job("high", priority=1, min_units=4)])
    assert a.units["low"] == 0 and a.idle == {"low": Idle.ELSEWHERE}
    # none of its chip types in the pool (its maximum is 0)
    assert arbitrate(4, [job("A", max_units=0), job("B")]).idle == {"A": Idle.NO_UNITS}
    # a job with units has no reason
    assert arbitrate(4, [job("A"), job("B")]).idle == {}


def test_the_step_time_the_arbiter_weighs_overlaps_the_update_only_off_policy():
    from controlplane.core.policies.base import best_makespan, best_step_time
    from controlplane.core.predictor import swe_bench_workload
    from controlplane.core.profiles import get_profile

    w = swe_bench_workload(64, 32768)
    c = get_profile("H800", "qwen3-8b").coefficients(mean_context=w.mean_context)
    m = best_makespan(w, c, 4)
    assert best_step_time(w, c, 4, 0.0) == m  # not trained yet
    assert best_step_time(w, c, 4, m + 100.0) == m + 100.0  # one step off-policy: the update bounds it
    assert best_step_time(w, c, 4, m + 100.0, max_staleness=0) == pytest.approx(2 * m + 100.0)  # on-policy: the sum
    # near the update's length the predicted makespan's error counts: a worker more still shortens the expected
    # step (with a plain max it bought nothing once the prediction fell under the update)
    m3, m5 = best_makespan(w, c, 3), best_makespan(w, c, 5)
    assert m3 > m > m5
    near = m * 1.02
    assert best_step_time(w, c, 3, near) > best_step_time(w, c, 4, near) > best_step_time(w, c, 5, near) > near
    # a job predicted worse than most (its own measured error, `FittedProfile.makespan_error`): a unit that puts its
    # prediction well under the update still shortens its expected step, where at the usual error it buys nothing
    under = m3 * 1.3

    def gain(error: float) -> float:
        return best_step_time(w, c, 4, under, error=error) - best_step_time(w, c, 5, under, error=error)

    assert gain(0.05) < 1e-6 < gain(0.16) < gain(0.5)


def test_the_expected_longer_of_a_predicted_rollout_and_an_update():
    from controlplane.core.policies.base import expected_max

    assert expected_max(100.0, 0.0, 16.0) == 100.0 and expected_max(0.0, 100.0, 16.0) == 100.0  # far apart: the max
    assert expected_max(100.0, 100.0, 16.0) == pytest.approx(100.0 + 16.0 / math.sqrt(2 * math.pi))  # E[max] at par
    assert expected_max(100.0, 90.0, 0.0) == 100.0 and expected_max(math.inf, 90.0, 16.0) == math.inf
    # monotone in the prediction, never under either
    xs = [expected_max(m, 100.0, 0.16 * m) for m in range(60, 160, 5)]
    assert xs == sorted(xs) and all(x >= max(m, 100.0) for x, m in zip(xs, range(60, 160, 5), strict=True))
