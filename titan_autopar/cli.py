"""`titan-autopar`: plan a TorchTitan model on a simulated cluster, explain and diff plans.

  titan-autopar plan --model llama3 --flavor 8B --mesh dp_shard=8,tp=8 --hardware h100 \
      --seq-len 8192 --local-batch-size 1 --out plan.json
  titan-autopar plan --config train_configs/llama3_8b_64gpu_auto.toml --explain
  titan-autopar explain plan.json
  titan-autopar diff a.json b.json
  titan-autopar calibrate --nproc 4 --mesh 2,2 --out profile.json   # measure this machine
  titan-autopar show plan.json --out plan.png                         # a picture of a plan

`plan` simulates the mesh with torch's fake process group in this one process: no GPU needed.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

MAX_MESH_RANKS = 1 << 16


def parse_mesh(text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    from titan_autopar.solve.recipes import check_dim_names

    names, sizes = [], []
    for part in text.split(","):
        if "=" not in part:
            raise ValueError(f"--mesh wants name=size pairs like dp_shard=8,tp=8; got {part!r}")
        n, s = part.split("=", 1)
        if not s.strip().isdigit() or int(s) < 1:
            raise ValueError(f"--mesh: size of {n!r} must be a positive integer, got {s!r}")
        names.append(n.strip())
        sizes.append(int(s))
    if len(set(names)) != len(names):
        raise ValueError(f"--mesh names a dim twice: {text!r}")
    check_dim_names(names)
    if math.prod(sizes) > MAX_MESH_RANKS:
        raise ValueError(f"--mesh {text} has {math.prod(sizes)} ranks; the simulated cluster "
                         f"holds at most {MAX_MESH_RANKS}")
    return tuple(names), tuple(sizes)


def _positive(kind):
    """An argparse type: a finite number (int or float) above zero."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'a whole number' if kind is int else 'a number'}, got {text!r}") from None
        if not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
        return v
    return parse


def check_out_path(out: str, force: bool) -> Path:
    """Refuse, before any planning, an --out that cannot take a plan: a folder, a path under a
    file, or an existing file that is not a plan (unless `force`)."""
    from titan_autopar.plan import is_plan_file

    p = Path(out)
    if p.is_dir():
        raise ValueError(f"--out {out} is a folder: give a file name such as {p / 'plan.json'}")
    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"--out {out}: {parent} is a file, so nothing can be written under "
                             "it; choose another --out")
    if p.exists() and not force and not is_plan_file(p):
        raise ValueError(f"--out {out} exists and is not a plan: refusing to overwrite it. Choose "
                         "another --out, or add --force to replace it")
    return p


def fake_mesh(names, sizes):
    """A DeviceMesh of prod(sizes) simulated ranks (torch's fake process group)."""
    import math

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world = math.prod(sizes)
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    return init_device_mesh("cpu", tuple(sizes), mesh_dim_names=tuple(names))


def _calibrated_here(config, world: int) -> str:
    """A job's `hardware = "calibrate"` planned ahead: the profile its ranks measured on this
    machine, if one is cached; else say how to make one."""
    from titan_autopar.cost.profile import cached_profile_path, machine_description

    here = machine_description("cpu", "gloo", world, world, 1)
    path = cached_profile_path(here["fingerprint"])
    if path.is_file():
        print(f"[hardware] {config} says \"calibrate\": using the profile of this machine's "
              f"{world} CPU ranks, {path}", flush=True)
        return str(path)
    raise ValueError(f"{config}: [auto_parallel] hardware = \"calibrate\" measures the job's "
                     "ranks when it runs, and none has run on this machine yet. To plan it here, "
                     f"give --hardware profile.json (from `titan-autopar calibrate --nproc {world} "
                     "--out profile.json`) or a preset such as --hardware cpu")


