"""`[parallelism] auto = true` in TorchTitan's own trainer, 4 CPU ranks under torchrun.

- llama3 debug, auto against its FSDP twin: both start from one seed checkpoint (TorchTitan's
  `create_seed_checkpoint`, one rank) and read the same data, so in fp32 the two runs differ
  only in the order in which gradient partial sums are added. Over 10 steps that moved the
  losses by at most 1e-5; the tolerance is 2e-4.
- A checkpoint saved by the recipe's run resumes under auto, and one saved under auto resumes
  under the recipe: both continue at step 11 with the same losses.
- mixed_precision_param = "bfloat16" under auto follows the recipe's bf16 run.
- cp=2 under auto (ring attention) follows TorchTitan's CP recipe (its own ring attention).
- pp=2 under auto: each pipeline stage is planned on its own and trains like the recipe's pp=2.
- Held to the FSDP recipe's peak, the plan gains nothing over FSDP's recipe and runs as the
  recipe (its losses to the digit); with recipe_runtime = false the plan's program runs it.
- The MoE debug model deepseek_v3 trains under auto without expert parallelism (its MoE blocks
  are data-parallel manual regions); with expert parallelism, and llama4 and qwen3, see
  `tests/test_titan_ep.py` and `benchmarks/moe_parity.py`.
- A rank killed mid-run: the same command resumes from the last checkpoint with the saved plan
  (nothing solved again) and trains on with the uninterrupted run's losses.
- Bad configs stop with an error that says what to change.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from titan_autopar.cli import main as cli
from titan_autopar.titan.launch import launch, parse_losses, tensorboard_scalars
from titan_autopar.titan.predictions import MEMORY_TAG, STEP_TAG

REPO = Path(__file__).resolve().parents[1]
FSDP = "train_configs/llama3_debug_cpu_fsdp4.toml"
AUTO = "train_configs/llama3_debug_cpu_auto4.toml"
LOSS_TOL = 2e-4
# the plan's own program even where it gains too little over FSDP's recipe (which would run the
# recipe): what a test of the program runs, whatever this machine's calibration predicts
PROGRAM = ["--auto_parallel.no-recipe_runtime"]


def _run(config, nproc, *args, expect_ok=True, timeout=900, on_line=None):
    run = launch(config, nproc, [str(a) for a in args], cwd=REPO, stream=False, timeout=timeout,
                 on_line=on_line)
    if expect_ok:
        assert run.returncode == 0, run.stdout[-4000:]
    return run


def rank_pids(torchrun_pid: int) -> dict[int, int]:
    """rank -> pid of the worker processes a torchrun process started (Linux /proc)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) != torchrun_pid:
                continue
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
        if rank is not None:
            out[rank] = int(entry)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Seed checkpoint, then 10 steps of the FSDP recipe and of auto from it."""
    root = tmp_path_factory.mktemp("titan_auto")
    _run(FSDP, 1, "--job.dump_folder", root / "seed", "--checkpoint.enable",
         "--checkpoint.create_seed_checkpoint", "--parallelism.data_parallel_shard_degree", 1)
    seed = root / "seed" / "checkpoint" / "step-0"
    assert seed.is_dir()
    losses = {}
    for name, config in (("fsdp", FSDP), ("auto", AUTO)):
        run = _run(config, 4, "--job.dump_folder", root / name, "--checkpoint.enable",
                   "--checkpoint.initial_load_path", seed, "--training.steps", 10,
                   *(PROGRAM if name == "auto" else []))
        losses[name] = parse_losses(run.stdout)
        losses[name + "_log"] = run.stdout
    return root, losses


def test_auto_trains_like_the_fsdp_recipe(trained):
    root, losses = trained
    auto, fsdp = losses["auto"], losses["fsdp"]
    assert sorted(auto) == list(range(1, 11)) and sorted(fsdp) == list(range(1, 11))
    assert auto[10] < auto[1] - 1.0  # it learns
    worst = max(abs(auto[s] - fsdp[s]) for s in auto)
    assert worst <= LOSS_TOL, f"auto {auto} vs fsdp {fsdp}"
    plan = json.loads((root / "auto" / "plan.json").read_text())  # [auto_parallel] save_plan
    assert plan["mesh"] == {"names": ["dp_shard"], "shape": [4], "crosses_nodes": [False]}
    assert len(plan["parameters"]) == 2 + 6 * 9 + 1
    # hardware = "calibrate": priced for these 4 ranks as measured, once per machine (cached)
    hw = plan["hardware"]
    assert hw["name"] == "cpu-gloo-4x1t" and hw["profile"].endswith(".json#" + hw["profile"][-16:])
    assert hw["compute_efficiency"] == 1.0 and len(hw["collective_fits"]) == 4
    assert ("measuring this job's 4 ranks" in losses["auto_log"]
            or "the profile calibrated on this machine" in losses["auto_log"])
    assert "[titan_autopar] [apply] program built" in losses["auto_log"]
    assert "[titan_autopar]" not in losses["fsdp_log"]  # auto = false changes nothing
    # the plan's predictions sit beside TorchTitan's measured figures in TensorBoard
    predicted = tensorboard_scalars(root / "auto", STEP_TAG)
    assert predicted == {1: pytest.approx(plan["predicted"]["step_time_s"]),
                         10: pytest.approx(plan["predicted"]["step_time_s"])}
    assert tensorboard_scalars(root / "auto", "time_metrics/end_to_end(s)")  # measured, same run
    memory = tensorboard_scalars(root / "auto", MEMORY_TAG)
    assert list(memory.values()) == pytest.approx([plan["predicted"]["peak_memory_gib"]] * 2)


def previewed_plan(config: str, out: Path) -> str:
    """The plan `titan-autopar plan --config` writes for a job, as text."""
    assert cli(["plan", "--config", str(REPO / config), "--out", str(out)]) == 0
    return out.read_text()


def test_the_previewed_plan_is_the_plan_the_job_runs(trained, tmp_path):
    """`titan-autopar plan --config` and the job's own `save_plan` write the same bytes (the
    job's `hardware = "calibrate"`: the profile its ranks measured, cached on this machine)."""
    root, _ = trained
    ran = (root / "auto" / "plan.json").read_text()
    assert previewed_plan(AUTO, tmp_path / "preview.json") == ran


