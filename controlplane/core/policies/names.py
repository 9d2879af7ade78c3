"""The policy names, spelled once: every other module refers to a policy through these constants (or a
class's `name`), and behaviour is read from the policy's traits (`base.TrackedPolicy`), never from its name."""

from __future__ import annotations

PEARL = "pearl"  # the paper's policy
FIXED = "fixed"  # ROLL: a fixed colocated pool of the reserved GPUs
FIXED_LARGE = "fixed-large"  # ROLL-Large: a fixed colocated pool as large as the trace's mean
ELASTIC = "elastic"  # elastic seeding after RLBoost, ungated (the ablation's B without A and C)
RLBOOST = "rlboost+"  # RLBoost's Algorithms 1 and 2 adapted to asynchronous RL (simulator only)
BEST_HOMOGENEOUS = "best-homogeneous"  # PEARL on the best single chip type of a mixed pool (simulator only)
ORACLE = "oracle"  # the upper bound: chooses by simulated outcome, reconfigures for free (simulator only)

ALIASES: dict[str, str] = {"roll": FIXED, "roll-large": FIXED_LARGE}
