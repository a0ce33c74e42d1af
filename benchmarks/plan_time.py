"""Planning time by phase, printed as one JSON line.

Cases: Llama3-8B (32 layers, seq 8192) on a 64-rank (dp_shard=8, tp=8) H100 mesh, and Llama3-70B
on a 128-rank 4-D mesh (dp_replicate=2, dp_shard=4, cp=2, tp=8), both simulated in this process.
Targets on a 2-core machine: 8B <= 20 s end to end, 70B 4-D <= 60 s.

  .venv/bin/python benchmarks/plan_time.py [--solver cbc|highs] [--case 8b|70b]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from titan_autopar import plan_model
from titan_autopar.cli import fake_mesh
from titan_autopar.titan.models import build_model, global_batch

CASES = {
    "8b": ("8B", ("dp_shard", "tp"), (8, 8), 8192),
    "70b": ("70B", ("dp_replicate", "dp_shard", "cp", "tp"), (2, 4, 2, 8), 8192),
}


def run(case: str, solver: str) -> dict:
    flavor, names, sizes, seq = CASES[case]
    t0 = time.perf_counter()
    model, _ = build_model("llama3", flavor, seq)
    mesh = fake_mesh(names, sizes)
    tokens = torch.zeros(global_batch(1, names, sizes), seq, dtype=torch.long)
    build = time.perf_counter() - t0
    plan = plan_model(model, mesh, (tokens,), solver=solver, progress=lambda s: None)
    total = time.perf_counter() - t0
    t = plan.timings
    return {
        "total_s": round(total, 2),
        "model_build_s": round(build, 2),
        "trace_s": round(t["trace"]["seconds"], 2),
        "blocks_s": round(t["blocks"]["seconds"], 3),
        "enumerate_s": round(t["enumerate"]["seconds"], 2),
        "ilp_build_s": round(t["solve"]["build_seconds"], 2),
        "solver_s": round(t["solve"]["solver_seconds"], 2),
        "solve_phase_s": round(t["solve"]["seconds"], 2),
        "plan_s": round(t["plan"]["seconds"], 2),
        "nodes": t["trace"]["nodes"],
        "units": t["enumerate"]["units"],
        "programs": t["solve"]["programs"],
        "max_variables": t["solve"]["max_variables"],
        "status": plan.data["solver"]["status"],
        "gap": plan.data["solver"]["gap"],
        "predicted_step_ms": round(plan.predicted["step_time_s"] * 1e3, 3),
        "recipe_step_ms": {r: round(v["step_time_s"] * 1e3, 3) for r, v in plan.data["recipes"].items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--solver", default="cbc", choices=["cbc", "highs"])
    ap.add_argument("--case", choices=sorted(CASES), action="append")
    a = ap.parse_args()
    out = {"benchmark": "plan_time", "solver": a.solver}
    for case in a.case or sorted(CASES):
        out[case] = run(case, a.solver)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
