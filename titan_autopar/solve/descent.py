"""Block-coordinate descent over mesh dimensions.

Owns `descend`: starting from a full assignment, it solves the integer program of
`solve/ilp.py` for one mesh dim at a time (every operator at once, the other dims held fixed, all
prices exact) and keeps a result only if the whole plan's price improves, cycling through the dims
until a full round changes nothing or gains less than `ROUND_GAIN` of the objective. On a 1-D mesh
this is a single exact solve. On N-D meshes it replaces one program over products of per-dim
choices -- whose size grows as (options per dim) to the power of the mesh's rank, the reason 4-D
meshes were called impractical -- with rank-many small programs; started from the expert recipe it can only improve on it. Each program stops by
the counted limits of `SolveLimits` (never by the clock, so plans do not depend on the machine's
load); one stopped before proving its optimum keeps its best integer solution and reports its
gap (against the LP relaxation) in the plan.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from titan_autopar.cost.hardware import GiB
from titan_autopar.solve.ilp import (HIDDEN_COMM_WEIGHT, MEMORY_PENALTY_MS_PER_GIB, SolveLimits,
                                     solve_dim)
from titan_autopar.solve.problem import Price, Problem


ROUND_GAIN = 1e-4  # a full round improving the objective by less than this fraction ends it


@dataclass
class DescentStats:
    solves: int = 0
    rounds: int = 0
    variables: int = 0  # largest single program
    constraints: int = 0
    build_seconds: float = 0.0
    solve_seconds: float = 0.0
    status: str = "optimal"
    gap: float = 0.0
    iterations: int = 0  # simplex iterations, summed over programs: the solver's counted work
    nodes: int = 0  # branch-and-bound nodes, summed
    mip_programs: int = 0  # programs finished by HiGHS's MIP solver (each costs more work)
    history: list[float] = field(default_factory=list)  # objective (ms) after each accepted solve

    def count(self, res) -> None:
        """Add one solved program (a `solve/ilp.py` DimSolve) to the totals."""
        self.solves += 1
        self.variables = max(self.variables, res.variables)
        self.constraints = max(self.constraints, res.constraints)
        self.build_seconds += res.build_seconds
        self.solve_seconds += res.solve_seconds
        self.gap = max(self.gap, res.gap)
        self.iterations += res.iterations
        self.nodes += res.nodes
        self.mip_programs += res.mip
        if res.status != "optimal" and self.status != "time_guard":
            self.status = res.status


def objective_ms(price: Price, budget_bytes: float) -> float:
    over = max(0.0, price.peak_memory - budget_bytes) / GiB
    return (price.step_time + HIDDEN_COMM_WEIGHT * price.comm_param) * 1e3 + MEMORY_PENALTY_MS_PER_GIB * over


def initial_assignment(pb: Problem) -> list[tuple[int, ...]]:
    """Replicate everywhere (option 0), pinned units at their pins; where that splits a tensor
    unevenly (a region that must split its tokens on one dim), the first allowed combination
    that does not."""
    ndim = len(pb.sizes)
    assign = []
    for u in range(len(pb.units)):
        per_dim = [pb.allowed(u, m) or [0] for m in range(ndim)]
        choice = tuple(opts[0] for opts in per_dim)
        if pb.unit_price(u, choice) is None:
            choice = next((c for c in itertools.product(*per_dim)
                           if pb.unit_price(u, c) is not None), choice)
        assign.append(choice)
    return assign


def within_pins(pb: Problem, assign: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """`assign` with every unit that breaks its pins (a start made under other pins: a recipe's
    assignment when the user pins parameters elsewhere) put back at `initial_assignment`'s
    choice for it. The programs only ever choose allowed options, so without this a start's
    broken pin would survive wherever no program found an improvement."""
    fixed = None
    out = list(assign)
    for u, choice in enumerate(assign):
        if any(choice[m] not in (pb.allowed(u, m) or [choice[m]]) for m in range(len(choice))):
            fixed = fixed or initial_assignment(pb)
            out[u] = fixed[u]
    return out


def descend(
    pb: Problem,
    assign: list[tuple[int, ...]],
    *,
    budget_bytes: float,
    solver: str = "highs",
    limits: SolveLimits | None = None,
    max_rounds: int = 3,
    log: Callable[[str], None] = lambda s: None,
    stats: DescentStats | None = None,
) -> tuple[list[tuple[int, ...]], DescentStats]:
    stats = stats or DescentStats()
    limits = limits or SolveLimits()
    assign = within_pins(pb, assign)
    best = objective_ms(pb.evaluate(assign), budget_bytes)
    ndim = len(pb.sizes)
    version = 0  # bumped on every accepted improvement
    solved_at = [-1] * ndim  # version at which each dim was last solved
    for r in range(max_rounds):
        stats.rounds = r + 1
        at_start = best
        for m in range(ndim):
            if solved_at[m] == version:
                continue  # nothing changed since this dim's program was last solved
            res = solve_dim(pb, assign, m, budget_bytes=budget_bytes, solver=solver, limits=limits)
            stats.count(res)
            if res.status == "time_guard":
                log(f"  warning: mesh dim {m}'s program hit the {limits.guard_s:g} s time guard; "
                    "this plan depends on the machine's speed (raise time_limit_s)")
            obj = objective_ms(pb.evaluate(res.assign), budget_bytes)
            log(f"  round {r + 1} mesh dim {m}: {res.variables} vars, {res.constraints} rows, "
                f"{res.iterations} simplex iterations, {res.nodes} nodes, "
                f"{res.solve_seconds:.2f}s solve -> {obj:.3f} ms")
            if obj < best * (1 - 1e-9) - 1e-12:
                assign, best = res.assign, obj
                stats.history.append(obj)
                version += 1
            solved_at[m] = version
        if all(v == version for v in solved_at):
            break
        if best > at_start * (1 - ROUND_GAIN):  # a round that gained almost nothing: converged
            break
    return assign, stats
