"""A TorchTitan MoE block under auto keeps its autograd graph from forward to backward: its
forward runs once per training step, its gradients equal those of the block run again in the
backward, and the planner prices it that way (backward twice the forward, its insides held)."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

from dist_harness import read_result, run_ranks, write_result
from titan_autopar import plan_model
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.cost.hardware import PRESETS
from titan_autopar.cost.regions import kept_regions, region_seconds, region_work
from titan_autopar.graph.manual import mark_matching, resolve_all

SEQ, BATCH, STEPS = 32, 2, 2


def _deepseek(layers: int = 2):
    """TorchTitan's deepseek_v3 debug model cut to `layers` (the first dense, the rest MoE), with
    its MoE blocks marked data-parallel regions as `auto = true` marks them."""
    spec = importlib.import_module("torchtitan.models.deepseek_v3").get_train_spec()
    args = copy.deepcopy(spec.model_args["debugmodel"])
    args.max_seq_len, args.n_layers = SEQ, layers
    if not hasattr(args, "moe_impl"):
        args.moe_impl = args.expert_parallel_comm_backend
    with torch.device("meta"):
        model = spec.model_cls(args)
    mark_matching(model, ["layers.*.moe"], "data_parallel")
    return model, args


def kept_worker(rank: int, out_dir: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from titan_autopar import Plan, apply_plan
    from titan_autopar.apply.init import local_slice
    from titan_autopar.titan.cpu import apply_cpu_patches

    apply_cpu_patches()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
    res = {}
    for keep in (True, False):
        model, args = _deepseek()
        model = apply_plan(model, Plan.load(f"{out_dir}/plan.json"), mesh,
                           progress=lambda s: None)
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        with torch.no_grad():
            model.init_weights(buffer_device=torch.device("cpu"))
        runner = model.autopar.runners["layers.1.moe"]
        runner.keep = keep
        torch.manual_seed(1)
        tokens = torch.randint(0, args.vocab_size, (BATCH, SEQ))
        local = local_slice(tokens, mesh, model.autopar.input_placements[0])
        for _ in range(STEPS):
            model(local).float().square().mean().backward()
        res[keep] = {"calls": runner.calls, "misses": runner.misses, "left": len(runner.kept),
                     "grads": {n: p.grad.full_tensor() for n, p in model.named_parameters()},
                     "summary": model.autopar.summary()}
    if rank == 0:
        a, b = res[True]["grads"], res[False]["grads"]
        worst = max((a[n] - b[n]).abs().max().item() / (b[n].abs().max().item() or 1.0) for n in b)
        write_result(out_dir, "kept", {
            "worst_grad_rel": worst, "moe_grads_nonzero": bool(a["layers.1.moe.experts.w1"].abs().sum()),
            **{f"{k}_{'kept' if keep else 'again'}": res[keep][k]
               for keep in res for k in ("calls", "misses", "left", "summary")}})


def test_a_kept_moe_block_runs_its_forward_once_with_the_same_gradients(tmp_path):
    model, _ = _deepseek()
    x = torch.zeros(BATCH, SEQ, dtype=torch.long, device="meta")
    plan = plan_model(model, fake_mesh(("dp_shard",), (2,)), (x,), hardware="cpu",
                      progress=lambda s: None)
    plan.save(tmp_path / "plan.json")
    run_ranks(kept_worker, 2, str(tmp_path))
    res = read_result(tmp_path, "kept")
    # kept: one forward per step, every kept graph consumed by its own backward
    assert (res["calls_kept"], res["misses_kept"], res["left_kept"]) == (STEPS, 0, 0), res
    # run again in the backward: two forwards per step
    assert res["calls_again"] == 2 * STEPS, res
    assert res["moe_grads_nonzero"] and res["worst_grad_rel"] <= 1e-5, res
    assert "manual regions keeping their activations for backward: 1 (layers.1.moe)" \
        in res["summary_kept"], res["summary_kept"]


def test_kept_regions_are_priced_without_the_second_forward():
    model, _ = _deepseek()
    resolved = resolve_all(model, ("dp_shard",), (2,))
    assert kept_regions(resolved, "none") == {"layers.1.moe"}
    assert kept_regions(resolved, "full") == kept_regions(resolved, "selective") == set()
    work = region_work(resolved["layers.1.moe"])
    # deepseek debug: dim 256, moe hidden 256, 8 experts (top 3), 2 shared (hidden 512)
    assert work.kept_elements_per_token == pytest.approx(
        2 * 8 + 2 * 3 + 3 * (3 * 256 + 4 * 256) * 1.2 + 4 * 512 + 256)
    hw = PRESETS["cpu"]
    fwd, _ = region_seconds(work, False, 1024, hw, None, 4)
    again, _ = region_seconds(work, True, 1024, hw, None, 4)
    kept, _ = region_seconds(work, True, 1024, hw, None, 4, kept=True)
    floor = hw.launch_overhead * hw.compute_scale
    assert (again - floor) == pytest.approx(3 * (fwd - floor))
    assert (kept - floor) == pytest.approx(2 * (fwd - floor))
