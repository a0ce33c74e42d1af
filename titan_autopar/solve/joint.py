"""The exact check on the descent: one integer program over products of per-dim choices.

Owns `solve_joint` (`plan_model(..., solver="joint")`). Each unit's candidates are every product
of its allowed single-dim options, one per mesh dim, that splits its tensors evenly; the program
is `solve/ilp.py`'s, written out there, with S_u those products and the edges' placements a and
b full N-D placements. Its optimum (branch-and-bound to a relative gap of `JOINT_GAP`) is the
best plan the prices allow, against which `solve/descent.py`'s per-dim programs are measured
(`tests/test_joint_check.py`).

Its size grows as (options per dim) to the power of the mesh's rank, so it is for small problems
only: `joint_size` bounds the count of its variables from the option lists alone (nothing priced,
nothing built), and `solve_joint` refuses a problem above `MAX_VARIABLES` with what to do instead.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

from titan_autopar.solve.descent import DescentStats
from titan_autopar.solve.ilp import DimSolve, SolveLimits, solve_candidates
from titan_autopar.solve.problem import Problem

MAX_VARIABLES = 150_000  # all of the program's variables, as bounded by `joint_size`
JOINT_GAP = 1e-6  # relative gap to the best bound: the exact check proves its optimum
JOINT_INCREMENT = 1e-9  # ms: no improvement is too small to look for (CBC's default is 1e-5)


def joint_size(pb: Problem) -> int:
    """An upper bound on the joint program's variables, from the option lists alone: per unit
    the product of its allowed options per dim (its binaries), plus per edge whose two sides can
    each take several placements the product of their placement counts (its y's; each side's
    count bounded by the product over dims of its distinct single-dim placements), plus one
    overlap variable per block and the memory excess."""
    ndim = len(pb.sizes)
    allowed = [[pb.allowed(u, m) or [0] for m in range(ndim)] for u in range(len(pb.units))]
    n = sum(math.prod(len(a) for a in per_dim) for per_dim in allowed)
    for e in pb.edges:
        src = math.prod(len({pb.units[e.src].options[s].out[e.out] for s in allowed[e.src][m]})
                        for m in range(ndim))
        dst = math.prod(len({pb.units[e.dst].options[s].ins[e.arg] for s in allowed[e.dst][m]})
                        for m in range(ndim))
        if src > 1 and dst > 1:
            n += src * dst
    return n + len({u.block for u in pb.units}) + 1  # the E_g's and the memory excess


def check_joint_size(pb: Problem, max_variables: int = MAX_VARIABLES) -> int:
    """`joint_size(pb)`, or a ValueError saying what to do when it is above `max_variables`."""
    n = joint_size(pb)
    if n > max_variables:
        raise ValueError(
            f"solver='joint' is an exact check for small problems: this one would need up to "
            f"{n:,} variables (limit {max_variables:,}; {len(pb.units)} units on a "
            f"{'x'.join(map(str, pb.sizes))} mesh). Use the default solver='highs' (per-mesh-dim "
            "programs), or check on a smaller mesh or model")
    return n


def joint_candidates(pb: Problem, start: list[tuple[int, ...]]) -> list[dict[int, tuple[int, ...]]]:
    """Per unit, every product of its allowed per-dim options that splits evenly, keyed by its
    position in `itertools.product` order (`start[u]` alone where none does)."""
    ndim = len(pb.sizes)
    cands = []
    for u in range(len(pb.units)):
        per_dim = [pb.allowed(u, m) or [0] for m in range(ndim)]
        ok = [c for c in itertools.product(*per_dim) if pb.unit_price(u, c) is not None]
        cands.append(dict(enumerate(ok)) if ok else {0: start[u]})
    return cands


def solve_joint(
    pb: Problem,
    start: list[tuple[int, ...]],
    *,
    budget_bytes: float,
    solver: str = "highs",
    limits: SolveLimits | None = None,
    max_variables: int = MAX_VARIABLES,
    stats: DescentStats | None = None,
) -> DimSolve:
    """The joint optimum, warm-started from `start` (a plan within the pins, e.g. a recipe's).
    Refuses, before pricing or building anything, a problem above `max_variables`. `limits`
    keeps its node limit and time guard; its gap is tightened to `JOINT_GAP` and its increment
    to `JOINT_INCREMENT`. `stats`, if given, counts this program as a descent's would be."""
    check_joint_size(pb, max_variables)
    t0 = time.perf_counter()
    limits = limits or SolveLimits()
    limits = dataclasses.replace(limits, gap=min(limits.gap, JOINT_GAP), increment=JOINT_INCREMENT)
    res = solve_candidates(pb, joint_candidates(pb, start), start,
                           what="the joint program", budget_bytes=budget_bytes, solver=solver,
                           limits=limits, t0=t0, exact=True)
    if stats is not None:
        stats.count(res)
        stats.rounds = max(stats.rounds, 1)
    return res
