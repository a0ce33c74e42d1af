"""The planner on TorchTitan's llama3: FSDP and TP emerge, pins hold, plans replay exactly."""

from __future__ import annotations

import json

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from conftest import tiny_llama
from titan_autopar import Plan, plan_model
from titan_autopar.plan import StalePlanError, fingerprint
from titan_autopar.solve.errors import MemoryBudgetError

QUIET = dict(progress=lambda s: None)


def test_fsdp_emerges_under_a_tight_budget(mesh_of, debug_model):
    mesh = mesh_of(("dp_shard",), (8,))
    model = debug_model("llama3")
    tokens = torch.zeros(8, 128, dtype=torch.long)
    free = plan_model(model, mesh, (tokens,), **QUIET)
    params = sum(p.numel() for p in model.parameters())
    replicated_gib = params * 16 / 2**30  # fp32 param + grad + two AdamW moments
    # just above the fully sharded state (1/8 of it per rank): every matrix must be sharded (at
    # half of it, replicating a few is as cheap, a tie the solvers break differently)
    budget = replicated_gib * 0.15 + free.predicted["memory_gib"]["activations"]
    plan = plan_model(model, mesh, (tokens,), memory_budget_gib=budget, **QUIET)
    assert plan.predicted["peak_memory_gib"] <= budget + 1e-6
    matrices = [n for n, p in model.named_parameters() if p.ndim == 2]
    assert len(matrices) == 2 + 7 * 6
    for n in matrices:
        assert plan.parameters[n][0].startswith("S("), (n, plan.parameters[n])
    # sharded weights are gathered for use, a matrix the backward reads again in the backward
    # (the program gathers it again there, as FSDP does): all but the embedding table, twice
    gathered = {"layers.0": 0, "": 0}  # bytes per step, by block
    for c in plan.data["collectives"]:
        if c["collective"] == "all_gather" and c["kind"] == "parameter" and c["bytes"] > 512:
            gathered[c["block"]] += c["bytes"] * c["count"]  # count: every repeat of the block
    per_element = gathered[""] / (2 * model.output.weight.numel() + model.tok_embeddings.weight.numel())
    assert per_element in (2, 4)  # the dtype each is gathered in
    in_layers = sum(p.numel() for n, p in model.named_parameters() if n in matrices and "layers." in n)
    assert gathered["layers.0"] == 2 * in_layers * per_element
    assert plan.predicted["step_time_s"] <= plan.data["recipes"]["fsdp"]["step_time_s"] * (1 + 1e-9)


def test_tp_emerges_when_weights_dominate(mesh_of):
    # few tokens per rank and wide layers: gathering weights costs more than TP's all-reduces
    mesh = mesh_of(("dp_shard", "tp"), (4, 8))
    model = tiny_llama(dim=4096, layers=2, seq=1024, n_heads=32, n_kv_heads=8,
                       ffn_dim_multiplier=1.3, multiple_of=1024)
    plan = plan_model(model, mesh, (torch.zeros(4, 1024, dtype=torch.long),), **QUIET)
    tp = plan.mesh_names.index("tp")
    for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3"):
        assert plan.parameters[f"layers.0.{name}.weight"][tp] == "S(0)", name  # column
    assert plan.parameters["layers.0.feed_forward.w2.weight"][tp] == "S(1)"  # row
    # wo row-parallel, or replicated with its input re-laid out by tokens: the same step
    assert plan.parameters["layers.0.attention.wo.weight"][tp] in ("S(1)", "R")
    assert "TP column over tp" in plan.explain()
    for r in ("fsdp", "fsdp_tp"):
        assert plan.predicted["step_time_s"] <= plan.data["recipes"][r]["step_time_s"] * (1 + 1e-9)


def test_pins_replan_and_round_trip(mesh_of, debug_model, tmp_path):
    mesh = mesh_of(("dp_shard", "tp"), (2, 2))
    model = debug_model("llama3")
    tokens = torch.zeros(2, 128, dtype=torch.long)
    pins = dict(input_placements=[(Shard(0), Replicate())],
                output_placements=[(Shard(0), Shard(2))])
    a = plan_model(model, mesh, (tokens,), **pins, **QUIET)
    nodes = a.data["nodes"]
    inp = next(n for n, e in nodes.items() if e["op"] == "input")
    assert nodes[inp]["out"][0] == ["S(0)", "R"]
    tangent = next(n for n, e in nodes.items() if e["op"] == "tangent")
    assert nodes[tangent]["out"][0] == ["S(0)", "S(2)"]
    assert a.data["solver"]["status"] in ("optimal", "time_limit")
    b = plan_model(model, mesh, (tokens,), **pins, **QUIET)
    assert a.to_json() == b.to_json()  # byte-identical replanning
    path = a.save(tmp_path / "p.json")
    c = Plan.load(path)
    assert c.to_json() == path.read_text()
    assert c.parameters == a.parameters
    assert "identical" in a.diff(c)
    json.loads(path.read_text())  # JSON only


def test_stale_plan_is_refused_saying_what_differs(mesh_of, debug_model, tmp_path):
    from titan_autopar.cost.hardware import get_hardware

    mesh = mesh_of(("dp_shard",), (2,))
    model = debug_model("llama3")
    tokens = torch.zeros(2, 128, dtype=torch.long)
    plan = plan_model(model, mesh, (tokens,), **QUIET)
    hw = get_hardware("h100")
    plan.check(fingerprint(model, (tokens,), ("dp_shard",), (2,), hw))
    with pytest.raises(StalePlanError, match="mesh"):
        plan.check(fingerprint(model, (tokens,), ("dp_shard",), (4,), hw))
    other = tiny_llama(layers=3)
    with pytest.raises(StalePlanError, match="model"):
        plan.check(fingerprint(other, (tokens,), ("dp_shard",), (2,), hw))


def test_budget_that_cannot_fit_names_the_floor(mesh_of, debug_model):
    mesh = mesh_of(("dp_shard",), (2,))
    model = debug_model("llama3")
    with pytest.raises(MemoryBudgetError) as e:
        plan_model(model, mesh, (torch.zeros(2, 128, dtype=torch.long),),
                   memory_budget_gib=0.001, **QUIET)
    err = e.value
    assert err.floor > 0.001 * 2**30
    msg = str(err)
    assert "at least" in msg and ("tok_embeddings.weight" in msg or "output.weight" in msg)


def test_bad_arguments_say_what_to_change(mesh_of, debug_model):
    mesh = mesh_of(("dp_shard",), (2,))
    model = debug_model("llama3")
    tokens = torch.zeros(2, 128, dtype=torch.long)
    with pytest.raises(ValueError, match="h100"):
        plan_model(model, mesh, (tokens,), hardware="h900", **QUIET)
    with pytest.raises(ValueError, match="highs"):
        plan_model(model, mesh, (tokens,), solver="gurobi", **QUIET)
    with pytest.raises(ValueError, match="one per dim"):
        plan_model(model, mesh, (tokens,), input_placements=[(Shard(0), Shard(0))], **QUIET)
