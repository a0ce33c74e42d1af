"""Manual regions: marking, their declarations on a mesh, the trace, the plan around them, and a
user-written MoE block with its own all-to-all run on real gloo ranks against one device."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard

from dist_harness import read_result, run_ranks, write_result
from titan_autopar import Plan, apply_plan, manual, plan_model
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.graph.manual import (ManualRegionError, find_manual_regions, mark_matching,
                                        mark_style, resolve_all)
from titan_autopar.graph.manual_ops import BACKWARD, FORWARD
from titan_autopar.graph.trace import trace_joint
from titan_autopar.plan import StalePlanError
from titan_autopar.titan.models import build_model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import manual_moe  # noqa: E402  (the example of docs/manual_regions.md)

QUIET = dict(progress=lambda s: None)
MOE_MODELS = {"deepseek_v3": ("debugmodel", [f"layers.{i}.moe" for i in range(1, 6)]),
              "qwen3": ("debugmodel_moe", [f"layers.{i}.moe" for i in range(8)]),
              "llama4": ("debugmodel", ["layers.1.moe", "layers.3.moe", "layers.5.moe"])}


def _calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is target]


@pytest.mark.parametrize("name", MOE_MODELS)
def test_moe_blocks_trace_as_one_op_each_way(name):
    flavor, blocks = MOE_MODELS[name]
    model, _ = build_model(name, flavor, 64)
    found = [q for q, _, _ in find_manual_regions(model)]
    assert found == blocks  # unmarked TorchTitan MoE blocks are data-parallel regions
    resolved = resolve_all(model, ("dp_shard",), (4,))
    jg = trace_joint(model, (torch.zeros(4, 64, dtype=torch.long),), None, resolved)
    fwd, bwd = _calls(jg.gm, FORWARD), _calls(jg.gm, BACKWARD)
    assert [n.args[2] for n in fwd] == blocks and [n.args[3] for n in bwd] == blocks[::-1]
    targets = {str(n.target) for n in jg.gm.graph.nodes if n.op == "call_function"}
    assert not any("histc" in t or "argsort" in t or "grouped_mm" in t for t in targets)
    # parameters enter in the block's named_parameters order; gradients come out per parameter
    phs = {n: p for n, p in zip([n for n in jg.gm.graph.nodes if n.op == "placeholder"],
                                jg.param_names)}
    block = model.get_submodule(blocks[0])
    own = [f"{blocks[0]}.{p}" for p, _ in block.named_parameters()]
    assert [phs[p] for p in fwd[0].args[1]] == own
    assert len(bwd[-1].meta["val"]) == 1 + len(own)
    for q in blocks:  # the instances' own forwards are back
        assert "forward" not in model.get_submodule(q).__dict__


def test_declarations_on_a_mesh_and_their_errors():
    model = manual_moe.Model()
    manual_moe.mark(model)
    r = resolve_all(model, ("dp_shard", "ep"), (2, 2))["moe"]
    assert r.ins == [(Shard(0), Shard(0))] and r.outs == [(Shard(0), Shard(0))]
    assert r.params == {"gate.weight": (Replicate(), Replicate()), "w": (None, Shard(0))}
    with pytest.raises(ManualRegionError, match="names mesh dim 'ep', which the mesh does not have"):
        resolve_all(model, ("dp_shard", "tp"), (2, 2))
    manual(model.moe, in_placements=[(Shard(0),)], out_placements=[(Shard(0), Shard(0))])
    with pytest.raises(ManualRegionError, match=r"in_placements\[0\] has 1 placements, the mesh has 2"):
        resolve_all(model, ("dp_shard", "ep"), (2, 2))
    with pytest.raises(ManualRegionError, match="param_placements names \\['v'\\]"):
        manual(model.moe, in_placements=[{}], out_placements=[{}], param_placements={"v": {}})
    ds, _ = build_model("deepseek_v3", "debugmodel", 64)  # 8 experts
    mark_matching(ds, ["layers.*.moe"], "torchtitan_ep")
    with pytest.raises(ManualRegionError, match="expert_parallel_degree = 3 does not divide the 8"):
        resolve_all(ds, ("dp_shard", "ep"), (2, 3))
    with pytest.raises(ManualRegionError, match="matches no module of the model"):
        mark_matching(ds, ["layers.*.experts_typo"], "torchtitan_ep")
    with pytest.raises(ManualRegionError, match="is for TorchTitan MoE blocks"):
        mark_style(ds.layers["1"].moe.experts, "torchtitan_ep")
    with pytest.raises(ManualRegionError, match="mesh has no ep dim"):
        resolve_all(ds, ("dp_shard",), (4,))


def test_expert_parallel_plan_keeps_what_the_region_declares(mesh_of):
    model, _ = build_model("deepseek_v3", "debugmodel", 64)
    mark_matching(model, ["layers.*.moe"], "torchtitan_ep")
    mesh = mesh_of(("dp_shard", "ep"), (2, 2))
    plan = plan_model(model, mesh, (torch.zeros(4, 64, dtype=torch.long),), **QUIET)
    regions = plan.data["manual_regions"]
    assert sorted(regions) == [f"layers.{i}.moe" for i in range(1, 6)]
    assert regions["layers.1.moe"]["params"]["experts.w1"] == [None, "S(0)"]
    for w in ("w1", "w2", "w3"):  # each ep rank stores its own experts, whatever dp_shard holds
        assert plan.parameters[f"layers.1.moe.experts.{w}"][1] == "S(0)"
    a2a = [c for c in plan.data["collectives"] if c["kind"] == "region"]
    assert a2a and all(c["collective"] == "all_to_all" and c["mesh_dim"] == "ep" for c in a2a)
    assert sum(c["count"] for c in a2a) == 5 * (2 + 4)  # 5 blocks: 2 forward, 4 backward
    assert plan.predicted["step_time_s"] <= plan.data["recipes"]["fsdp"]["step_time_s"] * (1 + 1e-9)
    # the model a plan is applied to must carry the same marks
    other, _ = build_model("deepseek_v3", "debugmodel", 64)
    with pytest.raises(StalePlanError, match="manual regions differ"):
        apply_plan(other, Plan(json.loads(plan.to_json())), mesh, **QUIET)


# ------------------------------------------------------------------ the example on gloo ranks
DIM, EXPERTS, BATCH, SEQ = 32, 8, 8, 4


def _count_all_to_all():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if "all_to_all" in str(func) or "alltoall" in str(func):
                Count.calls += 1
            return func(*args, **(kwargs or {}))

    return Count


def example_worker(rank: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from titan_autopar.apply.init import local_slice

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "ep"))
    torch.manual_seed(0)
    ref = manual_moe.Model(DIM, EXPERTS, ep=1)
    model = manual_moe.mark(copy.deepcopy(ref))
    model.moe.ep = 2
    x = torch.randn(BATCH, SEQ, DIM, generator=torch.Generator().manual_seed(1))
    weight = torch.randn(BATCH, SEQ, DIM, generator=torch.Generator().manual_seed(2))
    model = apply_plan(model, Plan.load(f"{out_dir}/plan.json"), mesh, **QUIET)
    model.moe.group = mesh["ep"].get_group()
    prog = model.autopar
    Count = _count_all_to_all()
    with Count():
        out = model(local_slice(x, mesh, prog.input_placements[0]))
        (out * local_slice(weight, mesh, prog.output_placement)).sum().backward()
    r = ref(x)
    (r * weight).sum().backward()
    full = torch.distributed.tensor.DTensor.from_local(out, mesh, prog.output_placement,
                                                      shape=r.shape, stride=r.stride()).full_tensor()
    fwd = ((full - r).abs().max() / r.abs().max()).item()
    grads = {n: ((p.grad.full_tensor() - q.grad).abs().max() / q.grad.abs().max()).item()
             for (n, p), q in zip(model.named_parameters(), ref.parameters())}
    if rank == 0:
        write_result(out_dir, "example", {"fwd_rel": fwd, "grad_rel": grads,
                                          "all_to_all_calls": Count.calls,
                                          "program_collectives": prog.collectives(),
                                          "w_placements": str(model.moe.w.placements)})


def test_the_user_written_moe_block_matches_one_device(tmp_path):
    mesh = fake_mesh(("dp_shard", "ep"), (2, 2))
    with torch.device("meta"):
        planned = manual_moe.mark(manual_moe.Model(DIM, EXPERTS, ep=2))
    x = torch.zeros(BATCH, SEQ, DIM, device="meta")
    plan_model(planned, mesh, (x,), **QUIET).save(tmp_path / "plan.json")
    run_ranks(example_worker, 4, str(tmp_path))
    res = read_result(tmp_path, "example")
    assert res["fwd_rel"] <= 1e-5, res
    assert max(res["grad_rel"].values()) <= 1e-4, res
    # the planner's program has no all-to-all of its own: the 8 that ran are the block's -- in
    # the forward its counts and its two token exchanges, in the backward the same three again
    # (the forward is recomputed) and the reverse of the two token exchanges
    assert not any("all_to_all" in k for k in res["program_collectives"]), res
    assert res["all_to_all_calls"] == 8, res
    assert res["w_placements"].endswith("Shard(dim=0))"), res["w_placements"]  # on ep, as declared


class Doubler(nn.Module):
    """Doubles its input: the local shard in, the local shard out."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(DIM, DIM)

    def forward(self, x):
        return 2 * x


