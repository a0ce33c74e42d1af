"""The integer program over candidate choices, every operator at once.

Notation. Units u (representative nodes, weight w_u = how many graph nodes they stand for), each
with candidates s in S_u: full N-D choices (one single-dim strategy per mesh dim). For the
per-dim program of `solve_dim` (what the descent runs), S_u(m) are the single-dim strategies u may
take on mesh dim m while its choices on the other mesh dims stay as in the current assignment;
for the exact check of `solve/joint.py`, S_u is every product of per-dim strategies.
Edges e = (p, i) -> (c, k): output i of p feeds input k of c, weight w_e. For a candidate s,
out_i(s) is its N-D placement of output i and in_k(s) the placement it requires of input k. All
prices are exact for the full N-D placement, from `solve/problem.py`:
  T_u(s)  compute time of u, already times w_u          (cost/compute.py; a manual region's
          op adds its own collectives, cost/regions.py, which hide no parameter communication)
  M_u(s)  memory bytes of u, already times w_u           (cost/memory.py)
  C_e(a,b) time to redistribute from out placement a to in placement b, times w_e (cost/comm.py)

Variables
  x[u,s] in {0,1}                         u takes option s                   (`_choice_vars`)
  y[e,a,b] >= 0                           edge e goes from a to b            (`solve_candidates`)
  E_g >= 0                                exposed parameter comm of group g  (`solve_candidates`)
  X >= 0                                  memory above the budget            (`solve_candidates`)

Constraints
  sum_s x[u,s] = 1                                                 one choice per unit
  sum_b y[e,a,b] = sum_{s: out_i(s)=a} x[p,s]     for every a      producer agreement
  sum_a y[e,a,b] = sum_{s: in_k(s)=b} x[c,s]      for every b      consumer agreement
      (an edge whose producer or consumer has one distinct placement needs no y: its price is
       linear in the other side's x)
  E_g >= sum_{e param-side in g} sum_{a,b} C_e(a,b) y[e,a,b] - alpha * sum_{u in g,s} T_u(s) x[u,s]
      parameter all-gathers and gradient reductions of a block hide behind that block's compute
      (alpha = Hardware.overlap_efficiency); g is a repeated-block class or the rest of the model
  sum_{u,s} M_u(s) x[u,s] - X <= budget                            per-rank memory

Objective (milliseconds)
  min  sum T_u(s) x[u,s] + sum_{e not param-side} C_e(a,b) y[e,a,b] + sum_g E_g
       + eps * sum_{e param-side} C_e(a,b) y[e,a,b] + P * X
  with P a penalty (1e6 ms per GiB) large enough that any feasible plan beats any infeasible one,
  and eps (HIDDEN_COMM_WEIGHT) a small charge for hidden communication -- it still takes link
  bandwidth and SMs -- that also breaks ties against needless collectives.

Stopping rule. The LP relaxation is solved first; where it is integral (the usual case) that is
the optimum. It is not where an overlap row is tight (E_g > 0 with the collectives just above
alpha times the compute: a mixture of a cheap and a costly candidate then hides the collectives
more cheaply than either), and branch-and-bound runs (`solve/branch.py` for up to
`SolveLimits.branch_nodes` nodes, then HiGHS's own) until the incumbent is within
`SolveLimits.gap` of the best bound, or `SolveLimits.max_nodes` nodes were explored: all are
counts, so the same program gives the same answer on a busy machine and an idle one. A
wall-clock guard stops a runaway program only, and says so ("time_guard").

Forward/backward agreement is an edge like any other: a parameter's unit takes its gradient as an
input that must arrive in the parameter's own placement; the tangent's unit takes the model
output likewise. Pins restrict S_u to the pinned placement.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from titan_autopar.cost.hardware import GiB
from titan_autopar.solve.problem import Problem
from titan_autopar.solve.program import Program, solve_program

MEMORY_PENALTY_MS_PER_GIB = 1e6
HIDDEN_COMM_WEIGHT = 0.02


@dataclass(frozen=True)
class SolveLimits:
    """When branch-and-bound stops. Only `gap`, `branch_nodes` and `max_nodes` decide where it
    stops -- all counted, not timed, so a plan depends on its inputs alone, never on the machine's load.
    `guard_s` is a wall-clock guard against a runaway program: when it fires the result depends
    on timing, and the plan's solver status says "time_guard"."""

    # relative gap to the best bound at which a program counts as solved: at 0.5% HiGHS stopped
    # on incumbents that left 70B plans 0.4-0.6% slower than at 0.1%, to save 1-1.5 s of 23-29 s
    gap: float = 0.001
    max_nodes: int = 20000  # branch-and-bound nodes per program
    # nodes of `solve/branch.py`'s own branch-and-bound before HiGHS's MIP solver takes over the
    # program: the planner's programs close their gap in tens (at most 33 on Llama3 8B and 70B),
    # a few need cuts to (HiGHS's own) and would take thousands of plain branches
    branch_nodes: int = 64
    guard_s: float = 600.0  # seconds
    # the least improvement (ms) branch-and-bound looks for past an incumbent; None: the
    # solver's own (CBC's 1e-5 ms, HiGHS's 1e-6 ms: a sizeable fraction of a tiny model's step)
    increment: float | None = None