def cmd_plan(a) -> int:
    check_out_path(a.out, a.force)
    import torch

    from titan_autopar import plan_model
    from titan_autopar.cost.memory import Precision
    from titan_autopar.titan.loop_collectives import trainer_loop_collectives
    from titan_autopar.titan.models import build_model, global_batch

    if a.config:  # the job file decides model, shapes, mesh, hardware and budget
        from titan_autopar.titan.job_file import planning_job

        job = planning_job(a.config)
        a.model, a.flavor, a.seq_len = job.model, job.flavor, job.seq_len
        a.local_batch_size, a.hardware = job.local_batch_size, a.hardware or job.hardware
        a.memory_budget_gib = a.memory_budget_gib or job.memory_budget_gib
        a.activation_checkpointing = job.activation_checkpointing
        a.cp_attention = job.cp_attention if a.cp_attention is None else a.cp_attention
        a.param_dtype = job.param_dtype or "float32"  # the job computes in fp32: priced so
        a.mesh = ",".join(f"{n}={s}" for n, s in zip(job.mesh_names, job.mesh_sizes))
    a.hardware = a.hardware or "h100"
    if a.search and not a.config:
        raise ValueError("--search needs --config: the degree search takes the job's rank count, "
                         "model and batch from a TorchTitan TOML")
    if a.hardware == "calibrate":
        a.hardware = _calibrated_here(a.config, job.world_size if a.config else 1)
    names, sizes = parse_mesh(a.mesh)
    t0 = time.perf_counter()
    say = lambda s: print(f"[{time.perf_counter() - t0:6.1f}s] {s}", flush=True)  # noqa: E731
    if a.search or (a.config and job.search_degrees):
        return _search(a, job, say)
    say(f"building {a.model} {a.flavor} on the meta device")
    model, _ = build_model(a.model, a.flavor, a.seq_len)
    from titan_autopar.titan.manual_marks import mark_job_regions, mark_mesh_regions

    if a.config:
        marked = mark_job_regions(model, job.expert_parallel, job.manual_modules, job.manual_style)
        style = job.manual_style if job.manual_modules else "torchtitan_ep"
    else:  # an ep dim runs the MoE blocks expert-parallel, as a job with that degree does
        marked, style = mark_mesh_regions(model, names, sizes), "torchtitan_ep"
    if marked:
        say(f"manual regions ({style}): {', '.join(marked[:4])}"
            f"{' ...' if len(marked) > 4 else ''}")
    mesh = fake_mesh(names, sizes)
    batch = global_batch(a.local_batch_size, names, sizes)
    tokens = torch.zeros(batch, a.seq_len, dtype=torch.long)
    say(f"planning a global batch of {batch} x {a.seq_len} tokens on {'x'.join(map(str, sizes))} "
        f"simulated {a.hardware} ranks")
    plan = plan_model(model, mesh, (tokens,), hardware=a.hardware, memory_budget_gib=a.memory_budget_gib,
                      solver=a.solver, time_limit_s=a.time_limit_s,
                      activation_checkpointing=a.activation_checkpointing,
                      param_dtype=getattr(torch, a.param_dtype) if a.param_dtype not in
                      (None, "float32") else None,
                      precision=Precision(exact_floats=True) if a.param_dtype == "float32" else None,
                      cp_attention=a.cp_attention or "cheapest", progress=say,
                      loop_collectives=trainer_loop_collectives(names, sizes, job.log_freq)
                      if a.config else ())
    plan.save(a.out, timings=a.timings)
    say(f"wrote {a.out}")
    if a.explain:
        print(plan.explain())
    return 0


