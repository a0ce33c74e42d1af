"""One integer program, both solvers: the same optimum, the same stopping rule, nothing printed."""

from __future__ import annotations

import subprocess
import sys

import pytest

from titan_autopar.solve.program import Program, solve_program

LIMITS = dict(gap=1e-9, max_nodes=20000, guard_s=600.0)


def knapsack() -> tuple[Program, list[int]]:
    """min 100 - (10a + 13b + 7c) s.t. 4a + 6b + 3c <= 9, binaries. The LP relaxation is
    fractional (a = c = 1, b = 1/3: 21.33); the integer optimum takes b and c (20), not a and c
    (17), the start given below."""
    prog = Program()
    cols = [prog.column(binary=True) for _ in range(3)]
    prog.add_cost(zip(cols, (-10.0, -13.0, -7.0)))
    prog.row(zip(cols, (4.0, 6.0, 3.0)), hi=9.0)
    prog.offset = 100.0
    return prog, cols


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_both_solvers_find_the_integer_optimum(solver):
    prog, cols = knapsack()
    res = solve_program(prog, solver=solver, start={cols[0]: 1.0, cols[1]: 0.0, cols[2]: 1.0},
                        **LIMITS)
    assert res.status == "optimal"
    assert [round(res.values[j]) for j in cols] == [0, 1, 1]
    assert res.objective == pytest.approx(100.0 - 20.0)
    assert res.gap <= 1e-9


def test_highs_prints_nothing():
    """HiGHS prints a banner when a process first creates it, on the C-level stdout: `plan`
    must print only its own lines, so a fresh process solving one program prints nothing."""
    code = ("from titan_autopar.solve.program import Program, solve_program\n"
            "p = Program(); x = p.column(binary=True); p.add_cost([(x, 1.0)])\n"
            "solve_program(p, solver='highs', gap=0.0, max_nodes=10, guard_s=60.0)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "" and run.stderr == "", (run.stdout, run.stderr)


@pytest.mark.parametrize("solver", ["highs", "cbc"])
def test_an_integral_relaxation_is_the_answer(solver):
    prog = Program()
    x = [prog.column(binary=True) for _ in range(3)]
    prog.add_cost(zip(x, (3.0, 1.0, 2.0)))
    prog.row(((j, 1.0) for j in x), 1.0, 1.0)  # one choice of three
    res = solve_program(prog, solver=solver, **LIMITS)
    assert res.status == "optimal" and res.gap == 0.0
    assert [round(res.values[j]) for j in x] == [0, 1, 0] and res.objective == pytest.approx(1.0)


def test_a_repeated_column_sums_its_coefficients():
    prog = Program()
    a = prog.column(upper=10.0)
    prog.add_cost([(a, -1.0)])
    prog.row([(a, 1.0), (a, 1.0)], hi=4.0)  # 2a <= 4
    assert prog.rows[0][0] == {a: 2.0}
    res = solve_program(prog, solver="highs", **LIMITS)
    assert res.values[a] == pytest.approx(2.0)


def test_an_unknown_solver_is_named():
    prog, _ = knapsack()
    with pytest.raises(ValueError, match="use 'highs' \\(default\\) or 'cbc'"):
        solve_program(prog, solver="gurobi", **LIMITS)