def test_a_killed_rank_resumes_with_the_saved_plan(trained):
    """Checkpoints every 5 steps; rank 2 is killed (SIGKILL) once step 7 has run, which ends
    the job. The same command again resumes from the step-5 checkpoint with the plan the first
    run saved (nothing is solved again) and trains steps 6..10 with the uninterrupted run's
    losses."""
    root, losses = trained
    seed = root / "seed" / "checkpoint" / "step-0"
    args = ["--job.dump_folder", root / "killed", "--checkpoint.enable",
            "--checkpoint.initial_load_path", seed, "--training.steps", 10, *PROGRAM]
    killed = []

    def kill_rank_2(line, proc):
        if not killed and re.search(r"\bstep:\s*7\s", line):
            pid = rank_pids(proc.pid).get(2)
            if pid:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    first = _run(AUTO, 4, *args, expect_ok=False, on_line=kill_rank_2)
    assert killed and first.returncode != 0, first.stdout[-3000:]
    assert (root / "killed" / "checkpoint" / "step-5").is_dir()
    assert "[titan_autopar] planning" in first.stdout
    again = _run(AUTO, 4, *args)
    assert "reusing the plan saved in" in again.stdout
    assert "[titan_autopar] planning" not in again.stdout and "[solve]" not in again.stdout
    resumed = parse_losses(again.stdout)
    print("resumed after the kill:", resumed, "uninterrupted:", losses["auto"])
    assert sorted(resumed) == [6, 7, 8, 9, 10], resumed
    worst = max(abs(resumed[s] - losses["auto"][s]) for s in resumed)
    assert worst <= LOSS_TOL, (resumed, losses["auto"])


def test_checkpoints_cross_between_recipe_and_auto(trained):
    root, losses = trained
    resumed = {}
    for name, config, source in (("auto_from_fsdp", AUTO, "fsdp"), ("fsdp_from_auto", FSDP, "auto")):
        shutil.copytree(root / source / "checkpoint" / "step-10", root / name / "checkpoint" / "step-10")
        run = _run(config, 4, "--job.dump_folder", root / name, "--checkpoint.enable",
                   "--training.steps", 12, *(PROGRAM if config == AUTO else []))
        resumed[name] = parse_losses(run.stdout)
    for name, got in resumed.items():
        assert sorted(got) == [11, 12], f"{name} did not resume at step 11: {got}"
        # it continues where it stopped: near step 10's loss, far below step 1's
        assert abs(got[11] - losses["auto"][10]) < 0.3 and got[11] < losses["auto"][1] - 1.0
    a, f = resumed["auto_from_fsdp"], resumed["fsdp_from_auto"]
    assert max(abs(a[s] - f[s]) for s in a) <= LOSS_TOL, (a, f)


