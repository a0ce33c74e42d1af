"""Planning time by phase, printed as one JSON line.

Cases: Llama3-8B (32 layers, seq 8192) on a 64-rank (dp_shard=8, tp=8) H100 mesh, and Llama3-70B
on a 128-rank 4-D mesh (dp_replicate=2, dp_shard=4, cp=2, tp=8), both simulated in this process,
each as priced by default (`8b`, `70b`: traced in the parameters' fp32, activations priced at
2 bytes, no checkpointing) and with the real configs' settings, bf16 mixed precision and
selective checkpointing (`8b_bf16`, `70b_bf16`). Targets on a 2-core machine, end to end:
8B <= 10 s, 70B 4-D <= 30 s, Llama4 17Bx16E on 64 ranks <= 30 s, every program within a 0.5% gap
(`worst_gap`); `targets_met` says which hold. The cases run in one process in the order given: the
first pays the import of TorchTitan's model code (about 3 s, inside its `model_build_s`), the
others find it imported.

MoE cases plan a real job file end to end through `titan-autopar plan --config` (bf16, the
config's activation checkpointing and expert parallelism): Llama4 17Bx16E on 64 ranks
(`llama4_64`), DeepSeek-V3 16B and Qwen3 30B-A3B on 64 ranks with ep = 8 (`dsv3_16b_64`,
`qwen3_30b_64`) and DeepSeek-V3 671B on 512 ranks with ep = 64 (`dsv3_671b_512`); each row has the
predicted step time and peak memory, the priced expert recipe beside it, and a sanity figure: the
predicted compute time against 6 x active parameters x tokens per GPU (the local batch over tp x cp)
/ (bf16 peak x efficiency)
(x 4/3 under full activation checkpointing: one more forward), as `compute_over_ideal`.
Targets: <= 60 s each end to end, peak <= 80 GiB, auto <= recipe.

CLI cases run `titan-autopar plan` in a fresh process, as a user does, and time it from start to
exit (importing torch and TorchTitan included): `8b_cli` and `8b_bf16_cli` plan the `8b` and
`8b_bf16` cases' models (targets: <= 10 s each).

Every row counts the planner's work beside its time: integer programs, simplex iterations and
branch-and-bound nodes (the plan's `solver` section) and nodes traced (`traced_nodes`, against
the graph's `nodes`): figures that do not move with the machine's load. `tests/test_plan_work.py`
holds smaller cases to committed figures of the same counts.

Wall-clock seconds move with whatever else the machine runs. So each row also gives `cpu_s`, the
CPU seconds this process spent on the case, and the line gives the machine's cores and its
1-minute load average before and after the cases (`load_before`, `load_after`). Where the load
nears the core count, `total_s` includes waiting for a core and `cpu_s` is the closer figure.
A shared machine's cores also change speed under an idle load average: `probe_before` and
`probe_after` time one fixed pure-Python loop (`speed_probe`), the control that tells a slower
machine from a slower planner.

  .venv/bin/python benchmarks/plan_time.py [--solver highs|cbc] [--case 8b|70b|8b_cli|...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from titan_autopar import plan_model
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.titan.models import build_model, global_batch

# name: (flavor, mesh dims, sizes, seq, compute dtype, activation checkpointing); the "_bf16"
# rows use what TorchTitan's real configs use (bf16 mixed precision, selective checkpointing)
MESH_8B = (("dp_shard", "tp"), (8, 8))
MESH_70B = (("dp_replicate", "dp_shard", "cp", "tp"), (2, 4, 2, 8))
CASES = {
    "8b": ("8B", *MESH_8B, 8192, None, "none"),
    "8b_bf16": ("8B", *MESH_8B, 8192, torch.bfloat16, "selective"),
    "70b": ("70B", *MESH_70B, 8192, None, "none"),
    "70b_bf16": ("70B", *MESH_70B, 8192, torch.bfloat16, "selective"),
}
TARGETS_S = {"8b": 10, "8b_bf16": 10, "70b": 30, "70b_bf16": 30, "llama4_64": 30,
             "8b_cli": 10, "8b_bf16_cli": 10}
# name: the flags `titan-autopar plan` is given (the CLI's defaults: Llama3-8B, seq 8192, 8x8)
CLI = {
    "8b_cli": ["--model", "llama3", "--flavor", "8B", "--mesh", "dp_shard=8,tp=8",
               "--hardware", "h100", "--seq-len", "8192", "--local-batch-size", "1"],
    "8b_bf16_cli": ["--model", "llama3", "--flavor", "8B", "--mesh", "dp_shard=8,tp=8",
                    "--hardware", "h100", "--seq-len", "8192", "--local-batch-size", "1",
                    "--param-dtype", "bfloat16", "--activation-checkpointing", "selective"],
}
GAP_TARGET = 0.005
JOBS = {
    "llama4_64": "train_configs/llama4_17bx16e_64gpu_auto.toml",
    "dsv3_16b_64": "train_configs/deepseek_v3_16b_64gpu_auto.toml",
    "qwen3_30b_64": "train_configs/qwen3_30b_a3b_64gpu_auto.toml",
    "dsv3_671b_512": "train_configs/deepseek_v3_671b_512gpu_auto.toml",
}
REPO = Path(__file__).resolve().parents[1]


def active_parameters(model) -> float:
    """Parameters one token meets: routed experts count top_k / experts of theirs."""
    from titan_autopar.graph.manual import is_moe_block

    total = sum(p.numel() for p in model.parameters())
    for m in model.modules():
        if is_moe_block(m):
            experts = sum(p.numel() for p in m.experts.parameters())
            total -= experts * (1 - m.router.top_k / m.experts.num_experts)
    return total


def run_job(case: str, solver: str) -> dict:
    from titan_autopar.cli import main as cli
    from titan_autopar.cost.hardware import get_hardware
    from titan_autopar.titan.job_file import planning_job
    from titan_autopar.titan.models import build_model

    path = REPO / JOBS[case]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli(["plan", "--config", str(path), "--solver", solver, "--out", str(out),
                      "--timings"])
        total = time.perf_counter() - t0
        if rc:
            return {"error": f"plan --config exited {rc}"}
        plan = json.loads(out.read_text())
    job = planning_job(path)
    model, _ = build_model(job.model, job.flavor, job.seq_len)
    hw = get_hardware(job.hardware)
    recompute = 4 / 3 if job.activation_checkpointing == "full" else 1.0
    # tokens a GPU computes: its data-parallel batch, shared by its tensor/context-parallel ranks
    sizes = dict(zip(plan["mesh"]["names"], plan["mesh"]["shape"]))
    shared = sizes.get("tp", 1) * sizes.get("cp", 1)
    ideal = (6 * active_parameters(model) * job.local_batch_size * job.seq_len / shared * recompute
             / (hw.peak_bf16_flops * hw.compute_efficiency))
    pred = plan["predicted"]
    t = plan["timings"]
    return {
        "total_s": round(total, 2),
        "trace_s": round(t["trace"]["seconds"], 2),
        "solve_phase_s": round(t["solve"]["seconds"], 2),
        "programs": plan["solver"]["programs"], **work(plan),
        "status": plan["solver"]["status"],
        "gap": plan["solver"]["gap"],
        "mesh": dict(zip(plan["mesh"]["names"], plan["mesh"]["shape"])),
        "predicted_step_ms": round(pred["step_time_s"] * 1e3, 1),
        "predicted_compute_ms": round(pred["compute_s"] * 1e3, 1),
        "peak_memory_gib": round(pred["peak_memory_gib"], 2),
        "recipe_step_ms": {r: round(v["step_time_s"] * 1e3, 1) for r, v in plan["recipes"].items()},
        "recipe_peak_gib": {r: round(v["peak_memory_gib"], 2) for r, v in plan["recipes"].items()},
        "active_parameters_b": round(active_parameters(model) / 1e9, 2),
        "ideal_compute_ms": round(ideal * 1e3, 1),
        "compute_over_ideal": round(pred["compute_s"] / ideal, 3),
    }


def speed_probe() -> float:
    """Seconds of a fixed pure-Python loop: this machine's speed at the moment."""
    t0 = time.perf_counter()
    s = 0
    for i in range(5_000_000):
        s += i
    return round(time.perf_counter() - t0, 3)