def _search(a, job, say) -> int:
    """`plan --config X --search`: rank the job's degrees, write the winner's plan, its
    [parallelism] block and the table beside --out."""
    from titan_autopar.files import write_atomic
    from titan_autopar.titan.degree_search import search_degrees, table

    res = search_degrees(job, hardware=a.hardware, make_mesh=fake_mesh, top=a.top, say=say,
                         solver=a.solver)
    text = table(res, a.hardware)
    print(text)
    out = Path(a.out)
    res.plans[res.winner.degrees].save(out, timings=a.timings)
    stem = out.with_suffix("")
    block, md = stem.with_suffix(".parallelism.toml"), stem.with_suffix(".search.md")
    write_atomic(block, f"# the degrees `titan-autopar plan --config {a.config} --search` chose\n"
           + res.winner.degrees.toml())
    write_atomic(md, text + "\n")
    say(f"wrote {out} (the winner's plan), {block} and {md}")
    return 0



def cmd_explain(a) -> int:
    from titan_autopar import Plan

    print(Plan.load(a.plan).explain())
    return 0


def cmd_diff(a) -> int:
    from titan_autopar import Plan

    print(Plan.load(a.a).diff(Plan.load(a.b)))
    return 0


def cmd_show(a) -> int:
    from titan_autopar import Plan
    from titan_autopar.plan_picture import draw

    out = Path(a.out)
    if out.suffix.lower() != ".png" or out.is_dir():
        raise ValueError(f"--out {a.out}: give a .png file name, such as plan.png")
    print(f"wrote {draw(Plan.load(a.plan), out)}")
    return 0


def cmd_ab(a) -> int:
    from titan_autopar.titan.ab import run_ab, table

    res = run_ab(a.config, nproc=a.nproc, steps=a.steps, out_dir=a.out, twin=a.twin,
                 device=a.device, measure_now=not a.cached_profile, rounds=a.rounds)
    print(table(res))
    out = a.out or f"out/ab/{Path(a.config).stem}"
    print(f"[ab] wrote {out}/ab.json and {out}/ab.png")
    return 0