def test_pipeline_stages_are_planned_each(trained):
    """pp=2 x dp_shard=2: TorchTitan splits llama3 into two stages and calls the parallelize
    function per stage; each stage gets its own plan (the second one takes hidden states and
    returns their gradient). From the same seed the recipe's pp=2 run and auto's agree."""
    root, _ = trained
    seed = root / "seed" / "checkpoint" / "step-0"
    pp = ["--parallelism.pipeline_parallel_degree", 2, "--parallelism.data_parallel_shard_degree", 2]
    losses = {}
    for name, config in (("fsdp_pp2", FSDP), ("auto_pp2", AUTO)):
        run = _run(config, 4, "--job.dump_folder", root / name, "--checkpoint.enable",
                   "--checkpoint.initial_load_path", seed, "--training.steps", 5, *pp,
                   *(PROGRAM if name == "auto_pp2" else []))
        losses[name] = parse_losses(run.stdout, rank=3)  # the last stage prints the loss
    auto, fsdp = losses["auto_pp2"], losses["fsdp_pp2"]
    assert sorted(auto) == list(range(1, 6)) and auto[5] < auto[1] - 0.5, auto
    assert max(abs(auto[s] - fsdp[s]) for s in auto) <= LOSS_TOL, (auto, fsdp)
    first, last = (json.loads((root / "auto_pp2" / f"plan.pp{r}.json").read_text())
                   for r in (0, 1))
    assert "tok_embeddings.weight" in first["parameters"] and "output.weight" not in first["parameters"]
    assert "output.weight" in last["parameters"] and "tok_embeddings.weight" not in last["parameters"]
    assert first["fingerprint"]["inputs"] == [[[2, 256], "torch.int64"]]
    assert last["fingerprint"]["inputs"] == [[[2, 256, 256], "torch.float32"]]


def test_context_parallel_under_auto_follows_the_recipe(trained):
    """dp_shard=2 x cp=2: TorchTitan's CP recipe (its ring attention on head-tail shards) and
    auto with cp_attention = "ring" (the plan's own ring on contiguous shards) train alike from
    the same seed; the plan shards every attention op's sequence over cp."""
    root, _ = trained
    seed = root / "seed" / "checkpoint" / "step-0"
    cp = ["--parallelism.context_parallel_degree", 2, "--parallelism.data_parallel_shard_degree", 2]
    losses, logs = {}, {}
    for name, config, extra in (("fsdp_cp2", FSDP, []),
                                ("auto_cp2", AUTO, ["--auto_parallel.cp_attention", "ring"])):
        run = _run(config, 4, "--job.dump_folder", root / name, "--checkpoint.enable",
                   "--checkpoint.initial_load_path", seed, "--training.steps", 5, *cp, *extra)
        losses[name], logs[name] = parse_losses(run.stdout), run.stdout
    auto, fsdp = losses["auto_cp2"], losses["fsdp_cp2"]
    assert sorted(auto) == list(range(1, 6)) and auto[5] < auto[1] - 0.5, auto
    assert max(abs(auto[s] - fsdp[s]) for s in auto) <= 1e-4, (auto, fsdp)  # measured: < 1e-5
    plan = json.loads((root / "auto_cp2" / "plan.json").read_text())
    assert plan["mesh"]["names"] == ["dp_shard", "cp"] and plan["cp_attention"] == "ring"
    attention = [v["in"][0] for v in plan["nodes"].values() if "flash_attention" in v["op"]]
    assert len(attention) == 2 * 6 and all(pl[1] == "S(2)" for pl in attention), attention
    assert "context_parallel_load_balancer 'headtail' -> None" in logs["auto_cp2"]


def test_mixed_precision_under_auto_follows_the_recipe(trained):
    """mixed_precision_param = "bfloat16": auto computes in bf16 as FSDP's param_dtype does.
    From the same seed both bf16 runs agree to 2e-2 over 2 steps (bf16 rounding, summed in
    another order; measured below 5e-3), and differ from the fp32 run (bf16 is really on)."""
    root, fp32 = trained
    seed = root / "seed" / "checkpoint" / "step-0"
    losses = {}
    for name, config in (("fsdp_bf16", FSDP), ("auto_bf16", AUTO)):
        run = _run(config, 4, "--job.dump_folder", root / name, "--checkpoint.enable",
                   "--checkpoint.initial_load_path", seed, "--training.steps", 2,
                   "--training.mixed_precision_param", "bfloat16",
                   *(PROGRAM if name == "auto_bf16" else []))
        losses[name] = parse_losses(run.stdout)
        logs = run.stdout
    auto, fsdp = losses["auto_bf16"], losses["fsdp_bf16"]
    assert sorted(auto) == [1, 2] and auto[2] < auto[1] - 0.1
    assert max(abs(auto[s] - fsdp[s]) for s in auto) <= 2e-2, (auto, fsdp)
    assert max(abs(auto[s] - fp32["auto"][s]) for s in auto) > 1e-4, (auto, fp32["auto"])
    assert "parameters cast to bfloat16 for compute" in logs


