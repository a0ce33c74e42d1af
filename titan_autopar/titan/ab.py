"""A/B: one TorchTitan job under `auto = true` against the expert recipe, on the same start.

`run_ab` writes one seed checkpoint (TorchTitan's `create_seed_checkpoint`, one rank), then
trains the job twice from it on the same data: under auto, and with its expert twin (another
config given as `twin`, or by default the same config with `auto = false`, i.e. TorchTitan's own
recipe for the same degrees). With `rounds` > 1 each arm runs that many times, the arms taking
turns to go first (`round_order`); each arm's figures are the median over its rounds and auto
over the recipe is the median of the ratio within a round (`over_rounds`, `auto_over_recipe`),
so a shared machine's slow spell does not decide the A/B. It reads rank 0's per-step figures
from TorchTitan's log (loss, tokens/s, peak memory), sets them side by side with the plan's
predictions, and writes `ab.json` and `ab.png` (loss curves and throughput) into the output
folder, which each A/B starts empty (`fresh_folder`): it clears an earlier A/B's results there,
known by their layout (`foreign_in_ab_folder`), and refuses a folder that holds anything else
unless forced. The twin may be any TorchTitan config of the same model (`SEED_KEYS`, compared
before anything runs), with or without this package's config module. When an arm fails, the
error is what its failing
rank printed.

Each arm's predicted step time sits beside its measured one: auto's from its plan, the twin's
from the plan's price of the matching recipe (`fsdp_tp` for a twin with tensor parallelism, else
`fsdp`). With a profile of this machine (`hardware = "calibrate"` or a profile file) the table
gives the prediction error (a config with `hardware = "calibrate"` has its ranks measured at the
start of the A/B, `_measure`, so both arms are priced under the load they run in); with a vendor
preset (e.g. h100) the predictions are for that hardware and are not compared with what this
machine measures, which the table says.

`device = "cpu"` runs the arms on CPU ranks (gloo, `titan.launch`); `device = "cuda"` with
TorchTitan's own entry point (`torchrun -m torchtitan.train`, NCCL) on the GPUs of this node.
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from titan_autopar import strict_json
from titan_autopar.cost.profile import is_profile_file
from titan_autopar.files import (FileRefused, check_out_folder, clear_folder, read_capped,
                                 write_atomic)
from titan_autopar.pictures import png_titled, save_png
from titan_autopar.plan import Plan, is_plan_file
from titan_autopar.titan.config_keys import SWITCH_MODULE
from titan_autopar.titan.job_parse import check_job_file
from titan_autopar.titan.launch import failed_rank_lines, launch

# what the twin must share with the config to load its seed checkpoint: the same parameters
# (model, flavor, converters that swap modules) in the same dtype
SEED_KEYS = (("model", "name"), ("model", "flavor"), ("model", "converters"), ("training", "dtype"))

_STEP = re.compile(r"step:\s*(\d+)\s+loss:\s*(\S+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+)")
_RANK0 = re.compile(r"^(?:\[rank0\]:)?(?!\[rank[1-9])")


def step_figures(output: str) -> dict[int, dict]:
    """step -> {loss, memory_gib, tps} from rank 0's TorchTitan log lines."""
    out: dict[int, dict] = {}
    for line in output.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        if not _RANK0.match(line):
            continue
        m = _STEP.search(line)
        if m:
            out.setdefault(int(m.group(1)), {"loss": float(m.group(2)),
                                             "memory_gib": float(m.group(3)),
                                             "tps": float(m.group(4).replace(",", ""))})
    return out


def _check(run, what: str) -> None:
    if run.returncode != 0:
        raise RuntimeError(f"the {what} run failed (exit {run.returncode}); what its failing "
                           f"rank printed:\n{failed_rank_lines(run.stdout)}")


