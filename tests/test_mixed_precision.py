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
from titan_autopar.cli import fake_mesh


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
