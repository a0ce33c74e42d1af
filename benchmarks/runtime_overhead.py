"""Step time of a planned program against TorchTitan's own FSDP recipe, in one run.

TorchTitan's llama3 debug model on 4 gloo ranks (CPU, fp32): model A is parallelised by
TorchTitan's `apply_fsdp` (FSDP2 `fully_shard` per block and at the root), model B by
`apply_plan` with a plan whose parameters are pinned to the same placements (Shard(0) on the
4-rank dim). Both start from the same weights and train on the same batches with the same
global-mean cross-entropy; steps alternate A, B, A, B so that the shared machine's noise falls on
both. Prints one JSON line: median step times, their ratio (target <= 1.10) and both final losses.
With `--compile` a third model runs the same plan with its graphs through torch.compile
(inductor, C++ on CPU): its step time over the uncompiled plan's and the largest loss difference.

    .venv/bin/python benchmarks/runtime_overhead.py [--steps 8] [--batch 8] [--seq 256] [--compile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from dist_harness import read_result, run_ranks, write_result  # noqa: E402
from parity_models import init_titan  # noqa: E402

WORLD = 4


def _model(seq: int):
    from titan_autopar.titan.models import build_model

    return build_model("llama3", "debugmodel", seq)[0]


def _profile(model, x, y, key: str, out_dir: str | None) -> None:
    """One extra forward+backward under the profiler: self CPU time by op, top 12."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        logits = model(x)
        F.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()
    model.zero_grad()
    if out_dir is None:
        return
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
    Path(out_dir, f"profile_{key}.txt").write_text(table)


def worker(rank: int, plan_path: str, out_dir: str, steps: int, batch: int, seq: int,
           profile: bool = False, compiled: bool = False) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.models.llama3.infra.parallelize import apply_fsdp

    from titan_autopar import Plan, apply_plan
    from titan_autopar.apply.init import local_slice
    from titan_autopar.titan.cpu import apply_cpu_patches

    apply_cpu_patches(["fsdp_sum_reduction"])  # gloo has no AVG for TorchTitan's FSDP set-up
    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("dp_shard",))
    recipe = _model(seq)
    apply_fsdp(recipe, mesh, param_dtype=torch.float32, reduce_dtype=torch.float32, pp_enabled=False)
    init_titan(recipe)
    planned = apply_plan(_model(seq), Plan.load(plan_path), mesh, progress=lambda s: None)
    init_titan(planned)
    with torch.no_grad():  # the same starting weights (FSDP's DTensor init draws per shard)
        for p, q in zip(recipe.parameters(), planned.parameters()):
            p.to_local().copy_(local_slice(q.full_tensor(), mesh, p.placements))
    models = {"fsdp": recipe, "autopar": planned}
    if compiled:  # the same plan, its graphs through torch.compile (inductor)
        again = apply_plan(_model(seq), Plan.load(plan_path), mesh, progress=lambda s: None)
        init_titan(again)
        with torch.no_grad():
            for p, q in zip(again.parameters(), planned.parameters()):
                p.to_local().copy_(q.to_local())
        again.autopar.compile()
        models["compiled"] = again

    local = batch // WORLD
    g = torch.Generator().manual_seed(3)
    data = [torch.randint(0, 2048, (batch, seq + 1), generator=g) for _ in range(steps)]
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}
    losses: dict[str, list[float]] = {k: [] for k in models}
    for step, batch_tokens in enumerate(data):
        mine = batch_tokens[rank * local:(rank + 1) * local]
        x, y = mine[:, :-1], mine[:, 1:]
        for key, model in models.items():
            torch.distributed.barrier()
            t = time.perf_counter()
            logits = model(x)
            if key == "fsdp":  # FSDP averages gradients over ranks: local mean
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
            else:  # the planned program sums gradients over ranks: global mean
                loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum") / y.numel() / WORLD
            loss.backward()
            opts[key].step()
            opts[key].zero_grad()
            torch.distributed.barrier()
            if step > 0:  # the first step warms up (and compiles)
                times[key].append(time.perf_counter() - t)
            if profile and step == 2:  # every rank runs it (collectives), rank 0 writes
                _profile(model, x, y, key, out_dir if rank == 0 else None)
            losses[key].append(loss.item() * (1 if key == "fsdp" else WORLD))
    if rank == 0:
        write_result(out_dir, "overhead", {"times": times, "losses": losses})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--profile", metavar="DIR", help="also write rank 0's op profile of each "
                    "model to DIR/profile_<fsdp|autopar>.txt")
    ap.add_argument("--compile", action="store_true", help="also run the plan with its graphs "
                    "through torch.compile (inductor): step-time ratio and loss parity")
    a = ap.parse_args()

    from titan_autopar import plan_model
    from titan_autopar.fake_mesh import fake_mesh

    with tempfile.TemporaryDirectory() as tmp:
        mesh = fake_mesh(("dp_shard",), (WORLD,))
        tokens = torch.empty(a.batch, a.seq, dtype=torch.long, device="meta")
        plan = plan_model(_model(a.seq), mesh, (tokens,), parameter_placements="fsdp",
                          progress=lambda s: None)
        torch.distributed.destroy_process_group()
        plan.save(f"{tmp}/plan.json")
        run_ranks(worker, WORLD, f"{tmp}/plan.json", tmp, a.steps, a.batch, a.seq, bool(a.profile),
                  a.compile)
        res = read_result(tmp, "overhead")
        if a.profile:
            Path(a.profile).mkdir(parents=True, exist_ok=True)
            for k in ("fsdp", "autopar"):
                Path(a.profile, f"profile_{k}.txt").write_text(Path(tmp, f"profile_{k}.txt").read_text())
    fsdp = statistics.median(res["times"]["fsdp"])
    auto = statistics.median(res["times"]["autopar"])
    extra = {}
    if a.compile:
        comp = statistics.median(res["times"]["compiled"])
        extra = {"compiled_step_s": round(comp, 4), "compiled_over_autopar": round(comp / auto, 3),
                 "compiled_worst_loss_diff": max(abs(x - y) for x, y in zip(
                     res["losses"]["compiled"], res["losses"]["autopar"]))}
    print(json.dumps({
        "benchmark": "runtime_overhead", "model": "llama3 debugmodel", "ranks": WORLD,
        "batch": a.batch, "seq": a.seq, "steps_timed": len(res["times"]["fsdp"]),
        "fsdp_step_s": round(fsdp, 4), "autopar_step_s": round(auto, 4),
        "ratio": round(auto / fsdp, 3), "target_ratio": 1.10,
        "final_loss": {k: round(v[-1], 5) for k, v in res["losses"].items()}, **extra,
    }))


if __name__ == "__main__":
    main()
