"""The planning-work guard: how much the planner works on fixed cases, counted, not timed.

Planning time moves with the machine's load, so a slowdown hides in its noise; the work does
not. Each case plans a TorchTitan llama3 on a simulated mesh -- Llama3-8B on 8x8, the case whose
programs once took 24 s to solve, and the debug model on a 4-D mesh in bf16 with selective
checkpointing -- and counts what the planner did: integer programs solved, simplex iterations and branch-and-bound nodes over them,
programs that needed HiGHS's MIP solver (whose presolve, cuts and heuristics are work that its
simplex iterations do not show: the 24 s of solving that once went unnoticed was theirs) (the
plan's `solver` section), and nodes traced (`timings.trace.traced_nodes`: the graph is
stamped from four traced blocks, `graph/stamp.py`). The test fails when any count grows more
than ALLOWED_GROWTH over its figure in `plan_work.json` beside this file, or falls below
TIGHTEN_BELOW of it (then the figure is stale and the guard too loose). Changing a figure is a
visible, reviewed change: regenerate the file with

    OMP_NUM_THREADS=1 .venv/bin/python tests/test_plan_work.py --write
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

FIGURES = Path(__file__).with_name("plan_work.json")
ALLOWED_GROWTH = 1.25  # a count may grow 25% over its committed figure
TIGHTEN_BELOW = 0.75  # a count under 75% of its figure asks for the figure to be lowered

# name: (flavor, sequence, mesh dim names, sizes, activation checkpointing, compute dtype)
CASES = {
    "llama3_8b_2d": ("8B", 8192, ("dp_shard", "tp"), (8, 8), "none", None),
    "llama3_debug_4d_bf16": ("debugmodel", 256, ("dp_replicate", "dp_shard", "cp", "tp"),
                             (2, 2, 2, 2), "selective", torch.bfloat16),
}
COUNTS = ("programs", "simplex_iterations", "nodes", "mip_programs", "traced_nodes")


def measure(case: str) -> dict[str, int]:
    from titan_autopar import plan_model
    from titan_autopar.fake_mesh import fake_mesh
    from titan_autopar.titan.models import build_model, global_batch

    flavor, seq, names, sizes, ac, dtype = CASES[case]
    model, _ = build_model("llama3", flavor, seq)
    tokens = torch.zeros(global_batch(1, names, sizes), seq, dtype=torch.long)
    plan = plan_model(model, fake_mesh(names, sizes), (tokens,), hardware="h100",
                      activation_checkpointing=ac, param_dtype=dtype, progress=lambda s: None)
    solver = plan.data["solver"]
    return {"programs": solver["programs"], "simplex_iterations": solver["simplex_iterations"],
            "nodes": solver["nodes"], "mip_programs": solver["mip_programs"],
            "traced_nodes": plan.timings["trace"]["traced_nodes"]}


@pytest.mark.parametrize("case", sorted(CASES))
def test_planning_work_stays_within_its_committed_figure(case):
    committed = json.loads(FIGURES.read_text())[case]
    now = measure(case)
    for k in COUNTS:
        assert now[k] <= committed[k] * ALLOWED_GROWTH, (
            f"{case}: {k} grew to {now[k]} from the committed {committed[k]} (more than "
            f"{ALLOWED_GROWTH - 1:.0%}): find what made planning work harder, or raise the "
            f"figure in {FIGURES.name} in a reviewed change")
        assert now[k] >= committed[k] * TIGHTEN_BELOW, (
            f"{case}: {k} fell to {now[k]} from the committed {committed[k]}: lower the figure "
            f"in {FIGURES.name} (`python tests/test_plan_work.py --write`) so the guard stays "
            "tight")


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    figures = {case: measure(case) for case in sorted(CASES)}
    FIGURES.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(json.dumps(figures))
