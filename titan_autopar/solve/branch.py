"""Branch-and-bound over binary choices, each node one linear program solved by HiGHS.

Owns `branch_and_bound`, what `solve/program.py` runs first for solver="highs" (a program it
leaves open after its node budget goes on in HiGHS's MIP solver). The planner's programs
are one-hot choices (one binary per candidate of a unit, summing to 1) linked by edge and
overlap rows. Their LP relaxation is integral unless a coupling row is tight -- the overlap of
a block's parameter collectives with its compute, `solve/ilp.py`'s E_g, when the collectives
just outgrow the compute -- and then only a few units take fractional mixtures. So the search
is small, and what matters is that each node costs one warm-started LP (a few hundred dual
simplex iterations), not a MIP solver's presolve, cut rounds and sub-MIP heuristics at the root.

  root      the LP relaxation; integral: that is the optimum
  incumbent the given start (binaries fixed, the rest an LP; solved first, its basis warm-starts
            the root), then at every fractional node the rounding that takes each unit's largest
            value (an LP with every binary fixed)
  branch    on the most fractional unit (1 - its largest value; for a binary outside every
            one-hot row, the distance to the nearer integer), the candidate with the largest
            value: fixed to 1 first, then to 0
  order     best bound first (the parent's LP value), ties in creation order
  prune     a node whose LP value is within `gap` (relative) or `abs_gap` of the incumbent
  stop      no open node, or `max_nodes` nodes solved (the result says "node_limit"), or the
            wall-clock guard (says "time_guard"; only a runaway program meets it)

Everything is counted, never timed, so the same program gives the same plan on a busy machine
and an idle one: HiGHS's simplex on one thread is deterministic, and so is this order. The work
(`Result.iterations`, simplex iterations over every LP; `Result.nodes`) is what the planner
reports as its solver work (`solve/descent.py DescentStats`), the figure the planning-work
guard holds (`tests/test_plan_work.py`).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

import numpy as np

INTEGRAL_TOL = 1e-6


@dataclass
class Searched:
    """The best integer point found, with the bound proven and the work done."""

    values: list[float] | None  # None: no integer point found
    objective: float
    status: str  # "optimal", "node_limit", "time_guard" or "infeasible"
    gap: float
    iterations: int
    nodes: int


class _Node:
    __slots__ = ("bound", "order", "fixed")

    def __init__(self, bound: float, order: int, fixed: dict[int, float]):
        self.bound, self.order, self.fixed = bound, order, fixed

    def __lt__(self, other: "_Node") -> bool:
        return (self.bound, self.order) < (other.bound, other.order)


class _LP:
    """One HiGHS instance holding the relaxation; nodes change column bounds and re-solve from
    the last basis."""

    def __init__(self, highs, lower: np.ndarray, upper: np.ndarray, guard_until: float):
        self.h, self.lower, self.upper = highs, lower, upper
        self.guard_until = guard_until
        self.fixed: dict[int, float] = {}
        self.iterations = 0

    def solve(self, fixed: dict[int, float]) -> tuple[str, float, np.ndarray | None]:
        """("optimal" | "infeasible" | "stopped", objective, column values) under `fixed`."""
        import highspy

        cols = sorted(set(self.fixed) | set(fixed))
        if cols:
            idx = np.asarray(cols, dtype=np.int32)
            lo = np.asarray([fixed.get(j, self.lower[j]) for j in cols], dtype=np.float64)
            hi = np.asarray([fixed.get(j, self.upper[j]) for j in cols], dtype=np.float64)
            self.h.changeColsBounds(len(cols), idx, lo, hi)
        self.fixed = dict(fixed)
        self.h.setOptionValue("time_limit", max(1e-3, self.guard_until - time.perf_counter()))
        self.h.run()
        self.iterations += max(0, int(self.h.getInfo().simplex_iteration_count))
        status = self.h.getModelStatus()
        if status == highspy.HighsModelStatus.kOptimal:
            return ("optimal", float(self.h.getInfo().objective_function_value),
                    np.asarray(self.h.getSolution().col_value))
        if status == highspy.HighsModelStatus.kInfeasible:
            return "infeasible", math.inf, None
        return "stopped", math.inf, None


def _fractional(x: np.ndarray, groups: list[list[int]], loose: list[int]):
    """The most fractional unit as (how fractional, the column to branch on), or None when
    every binary is integral."""
    best = None
    for g in groups:
        vals = x[g]
        k = int(np.argmax(vals))
        frac = 1.0 - float(vals[k])
        if frac > INTEGRAL_TOL and (best is None or frac > best[0]):
            best = (frac, g[k])
    for j in loose:
        frac = min(x[j], 1.0 - x[j])
        if frac > INTEGRAL_TOL and (best is None or frac > best[0]):
            best = (float(frac), j)
    return best


def _rounded(x: np.ndarray, groups: list[list[int]], loose: list[int]) -> dict[int, float]:
    """Each unit at its largest value; a loose binary at its nearer integer."""
    fixed: dict[int, float] = {}
    for g in groups:
        k = int(np.argmax(x[g]))
        for i, j in enumerate(g):
            fixed[j] = 1.0 if i == k else 0.0
    for j in loose:
        fixed[j] = float(round(x[j]))
    return fixed


def branch_and_bound(highs, lower: list[float], upper: list[float], binaries: list[int],
                     groups: list[list[int]], *, gap: float, abs_gap: float, max_nodes: int,
                     guard_s: float, start: dict[int, float] | None) -> Searched:
    """Minimise the LP already passed to `highs` with `binaries` integral. `groups` are the
    one-hot rows' columns (every binary in at most one); `start` fixes the binaries of a
    feasible point (the rest is solved for)."""
    t0 = time.perf_counter()
    lp = _LP(highs, np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64),
             t0 + guard_s)
    grouped = {j for g in groups for j in g}
    loose = [j for j in binaries if j not in grouped]
    best, best_x = math.inf, None

    def offer(fixed: dict[int, float]) -> None:
        nonlocal best, best_x
        status, value, x = lp.solve(fixed)
        if status == "optimal" and value < best:
            best, best_x = value, x

    def tolerance() -> float:
        return max(gap * abs(best), abs_gap) if math.isfinite(best) else 0.0

    if start:  # priced first: its basis warm-starts the root, which then takes a fraction of
        # the time it takes from nothing (fewer iterations are not less time: presolve and a
        # crash basis cost more than the iterations they save)
        offer({j: float(v) for j, v in start.items()})
    heap = [_Node(-math.inf, 0, {})]
    made, nodes = 1, 0
    pruned = math.inf  # the least LP value among nodes pruned within the tolerance
    status = "optimal"
    while heap:
        if nodes >= max_nodes or time.perf_counter() >= t0 + guard_s:
            status = "node_limit" if nodes >= max_nodes else "time_guard"
            break
        node = heapq.heappop(heap)
        if math.isfinite(best) and node.bound >= best - tolerance():
            pruned = min(pruned, node.bound)
            continue
        nodes += 1
        state, value, x = lp.solve(node.fixed)
        if state == "infeasible":
            continue
        if state != "optimal":  # a node HiGHS could not finish keeps its parent's bound open
            heapq.heappush(heap, _Node(node.bound, made, node.fixed))
            made += 1
            status = "time_guard"
            break
        split = _fractional(x, groups, loose)
        if split is None:
            if value < best:
                best, best_x = value, x
            continue
        if math.isfinite(best) and value >= best - tolerance():
            pruned = min(pruned, value)
            continue
        offer(_rounded(x, groups, loose))
        _, j = split
        for v in (1.0, 0.0):
            heapq.heappush(heap, _Node(value, made, {**node.fixed, j: v}))
            made += 1
    if best_x is None:
        return Searched(None, math.inf, "infeasible" if not heap and status == "optimal"
                        else status, 1.0, lp.iterations, nodes)
    bound = min([n.bound for n in heap] + [pruned, best])
    rel = max(0.0, (best - bound) / abs(best)) if best else 0.0
    rel = rel if math.isfinite(rel) else 1.0
    return Searched(best_x.tolist(), best, status, rel, lp.iterations, nodes)
