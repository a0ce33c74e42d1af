"""Expert parallelism under auto against TorchTitan's EP recipe: the full matrix, one JSON line.

For each MoE debug model (deepseek_v3, llama4, qwen3) and ep in (2, 4), on 4 CPU ranks, fp32:
one seed checkpoint, then `--steps` steps under auto and under TorchTitan's own recipe with the
same degrees, with a full checkpoint two steps before the end; each run's checkpoint then resumes
under the other arm (DCP both ways) and trains the last two steps again. Reported per case: the
worst relative loss difference between the arms, the worst of the resumed runs against the
uninterrupted auto run, every loss, and each arm's seconds. `--seq-len` shortens the sequence for
both arms: qwen3's 64 experts (top 8) run TorchTitan's bf16 grouped matmul, slow on CPU, and the
whole matrix at the configs' length takes well over an hour on 2 cores. CI runs a slice of this
(`tests/test_titan_ep.py`).

  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/moe_parity.py [--steps 10] [--model qwen3_moe ...] [--ep 2] [--seq-len 64]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from titan_autopar.titan.launch import failed_rank_lines, launch, parse_losses

REPO = Path(__file__).resolve().parents[1]
MODELS = ("deepseek_v3", "llama4", "qwen3_moe")


def _run(config, nproc, args) -> tuple[dict, float]:
    t = time.perf_counter()
    run = launch(config, nproc, [str(a) for a in args], cwd=REPO, stream=False)
    if run.returncode:
        raise RuntimeError(f"{config} {args} failed:\n{failed_rank_lines(run.stdout)}")
    return parse_losses(run.stdout), round(time.perf_counter() - t, 1)


def worst_rel(a: dict, b: dict) -> float | None:
    common = sorted(set(a) & set(b))
    return max(abs(a[s] - b[s]) / abs(b[s]) for s in common) if common else None


def case(model: str, ep: int, steps: int, root: Path, extra: list) -> dict:
    auto, recipe = (f"train_configs/{model}_debug_cpu_auto4.toml",
                    f"train_configs/{model}_debug_cpu_fsdp4_ep4.toml")
    _run(auto, 1, ["--job.dump_folder", root / "seed", "--checkpoint.enable",
                   "--checkpoint.create_seed_checkpoint", "--parallelism.no-auto",
                   "--parallelism.data_parallel_shard_degree", 1,
                   "--parallelism.expert_parallel_degree", 1, *extra])
    seed = root / "seed" / "checkpoint" / "step-0"
    at = steps - 2  # a full checkpoint two steps before the end: the resumed runs redo the last two
    losses, seconds = {}, {}
    for arm, config in (("auto", auto), ("recipe", recipe)):
        losses[arm], seconds[arm] = _run(config, 4, [
            "--job.dump_folder", root / arm, "--checkpoint.enable",
            "--checkpoint.initial_load_path", seed, "--checkpoint.interval", at,
            "--training.steps", steps, "--parallelism.expert_parallel_degree", ep, *extra])
    resumed = {}
    for name, config, source in (("recipe_from_auto", recipe, "auto"),
                                 ("auto_from_recipe", auto, "recipe")):
        shutil.copytree(root / source / "checkpoint" / f"step-{at}",
                        root / name / "checkpoint" / f"step-{at}")
        resumed[name], _ = _run(config, 4, [
            "--job.dump_folder", root / name, "--checkpoint.enable", "--checkpoint.interval", steps,
            "--training.steps", steps, "--parallelism.expert_parallel_degree", ep, *extra])
    uninterrupted = {s: losses["auto"][s] for s in range(at + 1, steps + 1)}
    return {"steps": steps, "worst_rel_loss": worst_rel(losses["auto"], losses["recipe"]),
            "resumed_steps": sorted(resumed["auto_from_recipe"]),
            "resumed_worst_rel": max(worst_rel(r, uninterrupted) for r in resumed.values()),
            "losses": losses, "resumed": resumed, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model", choices=MODELS, action="append")
    ap.add_argument("--ep", type=int, choices=(2, 4), action="append")
    ap.add_argument("--seq-len", type=int, help="override the configs' training.seq_len (both arms)")
    a = ap.parse_args()
    if a.steps < 3:
        ap.error("--steps must be at least 3 (the resumed runs redo the last two)")
    extra = ["--training.seq_len", a.seq_len] if a.seq_len else []
    out = {"benchmark": "moe_parity", "ranks": 4, "tolerance_rel": 1e-4, "seq_len": a.seq_len}
    for model in a.model or MODELS:
        for ep in a.ep or (2, 4):
            with tempfile.TemporaryDirectory() as tmp:
                out[f"{model}_ep{ep}"] = case(model, ep, a.steps, Path(tmp), extra)
    cases = [v for v in out.values() if isinstance(v, dict)]
    out["worst_rel_loss"] = max((v["worst_rel_loss"] for v in cases), default=None)
    out["resumed_worst_rel"] = max((v["resumed_worst_rel"] for v in cases), default=None)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