def cmd_calibrate(a) -> int:
    import subprocess

    from titan_autopar.titan.launch import calibrate_command

    out = Path(a.out)
    if out.is_dir():
        raise ValueError(f"--out {a.out} is a folder: give a file name such as {out / 'profile.json'}")
    if a.mesh:
        sizes = [int(x) for x in a.mesh.split(",") if x.strip().isdigit()]
        if len(sizes) != len(a.mesh.split(",")) or math.prod(sizes) != a.nproc:
            raise ValueError(f"--mesh {a.mesh}: give sizes like 2,2 whose product is --nproc "
                             f"{a.nproc}")
    cmd, env = calibrate_command(a.nproc, out, a.device, a.mesh)
    print(f"[calibrate] measuring {a.nproc} {a.device} ranks (about 35 s on CPU)", flush=True)
    run = subprocess.run(cmd, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"calibration failed (exit {run.returncode}); its output is above")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="titan-autopar", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="plan a TorchTitan model on a simulated cluster")
    p.add_argument("--config", default=None, help="a TorchTitan TOML: plan that job (its model, "
                   "flavor, seq_len, local_batch_size, degrees, hardware); replaces the options below")
    p.add_argument("--model", default="llama3")
    p.add_argument("--flavor", default="8B")
    p.add_argument("--mesh", default="dp_shard=8,tp=8", help="name=size,... outermost first")
    p.add_argument("--hardware", default=None, help="a preset (h100, h200, a100, b200, cpu) or "
                   "a profile file from `titan-autopar calibrate` (default h100, or the config's)")
    p.add_argument("--seq-len", type=_positive(int), default=8192)
    p.add_argument("--local-batch-size", type=_positive(int), default=1)
    p.add_argument("--memory-budget-gib", type=_positive(float), default=None)
    p.add_argument("--solver", default="highs", choices=["highs", "cbc", "joint"],
                   help="highs (default): HiGHS in this process; cbc: CBC in a subprocess; "
                   "joint: one exact program over every mesh dim, a check on the default "
                   "descent for small problems only")
    p.add_argument("--activation-checkpointing", default="none",
                   choices=["none", "selective", "full"],
                   help="recompute block activations in backward (TorchTitan's AC modes)")
    p.add_argument("--cp-attention", default=None, choices=["cheapest", "ring"],
                   help="attention on a cp dim: whatever is priced lowest (default: batch, heads "
                   "or sequence -- ring attention -- sharded, or replicated), or always ring "
                   "attention, as TorchTitan's CP recipe")
    p.add_argument("--param-dtype", default=None, choices=["bfloat16", "float32"],
                   help="compute with parameters cast to bfloat16 (mixed precision), or in "
                   "float32 throughout; default: priced as TorchTitan's bf16 default")
    p.add_argument("--time-limit-s", type=_positive(float), default=None,
                   help="wall-clock guard per integer program (default 600 s); programs stop "
                   "by counted limits, so plans do not depend on the machine's load")
    p.add_argument("--search", action="store_true", help="with --config: search the job's "
                   "parallelism degrees (dp_replicate x dp_shard x tp, x ep for MoE) for its rank "
                   "count; print a ranked table and write the winner's plan and [parallelism] block")
    p.add_argument("--top", type=_positive(int), default=2,
                   help="with --search: how many of the best-screened degrees to plan in full")
    p.add_argument("--out", default="plan.json")
    p.add_argument("--force", action="store_true",
                   help="replace --out even if it exists and is not a plan")
    p.add_argument("--timings", action="store_true", help="also write wall-clock phase timings")
    p.add_argument("--explain", action="store_true", help="print the plan's explanation")
    p.set_defaults(fn=cmd_plan)
    p = sub.add_parser("explain", help="per-layer table of a saved plan")
    p.add_argument("plan")
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("diff", help="what changed between two plans")
    p.add_argument("a")
    p.add_argument("b")
    p.set_defaults(fn=cmd_diff)
    p = sub.add_parser("show", help="draw a plan: placements, memory, communication, step time")
    p.add_argument("plan")
    p.add_argument("--out", default="plan.png")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("ab", help="train a TorchTitan config under auto and with its expert "
                       "twin from one seed checkpoint (CPU ranks or GPUs), and compare")
    p.add_argument("--config", required=True, help="a TorchTitan TOML with the auto switch")
    p.add_argument("--twin", default=None, help="the expert-recipe config (default: the same "
                   "config with auto = false)")
    p.add_argument("--nproc", type=_positive(int), default=4)
    p.add_argument("--steps", type=_positive(int), default=20)
    p.add_argument("--out", default=None, help="output folder (default out/ab/<config name>)")
    p.add_argument("--rounds", type=_positive(int), default=1, help="run each arm this many "
                   "times, taking turns to go first; figures are medians over the rounds")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cpu: gloo ranks; cuda: this node's GPUs with TorchTitan's own launcher")
    p.add_argument("--cached-profile", action="store_true", help="with hardware = \"calibrate\", "
                   "price the auto arm with the profile cached for this machine instead of "
                   "measuring its ranks first")
    p.set_defaults(fn=cmd_ab)
    p = sub.add_parser("calibrate", help="measure this machine's ranks and write a hardware "
                       "profile that --hardware and [auto_parallel] hardware accept")
    p.add_argument("--nproc", type=_positive(int), default=4, help="ranks, as the job runs them")
    p.add_argument("--mesh", default="", help="mesh dim sizes to measure collectives on, e.g. 2,2 "
                   "(default: all ranks in one dim)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", default="profile.json")
    p.set_defaults(fn=cmd_calibrate)
    a = ap.parse_args(argv)
    try:
        return a.fn(a)
    except (ValueError, OSError, RuntimeError) as e:  # what a user can act on
        if os.environ.get("TITAN_AUTOPAR_TRACEBACK"):
            raise
        msg = str(e) if not isinstance(e, OSError) or not e.filename else \
            f"{e.filename}: {e.strerror}"
        print(f"titan-autopar {a.cmd}: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"titan-autopar {a.cmd}: interrupted; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
