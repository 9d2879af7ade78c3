"""The PD-aware router of the rollout loop: which serving worker takes a turn.

Colocated: sticky per trajectory (its prefix cache lives on its home worker) unless the home is
clearly overloaded; a new or re-homed trajectory goes to the worker with the fewest homed
trajectories per unit of its speed (`rate`: its chip's, relative to the job's fastest; 1 on one chip
type), so a mixed pool's chips finish together and a straggler leaves a slow chip for a fast one with
room. Disaggregated: the prefill worker is chosen the same way (it holds the prompt's
prefix cache); after the prefill, the KV cache goes to the decode worker with the shortest queue
(join-shortest-queue on in-flight decodes). Pure bookkeeping, no I/O: the simulator and the live
rollout driver route through the same object inside `core.loop.RolloutLoop`.

A second dispatch rule, `jsq`, is RLBoost's Algorithm 2 for the RLBoost+ baseline (`pick_first` with
`load`): join-shortest-queue on the turns each worker has in flight, the home worker winning ties (its
prefix cache), and delayed dispatch: while every worker has `cap` turns in flight the turn is held
(None) and the loop routes it when one finishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.core.state import Mode, Role

# keep the home while its homed trajectories per unit of speed are at most the best's with this many more
STICKY_SLACK = 2


@dataclass(slots=True)
class Router:
    """Serving workers by role, trajectory homes and per-worker load."""

    serving: dict[Role, list[int]] = field(
        default_factory=lambda: {r: [] for r in (Role.PREFILL, Role.DECODE, Role.COLOCATED)}
    )
    homed: dict[int, int] = field(default_factory=dict)  # worker -> live trajectories homed there
    home: dict[str, int] = field(default_factory=dict)  # trajectory -> home worker
    decoding: dict[int, int] = field(default_factory=dict)  # decode worker -> decodes routed, not finished
    role_of: dict[int, Role] = field(default_factory=dict)  # serving worker -> role
    rate: dict[int, float] = field(default_factory=dict)  # serving worker -> relative speed (absent: 1)

    # ------------------------------------------------------------------ membership
    def add(self, worker: int, role: Role, rate: float = 1.0) -> None:
        """`worker` serves `role` from now on (joined, activated or re-roled)."""
        self.remove(worker)
        self.role_of[worker] = role
        if rate != 1.0:
            self.rate[worker] = rate
        lst = self.serving[role]
        lst.append(worker)
        lst.sort()

    def remove(self, worker: int) -> None:
        """`worker` takes no new requests (draining, returned, preempted, stopped)."""
        role = self.role_of.pop(worker, None)
        if role is not None:
            self.serving[role].remove(worker)
        self.rate.pop(worker, None)

    @property
    def mode(self) -> Mode | None:
        """The mode the serving set can run now (None: nothing can serve a turn)."""
        if self.serving[Role.COLOCATED]:
            return Mode.COLOCATED
        if self.serving[Role.PREFILL] and self.serving[Role.DECODE]:
            return Mode.DISAGGREGATED
        return None

    # ------------------------------------------------------------------ routing
    def pick_first(self, trajectory: str, load: dict[int, int] | None = None, cap: int = 0) -> int | None:
        """The worker that takes a turn's prompt: colocated worker, or prefill worker. With `load`
        (turns in flight per worker): RLBoost's join-shortest-queue, None while every worker has `cap`
        (> 0) turns in flight (delayed dispatch)."""
        mode = self.mode
        if mode is None:
            return None
        pool = self.serving[Role.COLOCATED] if mode is Mode.COLOCATED else self.serving[Role.PREFILL]
        if load is not None:
            return self._pick_jsq(trajectory, pool, load, cap)
        homed, rate = self.homed, self.rate
        best = min(pool, key=lambda w: ((homed.get(w, 0) + 1) / rate.get(w, 1.0), w))
        cur = self.home.get(trajectory)
        if (
            cur is not None
            and cur in self.role_of
            and self.role_of[cur] is self.role_of[best]
            and homed.get(cur, 0) / rate.get(cur, 1.0) <= (homed.get(best, 0) + STICKY_SLACK) / rate.get(best, 1.0)
        ):
            return cur
        return self._rehome(trajectory, best)

    def _pick_jsq(self, trajectory: str, pool: list[int], load: dict[int, int], cap: int) -> int | None:
        least = min(load.get(w, 0) for w in pool)
        if cap > 0 and least >= cap:
            return None
        cur = self.home.get(trajectory)
        if cur is not None and cur in pool and load.get(cur, 0) == least:
            return cur
        return self._rehome(trajectory, min(w for w in pool if load.get(w, 0) == least))

    def _rehome(self, trajectory: str, worker: int) -> int:
        self.unhome(trajectory)
        self.home[trajectory] = worker
        self.homed[worker] = self.homed.get(worker, 0) + 1
        return worker

    def pick_decode(self) -> int | None:
        """Join-shortest-queue over the decode workers (None: no decode worker serves)."""
        pool = self.serving[Role.DECODE]
        if not pool:
            return None
        dec = self.decoding
        w = min(pool, key=lambda x: (dec.get(x, 0), x))
        dec[w] = dec.get(w, 0) + 1
        return w

    def decode_done(self, worker: int) -> None:
        n = self.decoding.get(worker, 0)
        if n > 1:
            self.decoding[worker] = n - 1
        else:
            self.decoding.pop(worker, None)

    def unhome(self, trajectory: str) -> None:
        w = self.home.pop(trajectory, None)
        if w is not None:
            n = self.homed.get(w, 0)
            if n > 1:
                self.homed[w] = n - 1
            else:
                self.homed.pop(w, None)


__all__ = ["STICKY_SLACK", "Router"]
