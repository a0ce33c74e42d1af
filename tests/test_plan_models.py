"""The planner on every TorchTitan model family, on simulated 1-D to 4-D meshes."""

from __future__ import annotations

import pytest
import torch

from titan_autopar import plan_model

MESHES = {
    "1d": (("dp_shard",), (4,)),
    "2d": (("dp_shard", "tp"), (2, 2)),
    "3d": (("dp_replicate", "dp_shard", "tp"), (2, 2, 2)),
    "4d": (("dp_replicate", "dp_shard", "cp", "tp"), (2, 2, 2, 2)),
}
CASES = [("llama3", "4d"), ("llama4", "2d"), ("llama4", "3d"), ("deepseek_v3", "1d"),
         ("deepseek_v3", "2d"), ("qwen3", "4d")]


@pytest.mark.parametrize("model_name,mesh_key", CASES)
def test_every_model_plans_within_pins_and_beats_the_recipes(model_name, mesh_key, mesh_of, debug_model):
    names, sizes = MESHES[mesh_key]
    mesh = mesh_of(names, sizes)
    model = debug_model(model_name, 64)
    dp = 1
    for n, s in zip(names, sizes):
        if n.startswith("dp"):
            dp *= s
    tokens = torch.zeros(dp, 64, dtype=torch.long)
    plan = plan_model(model, mesh, (tokens,), progress=lambda s: None)
    nodes = plan.data["nodes"]
    # default input pin: batch over the data-parallel dims, sequence over cp, replicated on tp
    want = ["S(0)" if n.startswith("dp") else "S(1)" if n == "cp" else "R" for n in names]
    inp = next(e for e in nodes.values() if e["op"] == "input")
    assert inp["out"][0] == want
    # every parameter has a placement per mesh dim, and its gradient arrives in it
    assert set(plan.parameters) == {n for n, _ in model.named_parameters()}
    assert all(len(p) == len(names) for p in plan.parameters.values())
    # the auto plan is never slower than a priced expert recipe
    for r, price in plan.data["recipes"].items():
        assert plan.predicted["step_time_s"] <= price["step_time_s"] * (1 + 1e-9), r
    # MoE blocks (data-dependent routing) are manual regions, planned data-parallel
    moe = [n for n, m in model.named_modules() if type(m).__name__ == "MoE"]
    assert sorted(plan.data["manual_regions"]) == sorted(moe)
    assert all(r["style"] == "data_parallel" for r in plan.data["manual_regions"].values())
    if moe:
        fwd = [e for e in nodes.values() if e["op"] == "titan_autopar.manual_forward.default"]
        assert len(fwd) == len(moe)
        for e in fwd:  # each rank's tokens: split or whole, per dim
            assert all(p in ("R", "S(0)") for p in e["out"][0]) and e["out"][0] == e["in"][0]
    # nothing fell back silently: a fallback is listed with its count
    assert all(isinstance(v, int) and v > 0 for v in plan.data["fallbacks"].values())
