"""torch.compile composes with a plan: the same program's graphs through inductor (C++ on CPU)
train like the uncompiled ones, on 2x2 gloo ranks (a plan with tensor parallelism: activation
collectives inside the compiled graphs, not only parameter ones)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dist_harness import read_result, run_ranks, write_result

SHAPE, SEQ, BATCH, STEPS = (2, 2), 32, 4, 3


def _model():
    from conftest import tiny_llama

    return tiny_llama(dim=64, layers=1, seq=SEQ, n_heads=4)


def worker(rank: int, plan_path: str, out_dir: str) -> None:
    import os

    from torch.distributed.device_mesh import init_device_mesh

    # a cache of each rank's own: four ranks writing and loading the same kernels in one folder
    # crashed a rank once (SIGSEGV) on a loaded machine
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(out_dir, f"inductor_{rank}")

    from titan_autopar import Plan, apply_plan
    from parity_models import init_titan

    mesh = init_device_mesh("cpu", SHAPE, mesh_dim_names=("dp_shard", "tp"))
    models = {}
    for key in ("eager", "compiled"):
        m = apply_plan(_model(), Plan.load(plan_path), mesh, progress=lambda s: None)
        init_titan(m)
        models[key] = m
    with torch.no_grad():
        for p, q in zip(models["compiled"].parameters(), models["eager"].parameters()):
            p.to_local().copy_(q.to_local())
    models["compiled"].autopar.compile()
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 2048, (BATCH, SEQ + 1), generator=g) for _ in range(STEPS)]
    dp = mesh.get_local_rank("dp_shard")
    local = BATCH // SHAPE[0]
    opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in models.items()}
    losses = {k: [] for k in models}
    for tokens in data:
        mine = tokens[dp * local:(dp + 1) * local]
        for k, m in models.items():
            logits = m(mine[:, :-1])
            y = mine[:, 1:]
            # the planned program sums gradients over the data-parallel ranks: global mean
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten(), reduction="sum")
            (loss / y.numel() / SHAPE[0]).backward()
            opts[k].step()
            opts[k].zero_grad()
            losses[k].append(loss.item() / y.numel())
    worst_param = max((p.to_local() - q.to_local()).abs().max().item() for p, q in
                      zip(models["compiled"].parameters(), models["eager"].parameters()))
    if rank == 0:
        write_result(out_dir, "compile", {"losses": losses, "worst_param": worst_param,
                                          "compiled": models["compiled"].autopar.compiled,
                                          "collectives": models["eager"].autopar.collectives()})


def test_compiled_plan_trains_like_the_uncompiled_one_on_2x2(tmp_path, mesh_of):
    from titan_autopar import plan_model
    from titan_autopar.api import default_input_placements

    mesh = mesh_of(("dp_shard", "tp"), SHAPE)
    tokens = torch.zeros(BATCH, SEQ, dtype=torch.long)
    # logits leave as each rank's batch rows, whole (as TorchTitan's loss wants them)
    out = default_input_placements(("dp_shard", "tp"), torch.empty(1, 1, 1))
    plan = plan_model(_model(), mesh, (tokens,), parameter_placements="fsdp_tp",
                      output_placements=[out], progress=lambda s: None)
    torch.distributed.destroy_process_group()
    plan.save(tmp_path / "plan.json")
    run_ranks(worker, 4, str(tmp_path / "plan.json"), str(tmp_path))
    r = read_result(tmp_path, "compile")
    assert r["compiled"] == "inductor"
    assert any(k.startswith("forward: all_reduce") or k.startswith("forward: all_gather")
               for k in r["collectives"]), r["collectives"]  # collectives inside the graphs
    eager, comp = r["losses"]["eager"], r["losses"]["compiled"]
    assert eager[-1] < eager[0]  # it learns
    assert max(abs(a - b) for a, b in zip(eager, comp)) < 1e-5, (eager, comp)
    assert r["worst_param"] < 1e-5
