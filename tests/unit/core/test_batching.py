"""The batching model's closed-form segments (core.batching) equal the iteration-by-iteration sum they stand for."""

from __future__ import annotations

from controlplane.core.batching import IterationScheduler, Request, ScaledCosts, prefill_records
from controlplane.core.profiles import get_profile
from controlplane.core.state import Role
from controlplane.core.workload import Trajectory, TurnSpec


def _req(ctx: int, gen: int) -> Request:
    tr = Trajectory(tid=f"t{ctx}-{gen}", step=0, group=0, turns=(TurnSpec(ctx, gen, 0.0),))
    return Request(tr, compute=0, prefix=ctx, ctx0=ctx, remaining=gen)


def test_decode_segments_match_brute_force_iterations():
    prof = get_profile("H800", "qwen3-30b-a3b", 2)  # MoE: the expert reads change with the batch
    w = IterationScheduler(0, "reserved", Role.DECODE, ScaledCosts(prof), chunk_tokens=8192, kv_capacity=10**7)
    specs = [(4000, 37), (12000, 5), (800, 120), (20000, 64)]
    for ctx, gen in specs:
        w.submit_decode(_req(ctx, gen))
    t = 0.0
    finished: dict[str, float] = {}
    end = w.plan(t)
    while end is not None:
        _, done, _ = w.finish()
        for r in done:
            finished[r.traj.tid] = end
        end = w.plan(end)
    # brute force: one iteration at a time, every running sequence adds one token of context
    live = {f"t{c}-{g}": [c, g] for c, g in specs}
    clock = 0.0
    expect: dict[str, float] = {}
    while live:
        n = len(live)
        mean_ctx = sum(v[0] for v in live.values()) / n
        clock += float(prof.decode_iteration_s(n, mean_ctx))
        for k in list(live):
            live[k][0] += 1
            live[k][1] -= 1
            if live[k][1] == 0:
                expect[k] = clock
                del live[k]
    assert finished.keys() == expect.keys()
    for k, v in expect.items():
        assert abs(finished[k] - v) / v < 2e-3, (k, finished[k], v)
    assert w.tokens_out == sum(g for _, g in specs)


def test_an_arrival_joins_at_the_next_iteration_boundary():
    prof = get_profile("H800", "qwen3-8b", 2)
    w = IterationScheduler(0, "reserved", Role.DECODE, ScaledCosts(prof), chunk_tokens=8192, kv_capacity=10**7)
    w.submit_decode(_req(1000, 500))
    end = w.plan(0.0)
    dt = w.seg.dt
    new_end = w.interrupt(10.3 * dt)
    assert new_end is not None and abs(new_end - 11 * dt) < 1e-9  # the running iteration completes first
    w.submit_decode(_req(3000, 10))
    assert end is not None and new_end < end
    w.finish()
    assert w.it == 11
    w.plan(new_end)
    assert len(w.running) == 2


def test_colocated_prefill_slows_the_running_decodes():
    prof = get_profile("H800", "qwen3-8b", 2)
    w = IterationScheduler(0, "reserved", Role.COLOCATED, ScaledCosts(prof), chunk_tokens=8192, kv_capacity=10**7)
    pure = float(prof.decode_iteration_s(1, 8000))
    w.submit_decode(_req(8000, 400))
    r = _req(16000, 50)
    r.compute, r.prefix = 16000, 0
    w.submit_prompt(r)
    w.plan(0.0)
    seg = w.seg
    assert seg.kind == "prefill" and seg.k == 2  # 16,000 tokens in 8,192-token chunks
    assert seg.dt > 10 * pure  # each chunk iteration carries the decode and the prefill chunk
    w.finish()
    assert w.it == 2 and len(w.running) == 2  # the decode advanced 2 tokens; the prompt joined decoding


def test_remove_mid_segment_counts_the_tokens_generated_by_then_and_the_rest_finish():
    """An abort takes one request off at t: it keeps the tokens of the iterations done by t; the decode
    segment is cut at the next boundary and the others still finish their turns."""
    from controlplane.core.state import Role

    class Flat:
        def decode_iteration_s(self, batch: int, mean_context: float) -> float:
            return 0.01

        def prefill_s(self, tokens: int, prefix: int) -> float:
            return 0.0

    w = IterationScheduler(0, "", Role.COLOCATED, Flat(), chunk_tokens=8192, kv_capacity=10**9)
    a, b = Request("a", 0, 0, 10, 100), Request("b", 0, 0, 10, 50)
    w.submit_decode(a)
    w.submit_decode(b)
    assert w.plan(0.0) == 0.5  # until b finishes
    assert w.generated(a, 0.255) == 25
    assert w.remove(b, 0.255) == 25
    assert w.seg.end_s == 0.26  # cut at the next iteration boundary
    _, done, _ = w.finish()
    assert done == []
    assert w.plan(0.26) == 0.26 + 0.01 * 74
    _, done, _ = w.finish()
    assert done == [a] and w.running == {}


def test_the_interference_what_if_stretches_only_prefill_next_to_running_decodes():
    """`mixed_prefill_penalty` (a what-if, never shipped) multiplies the prefill time of a chunk that
    carries running decodes; a prefill with nothing decoding, and a prefill worker's, cost the same."""
    prof = get_profile("H800", "qwen3-8b", 2)
    costs = ScaledCosts(prof)

    def prefill_segment(penalty: float, role: Role, decoding: int):
        w = IterationScheduler(0, "reserved", role, costs, chunk_tokens=8192, kv_capacity=10**7, mixed_penalty=penalty)
        for i in range(decoding):
            w.submit_decode(_req(4000 + i, 50 + 100 * i))  # the first finishes, the rest keep decoding
        if decoding:
            w.plan(0.0)
            w.finish()  # the decodes are running now
        tr = Trajectory(tid="new", step=0, group=0, turns=(TurnSpec(6000, 10, 0.0),))
        w.submit_prompt(Request(tr, compute=6000, prefix=0, ctx0=6000, remaining=10))
        w.seg = None
        end = w.plan(1.0)
        assert w.seg is not None and w.seg.kind == "prefill"
        return end - 1.0, w.seg.prefill_s, prefill_records(w.seg)

    pf = costs.prefill_s(6000, 0)
    records = prefill_segment(2.0, Role.COLOCATED, 4)[2]  # what the engine reports: the pass, mixed
    assert [(r.tokens, r.prefix_tokens, r.running_batch) for r in records] == [(6000, 0, 3)]
    assert abs(records[0].duration_s - 2 * pf) < 1e-12
    assert prefill_segment(2.0, Role.PREFILL, 0)[2][0].running_batch == 0
    base, pf1, _ = prefill_segment(1.0, Role.COLOCATED, 4)
    hot, pf2, _ = prefill_segment(2.0, Role.COLOCATED, 4)
    assert abs(pf1 - pf) < 1e-12 and abs(pf2 - 2 * pf) < 1e-12 and abs((hot - base) - pf) < 1e-9
    assert prefill_segment(2.0, Role.COLOCATED, 0)[:2] == prefill_segment(1.0, Role.COLOCATED, 0)[:2]
    assert prefill_segment(2.0, Role.PREFILL, 0)[:2] == prefill_segment(1.0, Role.PREFILL, 0)[:2]