def _summary(fig: dict[int, dict], tokens_per_step: int, model_parallel: int = 1) -> dict:
    """Rank 0's figures over steps 2..: TorchTitan's tps is local tokens per second divided by
    the ranks that share them (tp x cp x pp), so a step takes tokens / (tps x those ranks)."""
    later = [f for s, f in sorted(fig.items()) if s > 1] or list(fig.values())
    tps = statistics.median(f["tps"] for f in later)
    return {"tokens_per_s_per_rank": round(tps, 1),
            "step_time_s": round(tokens_per_step / (tps * model_parallel), 4) if tps else None,
            "peak_memory_gib": max(f["memory_gib"] for f in fig.values()),
            "final_loss": fig[max(fig)]["loss"]}


def _tokens_per_step(cfg: dict) -> int:
    t = cfg.get("training", {})
    return int(t.get("local_batch_size", 8)) * int(t.get("seq_len", 2048))


def _model_parallel(cfg: dict) -> int:
    p = cfg.get("parallelism", {})
    return (int(p.get("tensor_parallel_degree", 1)) * int(p.get("context_parallel_degree", 1))
            * int(p.get("pipeline_parallel_degree", 1)))


def twin_recipe(cfg: dict) -> str:
    """The recipe of the planner's prices that a twin config runs."""
    return "fsdp_tp" if int(cfg.get("parallelism", {}).get("tensor_parallel_degree", 1)) > 1 else "fsdp"


def _has_switch(cfg: dict) -> bool:
    return cfg.get("job", {}).get("custom_config_module") == SWITCH_MODULE


def seed_mismatch(cfg: dict, twin_cfg: dict) -> str | None:
    """None when the twin can start from the config's seed checkpoint, else the first
    `[section] key` whose values differ, both named (TorchTitan's defaults where a file is
    silent)."""
    from torchtitan.config import job_config as tt

    defaults = {"model": tt.Model(), "training": tt.Training()}
    for section, key in SEED_KEYS:
        mine, theirs = (c.get(section, {}).get(key, getattr(defaults[section], key))
                        for c in (cfg, twin_cfg))
        if mine != theirs:
            return f"[{section}] {key} = {theirs!r} where --config has {mine!r}"
    return None


ARM_FOLDERS = ("seed", "auto", "recipe")
_ROUND = "_round"  # a later round's folder: the arm's name, _round, its number
_LATER_ROUND = re.compile(rf"^(auto|recipe){_ROUND}\d+$")


def round_order(r: int) -> tuple[str, str]:
    """Rounds alternate which arm runs first (auto, recipe, then recipe, auto, ...), so a load
    that rises or falls over the A/B weighs on both arms alike."""
    return ("auto", "recipe") if r % 2 == 0 else ("recipe", "auto")


def arm_folder(name: str, r: int) -> str:
    """Each run its own dump folder: a second run in the first's would resume from its last
    checkpoint and train nothing."""
    return name if r == 0 else f"{name}{_ROUND}{r + 1}"


def within_round_ratio(a: list[float], b: list[float]) -> float | None:
    """The median over rounds of a / b in the same round (two runs back to back, under one
    load), so the machine's drift between rounds cancels; a round where either has no figure
    (None or 0: that run failed) does not pair; None if no round pairs up."""
    ratios = [x / y for x, y in zip(a, b) if x and y]
    return statistics.median(ratios) if ratios else None


def round_spread_pct(values: list[float], middle: float) -> float:
    """How far one arm's rounds lie apart: (max - min) / their median, in percent."""
    return round(100 * (max(values) - min(values)) / middle, 1)


def over_rounds(summaries: list[dict]) -> dict:
    """One arm's figures over its rounds: the median of tokens/s and step time, the highest
    peak memory, the first round's final loss (every round starts from the same seed), and each
    round's step time with their spread (max - min over the median, in percent)."""
    first = dict(summaries[0])
    steps = [s["step_time_s"] for s in summaries]
    first["tokens_per_s_per_rank"] = round(
        statistics.median(s["tokens_per_s_per_rank"] for s in summaries), 1)
    first["peak_memory_gib"] = max(s["peak_memory_gib"] for s in summaries)
    first["rounds_tokens_per_s_per_rank"] = [s["tokens_per_s_per_rank"] for s in summaries]
    if all(steps):
        first["step_time_s"] = round(statistics.median(steps), 4)
        first["rounds_step_time_s"] = steps
        first["rounds_spread_pct"] = round_spread_pct(steps, first["step_time_s"])
    return first


