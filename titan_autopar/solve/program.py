"""One integer program in sparse form, and the solvers that run it.

Owns `Program`: columns (cost, bounds, binary or continuous) and rows (sparse coefficients,
bounds) collected as plain lists, so that building a program of thousands of variables costs
milliseconds rather than the seconds a modelling layer's expression objects take; `one_hot`
rows are remembered as the program's choices. `solve_program` runs it the way `solve/ilp.py`
states: the LP relaxation first, branch-and-bound only when that is not integral, warm-started
from a given feasible point, stopped by counted limits only.

Solvers:
  "highs"  HiGHS in this process through `highspy` (the default: no subprocess, no files):
           its simplex inside `solve/branch.py`'s branch-and-bound over the one-hot choices, and
           its MIP solver for a program that search leaves open; the result counts the work
           (simplex iterations, nodes);
  "cbc"    CBC through PuLP, in a subprocess whose files live in a temporary folder removed
           afterwards, also when the solve fails (its work is not counted: 0).
Both are deterministic on one thread: a program gives the same answer on a busy machine and an
idle one, unless the wall-clock guard fires, which the result says ("time_guard").
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field

SOLVERS = ("highs", "cbc")
INTEGRAL_TOL = 1e-6


@dataclass
class Program:
    """min cost . x + offset  s.t.  row_lo <= A x <= row_hi,  lo <= x <= hi,  x_j binary for j in
    `binaries`. Columns are numbered in the order `column` adds them."""

    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    binaries: list[int] = field(default_factory=list)
    rows: list[tuple[dict[int, float], float, float]] = field(default_factory=list)
    offset: float = 0.0
    groups: list[list[int]] = field(default_factory=list)  # the columns of each one-hot row

    def column(self, *, binary: bool = False, lower: float = 0.0,
               upper: float = math.inf) -> int:
        j = len(self.cost)
        self.cost.append(0.0)
        self.lower.append(lower)
        self.upper.append(1.0 if binary else upper)
        if binary:
            self.binaries.append(j)
        return j

    def add_cost(self, terms, scale: float = 1.0) -> None:
        """cost += scale * sum c * x_j over (j, c) pairs."""
        for j, c in terms:
            self.cost[j] += scale * c

    def row(self, terms, lo: float = -math.inf, hi: float = math.inf) -> None:
        """lo <= sum c * x_j <= hi over (j, c) pairs; a column named twice adds its coefficients."""
        coeffs: dict[int, float] = {}
        for j, c in terms:
            coeffs[j] = coeffs.get(j, 0.0) + c
        self.rows.append((coeffs, lo, hi))

    def one_hot(self, columns) -> None:
        """Exactly one of `columns` (binaries) is 1: a unit's choice among its candidates."""
        cols = list(columns)
        self.row(((j, 1.0) for j in cols), 1.0, 1.0)
        self.groups.append(cols)

    @property
    def num_columns(self) -> int:
        return len(self.cost)


@dataclass
class Result:
    values: list[float] | None  # None: no integer point found (keep the start)
    objective: float  # including the offset; inf when `values` is None
    status: str  # "optimal", "node_limit" or "time_guard"
    gap: float  # relative, against the best bound proven (the LP relaxation's, or the solver's own)
    iterations: int = 0  # simplex iterations over every LP solved (HiGHS; 0 for CBC)
    nodes: int = 0  # branch-and-bound nodes solved (HiGHS; 0 for CBC)
    mip: bool = False  # HiGHS's MIP solver ran (the program outlasted `solve/branch.py`'s budget)


