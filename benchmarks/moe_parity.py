"""Expert parallelism under auto against TorchTitan's EP recipe: the full matrix, one JSON line.

For each MoE debug model (deepseek_v3, llama4, qwen3) and ep in (2, 4), on 4 CPU ranks, fp32:
one seed checkpoint, then `--steps` steps under auto and under TorchTitan's own recipe with the
same degrees, checkpointing at the end; then each run's last checkpoint resumes under the other
arm for 2 steps (DCP both ways). Reported per case: the worst relative loss difference over the
steps, the same for the two resumed runs, and each arm's seconds. CI runs a slice of this
(`tests/test_titan_ep.py`); the whole matrix takes an hour or more on 2 cores (qwen3's 64 experts
run TorchTitan's bf16 grouped matmul, which is slow on CPU).

  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/moe_parity.py [--steps 10] [--model qwen3_moe ...]
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


def case(model: str, ep: int, steps: int, root: Path) -> dict:
    auto, recipe = (f"train_configs/{model}_debug_cpu_auto4.toml",
                    f"train_configs/{model}_debug_cpu_fsdp4_ep4.toml")
    _run(auto, 1, ["--job.dump_folder", root / "seed", "--checkpoint.enable",
                   "--checkpoint.create_seed_checkpoint", "--parallelism.no-auto",
                   "--parallelism.data_parallel_shard_degree", 1,
                   "--parallelism.expert_parallel_degree", 1])
    seed = root / "seed" / "checkpoint" / "step-0"
    losses, seconds = {}, {}
    for arm, config in (("auto", auto), ("recipe", recipe)):
        losses[arm], seconds[arm] = _run(config, 4, [
            "--job.dump_folder", root / arm, "--checkpoint.enable",
            "--checkpoint.initial_load_path", seed, "--checkpoint.interval", steps,
            "--training.steps", steps, "--parallelism.expert_parallel_degree", ep])
    resumed = {}
    for name, config, source in (("recipe_from_auto", recipe, "auto"),
                                 ("auto_from_recipe", auto, "recipe")):
        shutil.copytree(root / source / "checkpoint" / f"step-{steps}",
                        root / name / "checkpoint" / f"step-{steps}")
        resumed[name], _ = _run(config, 4, [
            "--job.dump_folder", root / name, "--checkpoint.enable",
            "--training.steps", steps + 2, "--parallelism.expert_parallel_degree", ep])
    return {"steps": steps, "worst_rel_loss": worst_rel(losses["auto"], losses["recipe"]),
            "resumed_worst_rel": worst_rel(resumed["auto_from_recipe"], resumed["recipe_from_auto"]),
            "last_loss": {a: losses[a][max(losses[a])] for a in losses},
            "resumed_at": sorted(resumed["auto_from_recipe"]), "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--model", choices=MODELS, action="append")
    ap.add_argument("--ep", type=int, choices=(2, 4), action="append")
    a = ap.parse_args()
    out = {"benchmark": "moe_parity", "ranks": 4, "tolerance_rel": 1e-4}
    for model in a.model or MODELS:
        for ep in a.ep or (2, 4):
            with tempfile.TemporaryDirectory() as tmp:
                out[f"{model}_ep{ep}"] = case(model, ep, a.steps, Path(tmp))
    worst = [v["worst_rel_loss"] for k, v in out.items() if isinstance(v, dict)]
    out["worst_rel_loss"] = max(worst) if worst else None
    print(json.dumps(out))


if __name__ == "__main__":
    main()