def auto_over_recipe(auto: dict, recipe: dict) -> float | None:
    """Auto's tokens/s per rank over the recipe's, within rounds (`within_round_ratio`)."""
    ratio = within_round_ratio(auto["rounds_tokens_per_s_per_rank"],
                               recipe["rounds_tokens_per_s_per_rank"])
    return None if ratio is None else round(ratio, 3)


_PLAN_NAME = re.compile(r"^plan(\.pp\d+(-\d+)?)?\.json$")  # save_plan's, one per pp stage
_CHECKPOINT_STEP = re.compile(r"^step-\d+$")  # a DCP checkpoint folder
_DCP_FILE = re.compile(r"^(\.metadata|__\d+_\d+\.distcp)$")
_TB_RUN = re.compile(r"^\d{8}-\d{4}$")
_TB_FILE = re.compile(r"^events\.out\.tfevents\.")
RESULT_KEYS = ("config", "twin", "ranks", "steps", "device", "rounds", "auto", "recipe",
               "auto_over_recipe", "predicted", "loss")
PICTURE_TITLE = "titan-autopar ab"  # in ab.png's Title chunk


def _only(folder: Path, entry, file) -> bool:
    """True if every entry of `folder` is a folder (not a link) named to match `entry` and
    holding only regular files named to match `file`."""
    for e in folder.iterdir():
        if e.is_symlink() or not e.is_dir() or not entry.match(e.name):
            return False
        if any(f.is_symlink() or not f.is_file() or not file.match(f.name) for f in e.iterdir()):
            return False
    return True


def _is_result(path: Path) -> bool:
    """ab.json as `run_ab` writes it: a JSON object of exactly its keys."""
    try:
        d = strict_json.loads(read_capped(path, name=str(path), what="", fix=""))
    except (FileRefused, strict_json.JsonProblem):
        return False
    return isinstance(d, dict) and sorted(d) == sorted(RESULT_KEYS)


def _foreign_in_arm(arm: Path) -> list[str]:
    """What in one run's dump folder TorchTitan's run (checkpoints: step-N folders of DCP
    files; TensorBoard: dated folders of event files) or save_plan (plans) did not write."""
    out = []
    for e in sorted(arm.iterdir()):
        if e.is_symlink():
            ok = False
        elif e.is_dir():
            ok = _only(e, _CHECKPOINT_STEP, _DCP_FILE) or _only(e, _TB_RUN, _TB_FILE)
        else:
            ok = bool(_PLAN_NAME.match(e.name)) and is_plan_file(e)
        if not ok:
            out.append(f"{arm.name}/{e.name}")
    return out


def foreign_in_ab_folder(out: Path) -> list[str]:
    """What in `out` an A/B did not write, relative to `out`. An A/B writes its run folders
    (seed, auto, recipe, later rounds' auto_round2, ...; each as `_foreign_in_arm` reads it),
    ab.json, ab.png (titled `PICTURE_TITLE`) and, measuring the ranks, profile.json."""
    files = {"ab.json": _is_result, "ab.png": lambda p: png_titled(p, PICTURE_TITLE),
             "profile.json": is_profile_file}
    found = []
    for e in sorted(out.iterdir()):
        n = e.name
        if (n in ARM_FOLDERS or _LATER_ROUND.match(n)) and e.is_dir() and not e.is_symlink():
            found += _foreign_in_arm(e)
        elif n not in files or e.is_symlink() or not e.is_file() or not files[n](e):
            found.append(n)
    return found


def fresh_folder(out: Path, say=print, force: bool = False) -> None:
    """Each A/B starts from an empty output folder: one left by an earlier A/B (nothing in it
    that `foreign_in_ab_folder` finds) is cleared, saying so; a folder holding anything else is
    refused (unless `force`), so nothing of the user's is deleted."""
    check_out_folder(out, label=f"--out {out}", what="an A/B", foreign=foreign_in_ab_folder,
                     force=force)
    if clear_folder(out):
        say(f"[ab] cleared the earlier A/B in {out}: each A/B starts from a fresh seed and empty "
            "run folders")


