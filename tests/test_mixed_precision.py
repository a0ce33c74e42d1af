"""Mixed precision (`plan_model(param_dtype=torch.bfloat16)`, what `mixed_precision_param`
selects under auto): the program computes with bf16 casts of the fp32 parameters (every matmul
in bf16) and returns fp32 gradients. Against the single-process model run with bf16-cast
parameters: the forward is equal up to bf16 rounding (1e-2; measured 0) and the gradients, whose
bf16 partial sums are added in another order, agree to 3e-2 relative to the largest entry
(measured 5e-3)."""

from __future__ import annotations

import torch

from dist_harness import read_result, run_ranks
from parity_models import inputs_of, meta_model, mixed_precision_worker
from titan_autopar import plan_model
from titan_autopar.fake_mesh import fake_mesh


def test_bf16_compute_fp32_gradients(tmp_path):
    mesh = fake_mesh(("dp_shard",), (2,))
    plan = plan_model(meta_model("llama3"), mesh, tuple(x.to("meta") for x in inputs_of("llama3")),
                      param_dtype=torch.bfloat16, progress=lambda s: None)
    assert plan.data["param_dtype"] == "bfloat16"
    plan.save(tmp_path / "plan.json")
    run_ranks(mixed_precision_worker, 2, str(tmp_path / "plan.json"), str(tmp_path))
    r = read_result(tmp_path, "mixed_precision")
    assert r["output_dtype"] == "torch.bfloat16"
    assert r["fwd_rel"] <= 1e-2, r
    assert r["grad_rel"] <= 3e-2, r
    assert r["grad_dtypes"] == ["torch.float32"]
    assert r["matmul_dtypes"] == ["torch.bfloat16"], r  # every forward matmul runs in bf16


def test_casts_share_their_block():
    """Each layer's parameter casts (before the forward) and gradient casts (after the backward)
    are one representative per class, counted once per layer and grouped with its block: the
    program's size does not grow with the layer count, and a layer's all-gathers hide behind
    its own compute."""
    from conftest import tiny_llama
    from titan_autopar.graph.blocks import find_blocks
    from titan_autopar.graph.trace import trace_joint

    tokens = torch.zeros(2, 32, dtype=torch.long)
    reps = {}
    for layers in (2, 4):
        jg = trace_joint(tiny_llama(dim=64, layers=layers, seq=32, n_heads=4), (tokens,),
                         torch.bfloat16, {})
        b = find_blocks(jg)
        reps[layers] = len(set(b.rep.values()))
        p0, p3 = (jg.param_nodes[f"layers.{i}.attention.wq.weight"] for i in (0, layers - 1))
        cast0, cast3 = (next(iter(p.users)) for p in (p0, p3))
        assert b.rep[cast3] is cast0 and b.count[cast0] == layers
        assert b.block_of[cast0] == "layers.0"
        g0, g3 = (jg.grad_nodes[f"layers.{i}.attention.wq.weight"] for i in (0, layers - 1))
        assert g0.args[0].meta["val"].dtype == torch.bfloat16  # the grad node is the cast back
        assert b.rep[g3] is b.rep[g0] and b.count[b.rep[g0]] == layers
        assert b.block_of[b.rep[g0]] == "layers.0"
    assert reps[2] == reps[4], reps