def work(plan: dict) -> dict:
    """The planner's counted work, from a plan's JSON."""
    sv = plan["solver"]
    return {"simplex_iterations": sv["simplex_iterations"], "bb_nodes": sv["nodes"],
            "mip_programs": sv["mip_programs"]}


def run_cli(case: str, solver: str) -> dict:
    """`titan-autopar plan` in a fresh process, timed from start to exit."""
    exe = Path(sys.executable).with_name("titan-autopar")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        cmd = [str(exe), "plan", *CLI[case], "--solver", solver, "--out", str(out), "--timings"]
        t0, c0 = time.perf_counter(), os.times()
        run = subprocess.run(cmd, capture_output=True, text=True)
        total, c1 = time.perf_counter() - t0, os.times()
        cpu = (c1.children_user + c1.children_system) - (c0.children_user + c0.children_system)
        if run.returncode:
            return {"error": f"exit {run.returncode}: {run.stderr.strip()[-300:]}"}
        plan = json.loads(out.read_text())
    t = plan["timings"]
    return {"total_s": round(total, 2), "cpu_s": round(cpu, 2),
            "trace_s": round(t["trace"]["seconds"], 2),
            "solve_phase_s": round(t["solve"]["seconds"], 2),
            "programs": plan["solver"]["programs"], **work(plan),
            "nodes": t["trace"]["nodes"], "traced_nodes": t["trace"]["traced_nodes"],
            "status": plan["solver"]["status"], "gap": plan["solver"]["gap"],
            "predicted_step_ms": round(plan["predicted"]["step_time_s"] * 1e3, 3)}


