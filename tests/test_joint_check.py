"""The exact check on the descent: on small problems its plan is within 1% of the joint optimum.

Each case plans one model twice on a simulated mesh: with the default solver (the per-mesh-dim
descent of `solve/descent.py`, from several starts) and with solver="joint" (one integer program
over the products of per-dim choices, `solve/joint.py`, solved to a proven optimum). The two are
compared on what both minimise -- the objective of `solve/ilp.py`: step time, plus the small
charge on hidden parameter communication, plus the memory penalty (zero for a plan within its
budget). The joint program's own objective must equal the exact price of the plan it returns
(the program prices what the plan predicts), and the joint optimum can be no worse than the
descent. "Tight" cases set the budget 5% above the memory floor (the least any placement
reaches), below what replicated parameters alone need, so sharding is forced.

The worst gap is printed at the end of the module:
    OMP_NUM_THREADS=1 pytest tests/test_joint_check.py
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

import titan_autopar.solve.planner as planner
from parity_models import DIM, MLP, Attention
from titan_autopar import plan_model
from titan_autopar.cost.hardware import GiB
from titan_autopar.solve.descent import objective_ms
from titan_autopar.solve.errors import MemoryBudgetError

QUIET = dict(progress=lambda s: None)
NAMES = {2: ("dp_shard", "tp"), 3: ("dp_replicate", "dp_shard", "tp")}
TOLERANCE = 0.01  # the descent's plan may cost at most 1% more than the joint optimum
TIGHT = 1.05  # a tight budget: this factor times the memory floor

# (model, mesh shape, batch, sequence, tight budget)
CASES = [
    ("mlp", (2, 2), 8, 32, False),
    ("mlp", (2, 2), 8, 32, True),
    ("mlp", (4, 2), 8, 16, True),
    ("attention", (2, 2), 8, 32, False),
    ("attention", (2, 2), 4, 16, True),
    ("llama3", (2, 2), 2, 64, False),
    ("llama3", (2, 2), 4, 32, True),
    ("llama3", (2, 2), 8, 16, False),
    ("mlp", (2, 2, 2), 8, 32, False),
    ("mlp", (2, 2, 2), 8, 32, True),
]
GAPS: list[tuple[float, str]] = []


def _id(case) -> str:
    model, shape, b, s, tight = case
    return f"{model}-{'x'.join(map(str, shape))}-{b}x{s}-{'tight' if tight else 'free'}"


@pytest.fixture(scope="module", autouse=True)
def worst_gap(request):
    """Prints the worst gap over the cases that ran, after the last of them."""
    yield
    if not GAPS:
        return
    gap, case = max(GAPS)
    line = f"joint check: worst descent gap {gap * 100:.3f}% over {len(GAPS)} cases ({case})"
    each = ", ".join(f"{c} {g * 100:.3f}%" for g, c in GAPS)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\n{line}\n  {each}", flush=True)


def _model(name: str, b: int, s: int, debug_model):
    if name == "llama3":
        return debug_model("llama3", s), (torch.zeros(b, s, dtype=torch.long),)
    with torch.device("meta"):
        model = MLP() if name == "mlp" else Attention()
    return model, (torch.zeros(b, s, DIM),)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_the_descent_is_within_one_percent_of_the_joint_optimum(case, mesh_of, debug_model,
                                                                 monkeypatch):
    name, shape, b, s, tight = case
    mesh = mesh_of(NAMES[len(shape)], shape)
    model, inputs = _model(name, b, s, debug_model)
    budget = None
    if tight:
        with pytest.raises(MemoryBudgetError) as e:
            plan_model(model, mesh, inputs, memory_budget_gib=1e-9, **QUIET)
        budget = TIGHT * e.value.floor / GiB
        replicated = sum(p.numel() for p in model.parameters()) * 16 / GiB  # fp32, AdamW
        assert budget < replicated, "the budget must force parameters to shard"

    # the joint program's own objective, beside the plan it returns
    programs = []

    def spy(pb, start, **kw):
        res = solve_joint(pb, start, **kw)
        programs.append((pb, res, kw["budget_bytes"]))
        return res

    solve_joint = planner.solve_joint
    monkeypatch.setattr(planner, "solve_joint", spy)
    descent = plan_model(model, mesh, inputs, memory_budget_gib=budget, **QUIET)
    joint = plan_model(model, mesh, inputs, memory_budget_gib=budget, solver="joint", **QUIET)

    (pb, res, budget_bytes), = programs
    assert res.status == "optimal"
    exact = objective_ms(pb.evaluate(res.assign), budget_bytes)
    assert math.isclose(res.objective, exact, rel_tol=1e-6), (res.objective, exact)
    assert joint.data["solver"]["name"] == "joint"
    assert joint.data["solver"]["best_start"] == "joint"
    assert joint.data["solver"]["status"] == "optimal"
    # the joint plan keeps the default input pins: batch over dp dims, replicated on tp
    inp = next(e for e in joint.data["nodes"].values() if e["op"] == "input")
    assert inp["out"][0] == ["S(0)" if n.startswith("dp") else "R" for n in joint.mesh_names]

    d = descent.timings["solve"]["objective_ms"]
    j = joint.timings["solve"]["objective_ms"]
    assert j == pytest.approx(exact, rel=1e-12)
    assert j <= d * (1 + 1e-6), "the joint optimum is worse than the descent: it is not exact"
    if tight:
        for plan in (descent, joint):
            assert plan.predicted["peak_memory_gib"] <= budget * (1 + 1e-6)
    gap = (d - j) / j
    GAPS.append((gap, _id(case)))
    assert gap <= TOLERANCE, f"the descent misses the joint optimum by {gap:.2%}"


def test_joint_respects_parameter_pins(mesh_of):
    mesh = mesh_of(NAMES[2], (2, 2))
    with torch.device("meta"):
        model = MLP()
    inputs = (torch.zeros(8, 32, DIM),)
    plan = plan_model(model, mesh, inputs, parameter_placements="fsdp", solver="joint", **QUIET)
    fsdp = plan_model(model, mesh, inputs, parameter_placements="fsdp", **QUIET)
    assert plan.parameters == fsdp.parameters
    # TorchTitan's FSDP shards every parameter over every rank, tp's included
    assert all(p == ["S(0)", "S(0)"] for p in plan.parameters.values()), plan.parameters
    joint, descent = (p.timings["solve"]["objective_ms"] for p in (plan, fsdp))
    assert joint <= descent * (1 + 1e-6)


def test_joint_refuses_a_large_problem_before_any_program(mesh_of, debug_model):
    mesh = mesh_of(NAMES[3], (2, 2, 2))
    lines = []
    with pytest.raises(ValueError, match=r"solver='joint' is an exact check for small problems: "
                       r"this one would need up to [\d,]+ variables \(limit [\d,]+") as e:
        plan_model(debug_model("llama3", 32), mesh, (torch.zeros(4, 32, dtype=torch.long),),
                   solver="joint", progress=lines.append)
    assert "solver='highs'" in str(e.value)
    assert not any(line.startswith("[solve]") for line in lines), lines


def test_an_unknown_solver_is_named(mesh_of):
    mesh = mesh_of(NAMES[2], (2, 2))
    with torch.device("meta"):
        model = MLP()
    with pytest.raises(ValueError, match=r"unknown solver 'gurobi': use 'highs' \(default\), "
                       r"'cbc', or 'joint'"):
        plan_model(model, mesh, (torch.zeros(8, 32, DIM),), solver="gurobi", **QUIET)
