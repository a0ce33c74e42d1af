"""Errors a person can act on when no plan fits, and the figures they quote.

Owns `MemoryBudgetError` and `memory_floor`: the smallest per-rank memory any placement could
reach (every parameter and saved activation at its most-sharded valid placement -- memory is a
sum over units, so the floor is exact for this model of memory) and the largest contributors
there.
"""

from __future__ import annotations

import itertools
import math

from titan_autopar.cost.hardware import GiB
from titan_autopar.solve.problem import Problem


def memory_floor(pb: Problem, top: int = 5) -> tuple[float, list[tuple[str, float]]]:
    ndim = len(pb.sizes)
    total = 0.0
    parts: list[tuple[str, float]] = []
    for u, unit in enumerate(pb.units):
        if unit.kind == "op" and not unit.saved:
            continue
        per_dim = [pb.allowed(u, m) for m in range(ndim)]
        best = None
        for choice in itertools.product(*per_dim):
            up = pb.unit_price(u, tuple(choice))
            if up is None:
                continue
            mem = sum(up[1].values())
            best = mem if best is None else min(best, mem)
        if best:
            total += best
            label = unit.param_name or unit.node.name
            if unit.weight > 1:
                label += f" (x{unit.weight})"
            parts.append((label, best))
    parts.sort(key=lambda x: -x[1])
    return total, parts[:top]


def gib(x: float) -> str:
    """Bytes as GiB to three significant digits."""
    return f"{x / GiB:.3g}"


def gib_up(x: float) -> str:
    """Bytes as GiB to three significant digits, rounded up: a budget that big fits `x`."""
    v = x / GiB
    if v <= 0:
        return "0"
    k = max(0, 2 - math.floor(math.log10(v)))
    return f"{math.ceil(v * 10**k - 1e-9) / 10**k:.{k}f}"


class MemoryBudgetError(ValueError):
    def __init__(self, budget: float, floor: float, top: list[tuple[str, float]], found: float):
        self.budget, self.floor, self.top, self.found = budget, floor, top, found
        biggest = ", ".join(f"{n} {gib(b)} GiB" for n, b in top)
        if floor <= budget:
            super().__init__(
                f"the planner found no plan within {gib(budget)} GiB per rank (its best needs "
                f"{gib(found)} GiB), though placements down to {gib(floor)} GiB exist. "
                f"Raise memory_budget_gib to {gib_up(found)}, or give time_limit_s more time. "
                f"Largest contributors at the floor: {biggest}."
            )
            return
        super().__init__(
            f"no plan fits a memory budget of {gib(budget)} GiB per rank: even with every "
            f"parameter and saved activation at its most-sharded placement a rank needs "
            f"{gib(floor)} GiB. Raise memory_budget_gib to at least {gib_up(floor)}, use "
            f"more ranks, or shrink the batch or sequence. Largest contributors at that floor: "
            f"{biggest}."
        )