def run_ab(config, *, nproc: int = 4, steps: int = 20, out_dir=None, twin=None,
           cwd=None, say=print, device: str = "cpu", measure_now: bool = True,
           rounds: int = 1, force: bool = False) -> dict:
    """Seed, auto arm, recipe arm, then the summary (see the module docstring). Every argument
    is checked before anything runs."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"--device {device}: use cpu (gloo ranks) or cuda (this node's GPUs)")
    if device == "cuda":
        import torch

        if torch.cuda.device_count() < nproc:
            raise ValueError(f"--device cuda --nproc {nproc}: this machine has "
                             f"{torch.cuda.device_count()} GPUs")
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"--nproc {nproc}: give the number of CPU ranks, at least 1")
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"--steps {steps}: give the number of training steps, at least 1")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"--rounds {rounds}: give how many times to run each arm, at least 1")
    config = Path(config)
    base = Path(cwd or ".")
    cfg = check_job_file(base / config)
    if not _has_switch(cfg):
        raise ValueError(f"{config} has no [job] custom_config_module = \"{SWITCH_MODULE}\": "
                         "--config must be a job with the auto switch (see docs/user_guide.md); "
                         "the recipe goes in --twin")
    twin_args, twin_cfg = ["--parallelism.no-auto"], cfg
    if twin is not None:
        twin_cfg = check_job_file(base / twin)
        differs = seed_mismatch(cfg, twin_cfg)
        if differs:
            raise ValueError(f"--twin {twin}: {differs}; both arms start from one seed checkpoint "
                             f"of {config}'s model, so the twin must train the same model "
                             f"({', '.join(f'[{s}] {k}' for s, k in SEED_KEYS)}): give the "
                             "expert-recipe config of that model")
        # a twin may be any TorchTitan config; only one that names this package's config
        # module knows [parallelism] auto, and is held to its recipe with it
        twin_args = ["--parallelism.no-auto"] if _has_switch(twin_cfg) else []
    out = Path(out_dir or Path("out") / "ab" / config.stem).resolve()
    fresh_folder(out, say, force)
    auto_extra = ["--parallelism.auto", "--auto_parallel.save_plan", "plan.json"]
    if measure_now and cfg.get("auto_parallel", {}).get("hardware") == "calibrate":
        auto_extra += ["--auto_parallel.hardware", str(_measure(out, nproc, device, cwd, say))]
    say(f"[ab] seed checkpoint (1 rank) -> {out / 'seed'}")
    run = launch(config, 1, ["--job.dump_folder", str(out / "seed"), "--checkpoint.enable",
                             "--checkpoint.create_seed_checkpoint", "--parallelism.no-auto",
                             "--parallelism.data_parallel_shard_degree", "1",
                             "--parallelism.tensor_parallel_degree", "1",
                             "--parallelism.expert_parallel_degree", "1",
                             "--parallelism.pipeline_parallel_degree", "1"],
                 cwd=cwd, stream=False, device=device)
    _check(run, "seed checkpoint")
    seed = out / "seed" / "checkpoint" / "step-0"
    common = ["--checkpoint.enable", "--checkpoint.initial_load_path", str(seed),
              "--checkpoint.interval", str(steps + 1), "--training.steps", str(steps)]
    arms = {"auto": (config, auto_extra),
            "recipe": (Path(twin) if twin else config, twin_args)}
    figures: dict[str, list[dict]] = {"auto": [], "recipe": []}
    for r in range(rounds):
        for name in round_order(r):
            cfg_path, extra = arms[name]
            folder = arm_folder(name, r)
            say(f"[ab] {name}{f' (round {r + 1} of {rounds})' if rounds > 1 else ''}: "
                f"{cfg_path}, {steps} steps on {nproc} ranks")
            run = launch(cfg_path, nproc, ["--job.dump_folder", str(out / folder), *common,
                                           *extra], cwd=cwd, stream=False, device=device)
            _check(run, name)
            fig = step_figures(run.stdout)
            if not fig:
                raise RuntimeError(f"the {name} run printed no step figures on rank 0 (with pp > 1 "
                                   "the loss is printed by the last stage); its last lines:\n"
                                   + "\n".join(run.stdout.splitlines()[-15:]))
            figures[name].append(fig)
    tokens = _tokens_per_step(cfg)
    plan = Plan.load(out / "auto" / "plan.json").data
    recipe = twin_recipe(twin_cfg)
    auto_s = over_rounds([_summary(f, tokens, _model_parallel(cfg)) for f in figures["auto"]])
    rec_s = over_rounds([_summary(f, _tokens_per_step(twin_cfg), _model_parallel(twin_cfg))
                         for f in figures["recipe"]])
    measured_here = bool(plan["hardware"].get("profile"))
    runs_recipe = bool(plan.get("recipe_schedule")) and \
        cfg.get("auto_parallel", {}).get("recipe_runtime", True)
    auto_pred = Plan(plan).predicted_run(runs_recipe)
    for arm, pred in (("auto", auto_pred), ("recipe", plan["recipes"].get(recipe))):
        summ = auto_s if arm == "auto" else rec_s
        summ["predicted_step_time_s"] = round(pred["step_time_s"], 4) if pred else None
        if pred and measured_here and summ["step_time_s"]:
            summ["prediction_error_pct"] = round(
                100 * (pred["step_time_s"] / summ["step_time_s"] - 1), 1)
    result = {
        "config": str(config), "twin": str(twin or f"{config} with auto = false"),
        "ranks": nproc, "steps": steps, "device": device,
        "rounds": rounds, "auto": auto_s, "recipe": rec_s,
        "auto_over_recipe": auto_over_recipe(auto_s, rec_s),
        "predicted": {"hardware": plan["hardware"].get("name"),
                      "profile": plan["hardware"].get("profile", ""),
                      "twin_recipe": recipe,
                      "auto_step_time_s": auto_pred["step_time_s"],
                      "auto_runs_as_recipe": plan["recipe_schedule"]["recipe"] if runs_recipe
                      else None,
                      "auto_peak_memory_gib": auto_pred["peak_memory_gib"],
                      "recipes_step_time_s": {k: v["step_time_s"] for k, v in plan["recipes"].items()}},
        "loss": {name: {s: f["loss"] for s, f in sorted(figs[0].items())}
                 for name, figs in figures.items()},
    }
    write_atomic(out / "ab.json", json.dumps(result, indent=1))
    _plot(result, {name: figs[0] for name, figs in figures.items()}, out / "ab.png")
    return result


def _measure(out: Path, nproc: int, device: str, cwd, say) -> Path:
    """This machine's ranks measured now, into out/profile.json: an A/B compares predictions with
    what the ranks measure during its own arms, and a profile cached hours earlier was measured
    under another load (`hardware = "calibrate"` alone reads the cache: the demo's predictions
    were 2.3x the measured steps with one made while the machine was busy)."""
    import subprocess

    from titan_autopar.titan.launch import calibrate_command

    path = out / "profile.json"
    say(f"[ab] measuring this machine's {nproc} {device} ranks now for the auto arm's prices "
        f"(about 35 s on CPU; --cached-profile uses the one cached) -> {path}")
    cmd, env = calibrate_command(nproc, path, device)
    run = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    if run.returncode != 0 or not path.is_file():
        raise RuntimeError("calibrating this machine failed; its last lines:\n"
                           + "\n".join((run.stdout + run.stderr).splitlines()[-15:]))
    return path


def _plot(result: dict, figures: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    for name, f in figures.items():
        steps = sorted(f)
        a.plot(steps, [f[s]["loss"] for s in steps], marker="o", label=name)
        b.plot(steps, [f[s]["tps"] for s in steps], marker="o", label=name)
    n = result.get("rounds", 1)
    first = f" (round 1 of {n})" if n > 1 else ""
    a.set(xlabel="step", ylabel="loss", title="loss" + first)
    b.set(xlabel="step", ylabel="tokens/s per rank", title="throughput" + first)
    a.legend()
    b.legend()
    arms = ("auto", "recipe")
    x = range(len(arms))
    meas = [result[k]["step_time_s"] or 0.0 for k in arms]
    pred = [result[k].get("predicted_step_time_s") or 0.0 for k in arms]
    c.bar([i - 0.2 for i in x], meas, width=0.4,
          label="measured" + (f" (median of {n} rounds; dots: each round)" if n > 1 else ""))
    if n > 1:
        for i, k in enumerate(arms):
            each = result[k].get("rounds_step_time_s") or []
            c.scatter([i - 0.2] * len(each), each, color="black", s=12, zorder=3)
    c.bar([i + 0.2 for i in x], pred, width=0.4, label=f"predicted ({result['predicted']['hardware']})")
    c.set_xticks(list(x), arms)
    c.set(ylabel="seconds per step", title="step time: predicted against measured")
    tops = meas + pred + [t for k in arms for t in result[k].get("rounds_step_time_s") or []]
    c.set_ylim(0, 1.35 * max(tops + [1e-9]))
    c.legend(loc="upper right")
    fig.suptitle(f"{result['config']}: auto vs recipe, {result['ranks']} ranks")
    fig.tight_layout()
    try:
        save_png(fig, path, PICTURE_TITLE)
    finally:
        plt.close(fig)


def table(result: dict) -> str:
    a, r = result["auto"], result["recipe"]
    rows = [
        ("", "auto", "recipe"),
        ("tokens/s per rank", a["tokens_per_s_per_rank"], r["tokens_per_s_per_rank"]),
        ("step time (s)", a["step_time_s"], r["step_time_s"]),
        ("peak memory (GiB)", a["peak_memory_gib"], r["peak_memory_gib"]),
        ("final loss", a["final_loss"], r["final_loss"]),
    ]
    p = result["predicted"]
    rows.append(("predicted step (s)", a.get("predicted_step_time_s"), r.get("predicted_step_time_s")))
    if p.get("profile"):
        pct = lambda v: None if v is None else f"{v:+.1f}%"  # noqa: E731
        rows.append(("prediction error", pct(a.get("prediction_error_pct")),
                     pct(r.get("prediction_error_pct"))))
    if result.get("rounds", 1) > 1:
        rows.append(("spread over rounds", f"{a.get('rounds_spread_pct')}%", f"{r.get('rounds_spread_pct')}%"))
    lines = [f"{k:<20}{x!s:>14}{y!s:>14}" for k, x, y in rows]
    if result.get("auto_over_recipe") is not None:
        n = result.get("rounds", 1)
        lines.append(f"auto over recipe: {result['auto_over_recipe']:.3f}x tokens/s per rank"
                     + (f" (median over {n} rounds of the ratio within a round)" if n > 1 else
                        " (one run each: on a shared machine, --rounds 3 gives a steadier figure)"))
    lines.append("loss per step:")
    for s, la in result["loss"]["auto"].items():
        lr = result["loss"]["recipe"].get(s)
        lines.append(f"  {s:>4}  {la:>10.5f}  {lr if lr is None else f'{lr:.5f}':>10}")
    whose = (f"measured on this machine: profile {p['profile']}" if p.get("profile")
             else "the preset's figures, not this machine's: set [auto_parallel] hardware = "
             "\"calibrate\" to compare")
    if p.get("auto_runs_as_recipe"):
        lines.append(f"auto's plan is the {p['auto_runs_as_recipe']} recipe's schedule: it ran as "
                     "that recipe, under TorchTitan's own runtime")
    lines.append(f"predicted on {p['hardware']}: auto step {p['auto_step_time_s'] * 1e3:.2f} ms, "
                 f"peak {p['auto_peak_memory_gib']:.2f} GiB; recipes "
                 + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in p["recipes_step_time_s"].items())
                 + f" (the twin runs {p.get('twin_recipe', 'fsdp')}; {whose})")
    return "\n".join(lines)