class WithDoubler(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Doubler()

    def forward(self, x):
        return self.inner(x) + 1


def contract_worker(rank: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from titan_autopar.apply.init import local_slice

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
    model = WithDoubler()
    manual(model.inner, in_placements=[(Shard(0),)], out_placements=[(Replicate(),)])
    model = apply_plan(model, Plan.load(f"{out_dir}/plan.json"), mesh, **QUIET)
    x = torch.randn(BATCH, SEQ, DIM)
    try:
        model(local_slice(x, mesh, model.autopar.input_placements[0]))
        msg = "no error"
    except ManualRegionError as e:
        msg = str(e)
    if rank == 0:
        write_result(out_dir, "contract", {"error": msg})


def test_a_declaration_the_code_does_not_keep_stops_at_the_first_step(tmp_path):
    """The region says its output is whole on every rank (Replicate) but returns the local
    shard: the first step stops, naming the region and both shapes."""
    with torch.device("meta"):
        planned = WithDoubler()
    manual(planned.inner, in_placements=[(Shard(0),)], out_placements=[(Replicate(),)])
    plan_model(planned, fake_mesh(("dp_shard",), (2,)), (torch.zeros(BATCH, SEQ, DIM),),
               **QUIET).save(tmp_path / "plan.json")
    run_ranks(contract_worker, 2, str(tmp_path))
    msg = read_result(tmp_path, "contract")["error"]
    assert "manual region 'inner' returned local outputs of shapes [(4, 4, 32)]" in msg, msg
    assert "imply [(8, 4, 32)]" in msg and "make the declaration match" in msg, msg