@dataclass
class DimSolve:
    assign: list[tuple[int, ...]]
    status: str
    objective: float  # ms, including any memory penalty
    gap: float
    variables: int
    constraints: int
    build_seconds: float
    solve_seconds: float
    iterations: int = 0  # simplex iterations (the solver's deterministic work)
    nodes: int = 0  # branch-and-bound nodes
    mip: bool = False  # finished by HiGHS's MIP solver, past `SolveLimits.branch_nodes`


def _with(choice: tuple[int, ...], m: int, s: int) -> tuple[int, ...]:
    return choice[:m] + (s,) + choice[m + 1 :]


def dim_candidates(pb: Problem, assign, m: int) -> list[dict[int, tuple[int, ...]]]:
    """Per unit, its candidates on mesh dim m, keyed by the option on dim m: `assign[u]` with
    dim m replaced by each allowed option that splits evenly (the current one if none does)."""
    cands = []
    for u in range(len(pb.units)):
        opts = [s for s in pb.allowed(u, m) if pb.unit_price(u, _with(assign[u], m, s)) is not None]
        if not opts:
            opts = [assign[u][m]]
        cands.append({s: _with(assign[u], m, s) for s in opts})
    return cands


def _choice_vars(prog: Program, cands) -> list[dict[int, int] | None]:
    """Binary columns per unit over its candidates (None where it has only one)."""
    return [None if len(c) == 1 else {k: prog.column(binary=True) for k in c} for c in cands]


def _keys_by_value(d: dict) -> dict:
    """value -> the keys that map to it, in key order (one hash per key, not one comparison per
    key and value: placements compare slowly)."""
    out: dict = {}
    for k, v in d.items():
        out.setdefault(v, []).append(k)
    return out


def _placement_order(pb: Problem):
    """A sort key over numbered placements: their text, as the programs order their columns."""
    texts: dict[int, str] = {}

    def key(n: int) -> str:
        t = texts.get(n)
        if t is None:
            t = texts[n] = repr(pb.placements[n])
        return t
    return key


def _lin(xs, u: int, coeffs: dict[int, float]):
    """sum_s coeffs[s] * x[u,s] as (column terms, constant)."""
    if xs[u] is None:
        (s, c), = coeffs.items()
        return [], c
    return [(xs[u][s], c) for s, c in coeffs.items() if c], 0.0


def solve_dim(
    pb: Problem,
    assign: list[tuple[int, ...]],
    m: int,
    *,
    budget_bytes: float,
    solver: str = "highs",
    limits: SolveLimits | None = None,
) -> DimSolve:
    """The program for mesh dim m, the other dims held at `assign` (started from it)."""
    t0 = time.perf_counter()
    return solve_candidates(pb, dim_candidates(pb, assign, m), assign,
                            what=f"mesh dim {m}", budget_bytes=budget_bytes, solver=solver,
                            limits=limits, t0=t0)


