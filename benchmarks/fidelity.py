"""Predicted against measured: auto and two expert recipes under TorchTitan's trainer, CPU ranks.

First calibrates this machine's 4 gloo ranks (`titan-autopar calibrate --mesh 2,2`), then, for
each config of the matrix below, trains three arms on 4 ranks with TorchTitan's own trainer:

    fsdp     TorchTitan's recipe, dp_shard = 4                (auto = false)
    fsdp_tp  TorchTitan's recipe, dp_shard = 2 x tp = 2       (auto = false)
    auto     parallelism.auto = true on dp_shard = 4, priced with the calibrated profile (a
             plan predicted no faster than FSDP's schedule runs as the fsdp recipe:
             `recipe_schedule`)

Measured step time: the median over steps 2..N of rank 0's TorchTitan figures (local tokens /
(tokens per second per device x tp)). Each config runs its three arms `--repeats` times (default
3) in rounds of rotated order (fsdp, fsdp_tp, auto; then fsdp_tp, auto, fsdp; then auto, fsdp,
fsdp_tp), so that each arm takes each place once: the machine's drift and a slow spell of a few
minutes fall on every arm alike (alternating orders put one arm twice in the middle, where one
slow spell once cost auto 10% against FSDP); an arm's figure is the median over its rounds, and
its rounds' spread ((max - min) / median) is kept beside it. Every run's output is kept in
<out>/<config>/<arm>/round<N>.log. A run that fails loses its round, not its arm: the arm's
figures are over the rounds that ran, and the ratio within a round pairs only rounds where both
arms ran (a trainer rank once aborted in one round of the plain FSDP recipe); an arm that failed
twice is not run again (qwen3's recipes stop in TorchTitan itself). Predicted: the auto plan's own step, its `recipes.fsdp`,
and `recipes.fsdp_tp` of the same job planned on the 2x2 mesh (`titan-autopar plan --config`),
all with the calibrated profile. Throughput is tokens/s per device (TorchTitan's tps).

Prints a table per config and one JSON line:
  mape                        mean |predicted - measured| / measured over every arm, in %
  rank_agreement              share of configs whose predicted order of the three arms (by
                              throughput) is the measured order
  kendall_tau                 mean over configs of Kendall's tau between the two orders
                              (both over the pairs the prediction orders: where auto's plan
                              runs as the FSDP recipe it is predicted the same, and the
                              measured order of that pair is noise)
  auto_over_best_recipe_min/max  auto's measured throughput / the best recipe's (the one with
                              the higher median), over configs: per config, the median over
                              rounds of the ratio within a round (`paired_ratio`); only over
                              configs where both recipes ran: where one failed in every round,
                              the best of the two is not known (`configs_recipe_failed`).
                              Where auto's plan runs as a recipe (`recipe_schedule`) and its
                              runs were that recipe's program -- every auto run logged that it
                              ran the recipe, and trained to the recipe's losses, each step to
                              the digit (`same_program`) -- the two arms are samples of one
                              program: auto's throughput is that recipe's (1.0 where it is the
                              best), and the ratio as measured, which is the noise between two
                              samples of one program, is kept in `same_program_as_measured`
  rounds_failed               config/arm/round of each run that failed (its log kept)
  repeat_spread_pct_median/max  how far one arm's rounds lie apart (the noise floor: differences
                              between arms smaller than this are not resolved)
  targets                     mape <= 20, rank_agreement >= 0.8, min >= 0.98, >= 2 configs >= 1.05

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fidelity.py [--steps 6] [--only llama3_s256_b2]
    # run some configs again, keeping the others' rows and the same profile:
    ... fidelity.py --profile out/fidelity/profile.json --resume --only A --only B
    # the table and the JSON line again, from a finished run's folder:
    ... fidelity.py --report [--out out/fidelity]

About 10 minutes per round on 2 cores (30 for the default three rounds). The profile is left in out/fidelity/profile.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from titan_autopar.files import write_atomic
from titan_autopar.plan import Plan
from titan_autopar.titan.ab import round_spread_pct, step_figures, within_round_ratio
from titan_autopar.titan.config_check import read_toml
from titan_autopar.titan.launch import failed_rank_lines, launch, parse_losses
from titan_autopar.titan.parallelize import RUNS_AS_RECIPE

REPO = Path(__file__).resolve().parents[1]
CFG = "train_configs/{}_debug_cpu_auto4.toml"

# name, model config, TorchTitan overrides
MATRIX = [
    ("llama3_s256_b2", "llama3", []),
    ("llama3_s512_b1", "llama3", ["--training.seq_len", "512", "--training.local_batch_size", "1"]),
    ("llama3_s128_b4", "llama3", ["--training.seq_len", "128", "--training.local_batch_size", "4"]),
    # few tokens, the same weights: weights dominate, where tensor parallelism should pay
    ("llama3_s32_b1", "llama3", ["--training.seq_len", "32", "--training.local_batch_size", "1"]),
    # auto held to the FSDP recipe's own predicted peak (set from the first config's plan)
    ("llama3_s256_b2_budget", "llama3", []),
    ("llama4_s256_b2", "llama4", []),
    ("deepseek_v3_s256_b2", "deepseek_v3", []),
    ("qwen3_s256_b2", "qwen3_moe", ["--model.flavor", "debugmodel"]),  # the dense, tied flavor
]
ARMS = {"fsdp": ["--parallelism.no-auto"],
        "fsdp_tp": ["--parallelism.no-auto", "--parallelism.data_parallel_shard_degree", "2",
                    "--parallelism.tensor_parallel_degree", "2"],
        "auto": ["--parallelism.auto"]}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(str(v))


def write_job(base: dict, overrides: list[str], path: Path, **sections) -> Path:
    """A copy of the base config with TorchTitan-style overrides ("--a.b", "v") and `sections`
    ({"parallelism": {...}}) applied, as TOML (tables of scalars and lists only)."""
    cfg = json.loads(json.dumps(base))
    for k, v in zip(overrides[::2], overrides[1::2]):
        sec, key = k.removeprefix("--").split(".", 1)
        old = cfg.setdefault(sec, {}).get(key)
        cfg[sec][key] = type(old)(v) if isinstance(old, (int, float)) and not isinstance(old, bool) else v
    for sec, kv in sections.items():
        cfg.setdefault(sec, {}).update(kv)
    lines = []
    for sec, kv in cfg.items():
        lines.append(f"[{sec}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in kv.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def measured_step(output: str, tokens: int, tp: int) -> tuple[float, float] | None:
    """(median step seconds, median tokens/s per device) over steps 2.. of rank 0."""
    fig = step_figures(output)
    later = [f["tps"] for s, f in sorted(fig.items()) if s > 1]
    if not later:
        return None
    tps = statistics.median(later)
    return tokens / (tps * tp), tps


def kendall_tau(a: list[float], b: list[float]) -> float:
    """Kendall's tau over the pairs the prediction `a` orders: a pair it ties (two arms that run
    one program: auto run as the recipe whose schedule it is) predicts no order, and the
    measured order of such a pair is noise."""
    pairs = [(i, j) for i, j in itertools.combinations(range(len(a)), 2) if a[i] != a[j]]
    if not pairs:
        return 1.0
    s = sum((1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1) for i, j in pairs)
    return s / len(pairs)


def paired_ratio(auto: dict, best: dict) -> float:
    """Auto's throughput over the best recipe's: the median over rounds of the two arms' ratio in
    the same round (run minutes apart, under the same load), so that the machine's drift between
    rounds cancels; a round where either run failed (None) does not pair. The ratio of the
    medians where no round pairs up."""
    a, b = auto.get("measured_runs_tps", []), best.get("measured_runs_tps", [])
    paired = within_round_ratio(a, b) if len(a) == len(b) else None
    return paired if paired is not None else auto["measured_tps"] / best["measured_tps"]


def same_program(folder: Path, arms: dict, recipe: str) -> bool:
    """Whether every auto run of the config in `folder` ran `recipe`'s own program: each of its
    logs (`<arm>/round<N>.log` of the rounds that ran) says so on every rank, and its losses
    are, step for step and to the digit, those of every run of the recipe's arm."""
    def logs(arm):
        ran = [folder / arm / f"round{i + 1}.log"
               for i, m in enumerate(arms[arm].get("measured_runs_tps") or []) if m is not None]
        return [p.read_text() for p in ran if p.exists()]
    auto, rec = logs("auto"), logs(recipe)
    if not auto or not rec:
        return False
    ranks = max(len(set(re.findall(r"^\[rank(\d+)\]:", t, re.M))) for t in auto + rec)
    said = all(t.count(RUNS_AS_RECIPE) >= ranks for t in auto)
    losses = [parse_losses(t) for t in auto + rec]
    return said and bool(losses[0]) and all(x == losses[0] for x in losses)