def test_a_plan_that_is_fsdps_schedule_runs_as_the_recipe(trained):
    """Held to the FSDP recipe's own peak (+2%) there is no room to keep gathered weights: the
    plan gains nothing over FSDP's recipe, and TorchTitan runs the recipe -- from the same seed, the
    recipe's losses to the digit. With recipe_runtime = false the plan's own program runs it,
    within the usual tolerance."""
    root, fp32 = trained
    seed = root / "seed" / "checkpoint" / "step-0"
    priced = root / "tight_plan.json"
    assert cli(["plan", "--config", str(REPO / AUTO), "--hardware", "cpu", "--out",
                str(priced)]) == 0
    budget = math.ceil(json.loads(priced.read_text())["recipes"]["fsdp"]["peak_memory_gib"]
                       * 1.02e4) / 1e4
    runs = {}
    for name, extra in (("recipe_runtime", []), ("program", PROGRAM)):
        runs[name] = _run(AUTO, 4, "--job.dump_folder", root / f"tight_{name}",
                          "--checkpoint.enable", "--checkpoint.initial_load_path", seed,
                          "--training.steps", 3, *CPU_PRESET,
                          "--auto_parallel.memory_budget_gib", budget, *extra)
    plan = json.loads((root / "tight_recipe_runtime" / "plan.json").read_text())
    assert plan["recipe_schedule"]["recipe"] == "fsdp" and plan["reshard_after_forward"] is True
    assert plan["recipe_schedule"]["gain_pct"] < 5
    assert "running it as TorchTitan's recipe" in runs["recipe_runtime"].stdout
    assert "[apply] program built" not in runs["recipe_runtime"].stdout
    assert "[apply] program built" in runs["program"].stdout
    as_recipe, program = (parse_losses(runs[k].stdout) for k in ("recipe_runtime", "program"))
    assert sorted(as_recipe) == [1, 2, 3]
    assert all(as_recipe[s] == fp32["fsdp"][s] for s in as_recipe), (as_recipe, fp32["fsdp"])
    assert max(abs(program[s] - fp32["fsdp"][s]) for s in as_recipe) <= LOSS_TOL


@pytest.mark.parametrize("model", ["deepseek_v3"])
def test_moe_models_train_under_auto(model, tmp_path):
    run = _run(f"train_configs/{model}_debug_cpu_auto4.toml", 4, "--job.dump_folder", tmp_path,
               "--training.steps", 3, "--lr_scheduler.warmup_steps", 1, *PROGRAM)
    losses = parse_losses(run.stdout)
    assert sorted(losses) == [1, 2, 3] and all(math.isfinite(v) for v in losses.values())
    assert losses[3] < losses[1]
    ran = (tmp_path / "plan.json").read_text()
    assert json.loads(ran)["manual_regions"], "MoE blocks should be planned as manual regions"
    # what `titan-autopar plan --config` previews is what ran, to the byte
    assert previewed_plan(f"train_configs/{model}_debug_cpu_auto4.toml",
                          tmp_path / "preview.json") == ran


CPU_PRESET = ["--auto_parallel.hardware", "cpu"]  # priced by the preset, not this machine's profile


def test_a_bad_auto_config_says_what_to_change(tmp_path):
    """Under torchrun the refusal reaches the user's terminal and the job ends (the switch's
    other refusals, in-process: `tests/test_bad_input_files.py`)."""
    run = _run(AUTO, 4, "--job.dump_folder", tmp_path, "--training.steps", 1,
               "--parallelism.tensor_parallel_degree", 2, expect_ok=False, timeout=300)
    assert run.returncode != 0
    assert "set data_parallel_shard_degree = 2" in run.stdout, run.stdout[-3000:]


def test_stale_plan_file_is_refused_with_what_differs(trained, tmp_path):
    root, _ = trained
    run = _run(AUTO, 4, "--job.dump_folder", tmp_path, "--training.steps", 1,
               "--auto_parallel.plan_file", root / "auto" / "plan.json",
               "--training.local_batch_size", 4, expect_ok=False, timeout=300)
    assert run.returncode != 0
    assert "cannot be replayed" in run.stdout and "inputs" in run.stdout, run.stdout[-3000:]