def solve_candidates(
    pb: Problem,
    cands: list[dict[int, tuple[int, ...]]],
    start: list[tuple[int, ...]],
    *,
    what: str,
    budget_bytes: float,
    solver: str = "highs",
    limits: SolveLimits | None = None,
    t0: float | None = None,
    exact: bool = False,
) -> DimSolve:
    """Build and solve the program over `cands` (per unit: key -> full N-D choice; a key names
    the unit's binary) and return each unit's chosen candidate. `start`, a feasible assignment
    within the candidates, warm-starts branch-and-bound and is what a program stopped before
    any integer point returns. `what` names the program in errors; `t0` is when building began;
    `exact` proves the optimum with the solver's own MIP search (`solve/program.py`)."""
    t0 = time.perf_counter() if t0 is None else t0
    ms = 1e3
    prog = Program()
    xs = _choice_vars(prog, cands)
    objective: list = []
    const = 0.0
    # one choice per unit; compute and memory
    group_compute: dict[str, list] = {}
    group_compute_const: dict[str, float] = {}
    mem_terms: list = []
    mem_const = 0.0
    for u, opts in enumerate(cands):
        if xs[u] is not None:
            prog.one_hot(xs[u].values())
        comp, hides, mem = {}, {}, {}
        for s, choice in opts.items():
            c, mm = pb.unit_price(u, choice)
            comp[s] = c * ms
            hides[s] = pb.hiding_compute(u, choice, c) * ms
            mem[s] = sum(mm.values()) / GiB
        terms, k = _lin(xs, u, comp)
        objective += terms
        const += k
        g = pb.units[u].block
        terms, k = _lin(xs, u, hides)
        group_compute.setdefault(g, []).extend(terms)
        group_compute_const[g] = group_compute_const.get(g, 0.0) + k
        terms, k = _lin(xs, u, mem)
        mem_terms += terms
        mem_const += k

    # edges, their placements by number (`Problem.placement_id`), ordered as their text
    order = _placement_order(pb)
    group_param: dict[str, list] = {}
    group_param_const: dict[str, float] = {}
    for ei, e in enumerate(pb.edges):
        p, c = e.src, e.dst
        src_of = {s: pb.placement_id(p, ch, e.out) for s, ch in cands[p].items()}
        dst_of = {s: pb.in_placement_id(c, ch, e.arg) for s, ch in cands[c].items()}
        src_keys = _keys_by_value(src_of)  # placement -> the candidates that give it
        dst_keys = _keys_by_value(dst_of)
        A = sorted(src_keys, key=order)
        B = sorted(dst_keys, key=order)
        if e.param_side:
            g = pb.edge_group(e)
            sink = group_param.setdefault(g, [])
        else:
            sink = objective
        added_const = 0.0
        if len(A) == 1 or len(B) == 1:
            if len(A) == 1 and len(B) == 1:
                added_const = pb.edge_price_of(ei, A[0], B[0]) * ms
            elif len(A) == 1:
                coeffs = {s: pb.edge_price_of(ei, A[0], b) * ms for s, b in dst_of.items()}
                terms, k = _lin(xs, c, coeffs)
                sink += terms
                added_const = k
            else:
                coeffs = {s: pb.edge_price_of(ei, a, B[0]) * ms for s, a in src_of.items()}
                terms, k = _lin(xs, p, coeffs)
                sink += terms
                added_const = k
        else:
            ys = {}
            for ai, a in enumerate(A):
                for bi, b in enumerate(B):
                    y = prog.column()
                    ys[ai, bi] = y
                    cost = pb.edge_price_of(ei, a, b) * ms
                    if cost:
                        sink.append((y, cost))
            for ai, a in enumerate(A):
                prog.row([(ys[ai, bi], 1.0) for bi in range(len(B))]
                         + [(xs[p][s], -1.0) for s in src_keys[a]], 0.0, 0.0)
            for bi, b in enumerate(B):
                prog.row([(ys[ai, bi], 1.0) for ai in range(len(A))]
                         + [(xs[c][s], -1.0) for s in dst_keys[b]], 0.0, 0.0)
        if e.param_side:
            group_param_const[g] = group_param_const.get(g, 0.0) + added_const
            const += HIDDEN_COMM_WEIGHT * added_const
        else:
            const += added_const

    # overlap of parameter communication with compute, per group:
    # E_g - param terms + alpha * compute terms >= param const - alpha * compute const
    alpha = pb.hw.overlap_efficiency
    for g, terms in group_param.items():
        if not terms and not group_param_const.get(g):
            continue
        eg = prog.column()
        prog.add_cost(terms, HIDDEN_COMM_WEIGHT)
        prog.row([(eg, 1.0)] + [(v, -c) for v, c in terms]
                 + [(v, alpha * c) for v, c in group_compute.get(g, [])],
                 lo=group_param_const.get(g, 0.0) - alpha * group_compute_const.get(g, 0.0))
        objective.append((eg, 1.0))

    # memory budget (soft, with a penalty that dominates any step time)
    excess = prog.column()
    prog.row(mem_terms + [(excess, -1.0)], hi=budget_bytes / GiB - mem_const)
    objective.append((excess, MEMORY_PENALTY_MS_PER_GIB))
    prog.add_cost(objective)
    prog.offset = const
    n_vars = prog.num_columns
    n_cons = len(prog.rows)
    build_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    limits = limits or SolveLimits()
    # `start` is a feasible point: branch-and-bound starts from it
    warm: dict[int, float] = {}
    for u, x in enumerate(xs):
        if x is not None:
            for s_, j in x.items():
                warm[j] = 1.0 if cands[u][s_] == start[u] else 0.0
    res = solve_program(prog, solver=solver, gap=limits.gap, max_nodes=limits.max_nodes,
                        guard_s=limits.guard_s, increment=limits.increment, start=warm, what=what,
                        exact=exact, branch_nodes=limits.branch_nodes)
    if res.values is None:  # stopped before any integer point: keep `start`
        return DimSolve(list(start), res.status, math.inf, 1.0, n_vars, n_cons, build_s,
                        time.perf_counter() - t1, res.iterations, res.nodes, res.mip)
    new = list(start)
    for u, opts in enumerate(cands):
        if xs[u] is None:
            (s,) = opts
        else:
            vals = {s: res.values[j] for s, j in xs[u].items()}
            s = max(sorted(vals), key=lambda k: vals[k])
        new[u] = opts[s]
    return DimSolve(new, res.status, res.objective, res.gap, n_vars, n_cons, build_s,
                    time.perf_counter() - t1, res.iterations, res.nodes, res.mip)