def solve_program(prog: Program, *, solver: str, gap: float, max_nodes: int, guard_s: float,
                  increment: float | None = None, start: dict[int, float] | None = None,
                  what: str = "a program", exact: bool = False,
                  branch_nodes: int = 0) -> Result:
    """The LP relaxation; if integral, that is the optimum. Otherwise branch-and-bound from
    `start` (values of the binaries, column -> value; the solver completes the rest) until within
    `gap` of the best bound or after `max_nodes` nodes.

    HiGHS: `solve/branch.py`'s branch-and-bound first, for up to `branch_nodes` nodes (the
    planner's programs close their gap in tens); a program it leaves open goes on in HiGHS's
    own MIP solver from its incumbent, whose cuts close hard gaps in fewer nodes. `exact` (the
    joint check's one program, proved to a gap near 0) goes to HiGHS's MIP directly. Either
    way the work of both is counted."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}: use 'highs' (default) or 'cbc'")
    t0 = time.perf_counter()
    if solver == "highs":
        res = _run_highs(prog, gap=gap, max_nodes=max_nodes, guard_s=guard_s,
                         increment=increment, start=start,
                         branch_nodes=0 if exact else branch_nodes)
        if res.values is None and res.status.lower() == "infeasible":
            raise RuntimeError(f"the integer program for {what} is infeasible; this is a bug, "
                               "please report it with the plan command you ran")
        return res
    lp = _run_cbc(prog, mip=False, gap=gap, max_nodes=max_nodes, guard_s=guard_s, increment=increment,
             start=None)
    if lp.values is None or lp.status != "optimal":
        raise RuntimeError(f"the linear program for {what} ended {lp.status}; this is a bug, "
                           "please report it with the plan command you ran")
    if all(abs(lp.values[j] - round(lp.values[j])) < INTEGRAL_TOL for j in prog.binaries):
        return Result(lp.values, lp.objective, "optimal", 0.0)
    bound = lp.objective  # no integer point is lower
    mip = _run_cbc(prog, mip=True, gap=gap, max_nodes=max_nodes, guard_s=guard_s, increment=increment,
              start=start)
    if mip.values is not None:  # the gap against the LP's bound
        mip.gap = max(0.0, (mip.objective - bound) / abs(mip.objective)) if mip.objective else 0.0
    return _ended(mip, time.perf_counter() - t0 >= guard_s * 0.98, gap)


def _ended(res: Result, guard_fired: bool, gap: float | None = None) -> Result:
    """A branch-and-bound result in the terms of `Result`: a stop before proving the optimum is
    the node limit's, or the wall-clock guard's if that fired."""
    stopped = "time_guard" if guard_fired else "node_limit"
    work = (res.iterations, res.nodes)
    if res.values is None:
        return Result(None, math.inf, stopped, 1.0, *work)
    if res.status == "optimal":  # optimal within `gap` of the solver's own bound
        return Result(res.values, res.objective, "optimal",
                      res.gap if gap is None else min(res.gap, gap), *work)
    return Result(res.values, res.objective, stopped, res.gap, *work)


# --- HiGHS, in this process -------------------------------------------------------------------

_HIGHS = None


def _highs():
    """One HiGHS instance per process (its first construction prints a banner on the C-level
    stdout, which is silenced here so that `plan` prints only its own lines)."""
    global _HIGHS
    if _HIGHS is None:
        try:
            import highspy
        except ImportError:
            raise ValueError("solver='highs' needs the highspy package: pip install highspy, "
                             "or use solver='cbc'") from None
        with _quiet_stdout():
            _HIGHS = highspy.Highs()
        _HIGHS.setOptionValue("output_flag", False)
    return _HIGHS


@contextlib.contextmanager
def _quiet_stdout():
    try:
        fd = os.dup(1)
    except OSError:  # no stdout to silence
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(fd, 1)
        os.close(fd)


def _run_highs(prog: Program, *, gap: float, max_nodes: int, guard_s: float,
               increment: float | None, start: dict[int, float] | None,
               branch_nodes: int) -> Result:
    """`solve/branch.py` for up to `branch_nodes` nodes, then (if its gap is still open)
    HiGHS's MIP solver from the best point found."""
    from titan_autopar.solve.branch import branch_and_bound

    t0 = time.perf_counter()
    abs_gap = increment if increment is not None else 1e-6
    work = (0, 0)
    if branch_nodes > 0:
        h = _highs_with(prog, mip=False, options=())
        found = branch_and_bound(h, prog.lower, prog.upper, prog.binaries, prog.groups, gap=gap,
                                 abs_gap=abs_gap, max_nodes=branch_nodes, guard_s=guard_s,
                                 start=start)
        work = (found.iterations, found.nodes)
        if found.status != "node_limit":
            return Result(found.values, found.objective, found.status, found.gap, *work)
        if found.values is not None:  # HiGHS goes on from the best point found
            start = {j: float(round(found.values[j])) for j in prog.binaries}
    h = _highs_with(prog, mip=True, options=(
        ("time_limit", max(1e-3, float(guard_s) - (time.perf_counter() - t0))),
        ("mip_rel_gap", float(gap)), ("mip_max_nodes", int(max_nodes)),
        ("mip_abs_gap", float(abs_gap))))
    if start is not None:
        import numpy as np

        h.setSolution(len(start), np.asarray(list(start), dtype=np.int32),
                      np.asarray(list(start.values()), dtype=np.float64))
    h.run()
    res = _ended(_highs_result(h), time.perf_counter() - t0 >= guard_s * 0.98)
    res.iterations += work[0]
    res.nodes += work[1]
    res.mip = True
    return res