def arm_row(runs: list, failures: list[dict]) -> dict:
    """One arm's figures over its rounds: `runs` holds (step s, tokens/s) or None (that round's
    run failed) per round, `failures` what each failed run said and where its log is."""
    ok = [m for m in runs if m is not None]
    r = {"ok": bool(ok)}
    if failures:
        r["failed_rounds"] = failures
    if not ok:
        r["error"] = failures[-1]["error"] if failures else "not run"
        return r
    steps = [m[0] for m in ok]
    r["measured_step_s"] = round(statistics.median(steps), 4)
    r["measured_tps"] = statistics.median(m[1] for m in ok)
    r["measured_runs_s"] = [None if m is None else round(m[0], 4) for m in runs]
    r["measured_runs_tps"] = [None if m is None else round(m[1], 2) for m in runs]
    r["spread_pct"] = round_spread_pct(steps, r["measured_step_s"])
    return r


def predict_2x2(job: Path, profile: Path, out: Path) -> dict:
    out.unlink(missing_ok=True)
    run = subprocess.run([sys.executable, "-m", "titan_autopar.cli", "plan", "--config", str(job),
                          "--hardware", str(profile), "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"planning {job} on 2x2 failed:\n{run.stdout[-2000:]}{run.stderr[-2000:]}")
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the three arms, in "
                    "rotated order; each arm's figure is the median over rounds")
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--out", default="out/fidelity")
    ap.add_argument("--profile", default="", help="use this profile instead of calibrating")
    ap.add_argument("--resume", action="store_true", help="keep the rows of --out/rows.json and "
                    "run only the configs named by --only (with the same --profile)")
    ap.add_argument("--report", action="store_true", help="run nothing: the table and the JSON "
                    "line again from --out's rows.json and run logs")
    a = ap.parse_args()
    out = (REPO / a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    say = lambda s: print(f"[fidelity {time.perf_counter() - t0:6.0f}s] {s}", flush=True)  # noqa: E731
    profile = Path(a.profile).resolve() if a.profile else out / "profile.json"
    if a.report:
        return report(json.loads((out / "rows.json").read_text()), profile, out)
    if not a.profile:
        say("calibrating 4 ranks on a 2x2 mesh")
        run = subprocess.run([sys.executable, "-m", "titan_autopar.cli", "calibrate", "--nproc", "4",
                              "--mesh", "2,2", "--out", str(profile)], cwd=REPO,
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"calibration failed:\n{run.stdout[-3000:]}{run.stderr[-3000:]}")
    rows, budget = [], None
    if a.resume:
        rows = [r for r in json.loads((out / "rows.json").read_text()) if r["config"] not in a.only]
        budget = next((r.get("budget_gib") for r in rows if r["config"] == "llama3_s256_b2"), None)
    for name, model, over in MATRIX:
        if a.only and name not in a.only:
            continue
        base = read_toml(REPO / CFG.format(model))
        d = out / name
        d.mkdir(exist_ok=True)
        t = base["training"]
        lb = int(dict(zip(over[::2], over[1::2])).get("--training.local_batch_size", t["local_batch_size"]))
        seq = int(dict(zip(over[::2], over[1::2])).get("--training.seq_len", t["seq_len"]))
        extra_ap = {"hardware": str(profile), "save_plan": "plan.json"}
        if name.endswith("_budget"):
            if budget is None:
                say(f"{name}: skipped (needs llama3_s256_b2 first for the FSDP recipe's peak)")
                continue
            extra_ap["memory_budget_gib"] = budget
        job = write_job(base, over, d / "job.toml", auto_parallel=extra_ap,
                        checkpoint={"enable": False}, metrics={"enable_tensorboard": False})
        job2 = write_job(base, over, d / "job_2x2.toml", auto_parallel=extra_ap,
                         parallelism={"data_parallel_shard_degree": 2, "tensor_parallel_degree": 2})
        row = {"config": name, "tokens_per_rank": lb * seq, "arms": {}}
        say(f"{name}: predicting fsdp_tp on 2x2")
        try:
            p2 = predict_2x2(job2, profile, d / "plan_2x2.json")
            pred_tp = p2["recipes"].get("fsdp_tp", {}).get("step_time_s")
        except RuntimeError as e:
            pred_tp = None
            say(str(e).splitlines()[0])
        runs = {arm: [None] * a.repeats for arm in ARMS}
        failures = {arm: [] for arm in ARMS}
        # the first round plans afresh (a plan an earlier run of this folder saved would be
        # reused by the trainer when made by the same planner revision); the later ones reuse it
        (d / "auto" / "plan.json").unlink(missing_ok=True)
        for rnd in range(a.repeats):  # rounds in rotated order: each arm in each place once
            for arm in list(ARMS)[rnd % 3:] + list(ARMS)[:rnd % 3]:
                if len(failures[arm]) >= 2:  # it fails for a reason of its own
                    continue
                say(f"{name}: {arm}, {a.steps} steps on 4 ranks (round {rnd + 1}/{a.repeats})")
                folder = d / arm
                run = launch(job, 4, ["--job.dump_folder", str(folder), "--training.steps",
                                      str(a.steps), *ARMS[arm]], cwd=REPO, stream=False, timeout=1200)
                log = write_atomic(folder / f"round{rnd + 1}.log", run.stdout)
                tp = 2 if arm == "fsdp_tp" else 1
                m = measured_step(run.stdout, lb * seq, tp) if run.returncode == 0 else None
                if m is None:
                    error = failed_rank_lines(run.stdout)[-600:]
                    failures[arm].append({"round": rnd + 1, "returncode": run.returncode,
                                          "error": error, "log": str(log.relative_to(out))})
                    lines = error.splitlines() or [""]
                    say(f"{name}: {arm} failed in round {rnd + 1} (log {log}): "
                        + next((x for x in reversed(lines) if "Error" in x), lines[-1]))
                else:
                    runs[arm][rnd] = m
        for arm in ARMS:
            row["arms"][arm] = arm_row(runs[arm], failures[arm])
        plan = json.loads((d / "auto" / "plan.json").read_text()) if (d / "auto" / "plan.json").exists() else None
        if plan:
            # what ran: a plan predicted less than 5% faster than the FSDP recipe runs as it
            row["arms"]["auto"]["predicted_step_s"] = Plan(plan).predicted_run()["step_time_s"]
            row["arms"]["auto"]["runs_as_recipe"] = Plan(plan).recipe_schedule
            row["arms"]["fsdp"]["predicted_step_s"] = plan["recipes"]["fsdp"]["step_time_s"]
            if name == "llama3_s256_b2":  # 2% above the recipe's peak: as lean as FSDP
                budget = math.ceil(plan["recipes"]["fsdp"]["peak_memory_gib"] * 1.02e4) / 1e4
                row["budget_gib"] = budget
        if pred_tp is not None:
            row["arms"]["fsdp_tp"]["predicted_step_s"] = pred_tp
        for arm, r in row["arms"].items():
            tp = 2 if arm == "fsdp_tp" else 1
            if "predicted_step_s" in r:
                r["predicted_tps"] = lb * seq / (r["predicted_step_s"] * tp)
        if "memory_budget_gib" in extra_ap:
            row["budget_gib"] = extra_ap["memory_budget_gib"]
        rows.append(row)
        say(f"{name}: " + "  ".join(
            f"{arm} measured {r.get('measured_step_s', float('nan')):.3f}s predicted "
            f"{r.get('predicted_step_s', float('nan')):.3f}s" for arm, r in row["arms"].items()))
        write_atomic(out / "rows.json", json.dumps(rows, indent=1))
    order = [m[0] for m in MATRIX]
    rows.sort(key=lambda r: order.index(r["config"]))
    write_atomic(out / "rows.json", json.dumps(rows, indent=1))
    return report(rows, profile, out)


def report(rows: list[dict], profile: Path, out: Path | None = None) -> int:
    """The table and the JSON line, from the rows (and, under `out`, the runs' logs, which
    `same_program` reads)."""
    errs, agree, taus, ratios, as_measured = [], [], [], {}, {}
    spreads = [r["spread_pct"] for row in rows for r in row["arms"].values() if "spread_pct" in r]
    print(f"{'config':<24}{'arm':<9}{'predicted s':>12}{'measured s':>12}{'error %':>9}"
          f"{'pred tps':>10}{'meas tps':>10}")
    for row in rows:
        arms = row["arms"]
        for arm, r in arms.items():
            p, m = r.get("predicted_step_s"), r.get("measured_step_s")
            e = 100 * (p - m) / m if p and m else None
            if e is not None:
                errs.append(abs(e))
            print(f"{row['config']:<24}{arm:<9}{'-' if p is None else f'{p:.3f}':>12}"
                  f"{'failed' if m is None else f'{m:.3f}':>12}{'' if e is None else f'{e:+.0f}':>9}"
                  f"{r.get('predicted_tps', 0):>10.0f}{r.get('measured_tps', 0):>10.0f}")
        full = [k for k, r in arms.items() if r.get("ok") and "predicted_tps" in r]
        if len(full) == 3:
            pt = [arms[k]["predicted_tps"] for k in full]
            mt = [arms[k]["measured_tps"] for k in full]
            tau = kendall_tau(pt, mt)
            taus.append(tau)
            agree.append(tau == 1.0)
        rec = [k for k in ("fsdp", "fsdp_tp") if arms[k].get("ok")]
        if arms["auto"].get("ok") and len(rec) == 2:
            best = max(rec, key=lambda k: arms[k]["measured_tps"])
            ratios[row["config"]] = paired_ratio(arms["auto"], arms[best])
            ran = arms["auto"].get("runs_as_recipe")
            if ran and out is not None and same_program(out / row["config"], arms, ran):
                as_measured[row["config"]] = round(ratios[row["config"]], 3)
                ratios[row["config"]] = 1.0 if best == ran else paired_ratio(arms[ran], arms[best])
    res = {
        "benchmark": "fidelity", "configs": len(rows), "profile": str(profile.name),
        "mape": round(statistics.mean(errs), 1) if errs else None,
        "rank_agreement": round(sum(agree) / len(agree), 2) if agree else None,
        "kendall_tau": round(statistics.mean(taus), 2) if taus else None,
        "auto_over_best_recipe_min": round(min(ratios.values()), 3) if ratios else None,
        "auto_over_best_recipe_max": round(max(ratios.values()), 3) if ratios else None,
        "auto_over_best_recipe": {k: round(v, 3) for k, v in ratios.items()},
        "configs_auto_at_least_1.05": sum(v >= 1.05 for v in ratios.values()),
        # auto ran a recipe's own program: its ratio to that recipe as measured (noise)
        "same_program_as_measured": as_measured,
        "arms_failed": [f"{r['config']}/{k}" for r in rows for k, x in r["arms"].items() if not x["ok"]],
        "rounds_failed": [f"{r['config']}/{k}/round{f['round']}" for r in rows
                          for k, x in r["arms"].items() for f in x.get("failed_rounds", [])],
        # auto ran but a recipe failed in every round: which recipe is best is not known
        "configs_recipe_failed": [r["config"] for r in rows if r["arms"]["auto"].get("ok") and not
                                  all(r["arms"][k].get("ok") for k in ("fsdp", "fsdp_tp"))],
        # how far one arm's rounds lie apart: differences between arms below this are noise
        "repeat_spread_pct_median": round(statistics.median(spreads), 1) if spreads else None,
        "repeat_spread_pct_max": round(max(spreads), 1) if spreads else None,
    }
    res["targets_met"] = {
        "mape<=20": res["mape"] is not None and res["mape"] <= 20,
        "rank_agreement>=0.8": res["rank_agreement"] is not None and res["rank_agreement"] >= 0.8,
        "auto>=0.98x_everywhere": res["auto_over_best_recipe_min"] is not None
        and res["auto_over_best_recipe_min"] >= 0.98,
        "auto>=1.05x_on_2": res["configs_auto_at_least_1.05"] >= 2,
    }
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