def run(case: str, solver: str) -> dict:
    if case in JOBS:
        return run_job(case, solver)
    if case in CLI:
        return run_cli(case, solver)
    flavor, names, sizes, seq, dtype, ac = CASES[case]
    t0 = time.perf_counter()
    model, _ = build_model("llama3", flavor, seq)
    mesh = fake_mesh(names, sizes)
    tokens = torch.zeros(global_batch(1, names, sizes), seq, dtype=torch.long)
    build = time.perf_counter() - t0
    plan = plan_model(model, mesh, (tokens,), solver=solver, progress=lambda s: None,
                      param_dtype=dtype, activation_checkpointing=ac)
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
        **work(plan.data),
        "traced_nodes": t["trace"]["traced_nodes"],
        "max_variables": t["solve"]["max_variables"],
        "status": plan.data["solver"]["status"],
        "gap": plan.data["solver"]["gap"],
        "predicted_step_ms": round(plan.predicted["step_time_s"] * 1e3, 3),
        "recipe_step_ms": {r: round(v["step_time_s"] * 1e3, 3) for r, v in plan.data["recipes"].items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--solver", default="highs", choices=["highs", "cbc"])
    ap.add_argument("--case", choices=sorted(CASES) + sorted(CLI) + sorted(JOBS), action="append")
    a = ap.parse_args()
    out = {"benchmark": "plan_time", "solver": a.solver, "cores": os.cpu_count(),
           "load_before": round(os.getloadavg()[0], 2), "probe_before": speed_probe()}
    cases = a.case or sorted(CASES) + sorted(CLI) + sorted(JOBS)
    for case in cases:
        cpu = time.process_time()
        out[case] = run(case, a.solver)
        out[case].setdefault("cpu_s", round(time.process_time() - cpu, 2))
    out["load_after"] = round(os.getloadavg()[0], 2)
    out["probe_after"] = speed_probe()
    rows = [out[c] for c in cases if "total_s" in out[c]]
    out["worst_gap"] = max((r["gap"] for r in rows), default=None)
    out["targets_met"] = {f"{c}<={t}s": out[c].get("total_s", 1e9) <= t
                          for c, t in TARGETS_S.items() if c in out}
    out["targets_met"][f"gap<={GAP_TARGET}"] = (out["worst_gap"] or 0) <= GAP_TARGET
    print(json.dumps(out))


if __name__ == "__main__":
    main()