def _highs_with(prog: Program, *, mip: bool, options):
    """This process's HiGHS instance holding `prog` (with its binaries integral if `mip`), on
    one thread with a fixed seed and `options`."""
    import highspy
    import numpy as np

    h = _highs()
    h.clearModel()
    h.clearSolver()
    h.resetOptions()
    for k, v in (("output_flag", False), ("threads", 1), ("random_seed", 0), *options):
        h.setOptionValue(k, v)
    n = prog.num_columns
    lp = highspy.HighsLp()
    lp.num_col_ = n
    lp.num_row_ = len(prog.rows)
    lp.col_cost_ = np.asarray(prog.cost, dtype=np.float64)
    lp.col_lower_ = np.asarray(prog.lower, dtype=np.float64)
    lp.col_upper_ = np.asarray(prog.upper, dtype=np.float64)
    lp.row_lower_ = np.asarray([r[1] for r in prog.rows], dtype=np.float64)
    lp.row_upper_ = np.asarray([r[2] for r in prog.rows], dtype=np.float64)
    starts, index, value = [0], [], []
    for coeffs, _, _ in prog.rows:
        index.extend(coeffs)
        value.extend(coeffs.values())
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.num_col_ = n
    lp.a_matrix_.num_row_ = len(prog.rows)
    lp.a_matrix_.start_ = np.asarray(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.asarray(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.asarray(value, dtype=np.float64)
    lp.offset_ = prog.offset
    if mip:
        kinds = [highspy.HighsVarType.kContinuous] * n
        for j in prog.binaries:
            kinds[j] = highspy.HighsVarType.kInteger
        lp.integrality_ = kinds
    h.passModel(lp)
    return h


def _highs_result(h) -> Result:
    """A finished HiGHS MIP run as a `Result`, with its work."""
    import highspy

    status = h.getModelStatus()
    info = h.getInfo()
    work = (max(0, int(info.simplex_iteration_count)), max(0, int(info.mip_node_count)))
    if info.primal_solution_status != 2:  # kSolutionStatusFeasible: no integer point
        return Result(None, math.inf, h.modelStatusToString(status), 1.0, *work)
    done = status == highspy.HighsModelStatus.kOptimal
    g = float(info.mip_gap)
    return Result(list(h.getSolution().col_value), float(info.objective_function_value),
                  "optimal" if done else "stopped", g if math.isfinite(g) else 1.0, *work)


# --- CBC, through PuLP ------------------------------------------------------------------------

def _run_cbc(prog: Program, *, mip: bool, gap: float, max_nodes: int, guard_s: float,
             increment: float | None, start: dict[int, float] | None) -> Result:
    import pulp

    lp = pulp.LpProblem("program", pulp.LpMinimize)
    binary = set(prog.binaries)
    xs = [lp.add_variable(f"x{j}", lowBound=prog.lower[j],
                          upBound=None if math.isinf(prog.upper[j]) else prog.upper[j],
                          cat="Binary" if j in binary else "Continuous")
          for j in range(prog.num_columns)]
    for coeffs, lo, hi in prog.rows:
        expr = pulp.LpAffineExpression({xs[j]: c for j, c in coeffs.items()})
        if lo == hi:
            lp += expr == lo
        else:
            if not math.isinf(lo):
                lp += expr >= lo
            if not math.isinf(hi):
                lp += expr <= hi
    lp += pulp.LpAffineExpression({x: c for x, c in zip(xs, prog.cost) if c}) + prog.offset
    if mip and start is not None:
        for j, v in start.items():
            xs[j].setInitialValue(v)
    with _solver_files() as tmp:
        s = pulp.PULP_CBC_CMD(msg=False, threads=1, mip=mip, timeLimit=guard_s,
                              gapRel=gap if mip else None, maxNodes=max_nodes if mip else None,
                              warmStart=mip and start is not None,
                              options=[f"increment {increment!r}"]
                              if mip and increment is not None else None)
        s.tmpDir = tmp
        try:
            lp.solve(s)
        except (OSError, pulp.PulpSolverError) as e:
            raise RuntimeError(f"the cbc solver failed while solving in {tmp} ({e}); if the "
                               "disk is full, free space there or point TMPDIR at a folder "
                               "with room") from None
    if lp.status != pulp.LpStatusOptimal:
        return Result(None, math.inf, pulp.LpStatus[lp.status], 1.0)
    values = [x.value() or 0.0 for x in xs]
    done = lp.sol_status == pulp.LpSolutionOptimal
    return Result(values, float(pulp.value(lp.objective) or 0.0),
                  "optimal" if done else "stopped", 0.0)


@contextlib.contextmanager
def _solver_files():
    """A temporary folder for CBC's files, removed afterwards."""
    try:
        tmp = tempfile.mkdtemp(prefix="titan_autopar_solver_")
    except OSError as e:
        raise RuntimeError(f"cannot create the solver's temporary folder in "
                           f"{tempfile.gettempdir()} ({e.strerror}): free space there or point "
                           "TMPDIR at a folder with room") from None
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
