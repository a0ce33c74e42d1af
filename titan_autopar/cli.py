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

from titan_autopar.limits import MAX_LOCAL_BATCH, MAX_MEMORY_BUDGET_GIB, MAX_MESH_RANKS, MAX_SEQ_LEN

# what `plan` uses for a flag that is not given and no --config decides
PLAN_DEFAULTS = {"model": "llama3", "flavor": "8B", "mesh": "dp_shard=8,tp=8", "hardware": "h100",
                 "seq_len": 8192, "local_batch_size": 1, "memory_budget_gib": None,
                 "solver": "highs", "time_limit_s": None, "activation_checkpointing": "none",
                 "cp_attention": None, "param_dtype": None}


def parse_mesh(text: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    from titan_autopar.solve.recipes import check_dim_names

    names, sizes = [], []
    for part in text.split(","):
        if "=" not in part:
            raise ValueError(f"--mesh wants name=size pairs like dp_shard=8,tp=8; got {part!r}")
        n, s = part.split("=", 1)
        names.append(n.strip())
        sizes.append(whole_size(s, f"--mesh: size of {n.strip()!r}"))
    if len(set(names)) != len(names):
        raise ValueError(f"--mesh names a dim twice: {text!r}")
    check_dim_names(names)
    if math.prod(sizes) > MAX_MESH_RANKS:
        raise ValueError(f"--mesh {text} has {math.prod(sizes)} ranks; the simulated cluster "
                         f"holds at most {MAX_MESH_RANKS}")
    return tuple(names), tuple(sizes)


def whole_size(text: str, what: str) -> int:
    """`text` as a size of at least 1, written in the digits 0-9 ("²" is not a size)."""
    t = text.strip()
    if not (t.isascii() and t.isdigit()) or int(t) < 1:
        raise ValueError(f"{what} must be a positive integer (a whole number such as 8, in the "
                         f"digits 0-9), got {text!r}")
    return int(t)


def _positive(kind, most=None):
    """An argparse type: a finite number (int or float) above zero, and at most `most`."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'a whole number' if kind is int else 'a number'}, got {text!r}") from None
        if not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
        if most is not None and v > most:
            raise argparse.ArgumentTypeError(f"must be at most {int(most)}, got {text!r}")
        return v
    return parse


def check_out_path(out: str, force: bool) -> Path:
    """Refuse, before any planning, an --out that cannot take a plan (`files.check_out_file`):
    a folder, a device or pipe, a path under a file, a name too long, or an existing file that
    is not a plan (unless `force`)."""
    from titan_autopar.files import check_out_file
    from titan_autopar.plan import is_plan_file

    p = check_out_file(out, label=f"--out {out}", what="a plan", ours=is_plan_file,
                       force=force)
    check_writable(p)
    return p


def check_profile_given(hardware: str, given_as: str) -> None:
    """A profile path (`--hardware PATH`, a config's `[auto_parallel] hardware = "PATH"`) read
    and checked before any work; the error names where it was given."""
    from titan_autopar.cost.hardware import get_hardware, is_profile_path

    if is_profile_path(hardware):
        try:
            get_hardware(hardware)
        except ValueError as e:
            raise ValueError(f"{given_as}: {e}") from None


def check_writable(p: Path, flag: str = "--out") -> None:
    """Refuse, before any work, a file path whose folder cannot take a new file: a parent that
    is a file, or a folder this process cannot write (tried with a file of its own, removed)."""
    import tempfile

    for parent in p.parents:
        if parent.exists() and not parent.is_dir():
            raise ValueError(f"{flag} {p}: {parent} is a file, so nothing can be written under "
                             f"it; choose another {flag}")
    folder = next(d for d in p.absolute().parents if d.exists())
    try:
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".titan_autopar_probe.")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise ValueError(f"{flag} {p}: the folder {folder} cannot be written ({e.strerror}); "
                         f"choose another {flag}") from None


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


def _job_with_flags(a, given: set[str]):
    """The job `--config` names, with every flag given in its place (one rule: a flag given
    overrides the config)."""
    from titan_autopar.titan.job_file import planning_job, with_flags

    flags = {k: getattr(a, k) for k in given if k != "mesh"}
    if "mesh" in given:
        flags["mesh"] = parse_mesh(a.mesh)
    return with_flags(planning_job(a.config), flags)


def cmd_plan(a) -> int:
    check_out_path(a.out, a.force)
    given = {k for k in PLAN_DEFAULTS if getattr(a, k) is not None}
    if a.search and not a.config:
        raise ValueError("--search needs --config: the degree search takes the job's rank count, "
                         "model and batch from a TorchTitan TOML")
    if a.hardware == "calibrate" and not a.config:
        raise ValueError("--hardware calibrate measures the ranks of a job, so it needs --config "
                         "JOB.toml (the job to measure); to price this machine without a job, "
                         "run `titan-autopar calibrate --out profile.json` and give --hardware "
                         "profile.json")
    job = _job_with_flags(a, given) if a.config else None
    search = bool(a.search or (job and job.search_degrees))
    if a.top is not None and not search:
        raise ValueError("--top counts the degrees the search plans in full, so it needs --search "
                         "(with --config): add --search, or drop --top")
    if search and "mesh" in given:
        raise ValueError("--mesh with --search: the search chooses the mesh from the job's rank "
                         "count; drop --mesh to search, or drop --search to plan that mesh")
    if search:
        from titan_autopar.titan.search_outputs import check_search_outputs

        check_search_outputs(a.out, a.force)
    given_as = (f"--hardware {a.hardware}" if "hardware" in given or job is None
                else f"{a.config}: [auto_parallel] hardware = {job.hardware!r}")
    if job is not None:  # the job, flags written in, decides everything
        a.model, a.flavor, a.seq_len, a.hardware = job.model, job.flavor, job.seq_len, job.hardware
        names, sizes = job.mesh_names, job.mesh_sizes
    else:
        for k, v in PLAN_DEFAULTS.items():
            if getattr(a, k) is None:
                setattr(a, k, v)
        names, sizes = parse_mesh(a.mesh)
    if a.hardware == "calibrate":
        a.hardware = _calibrated_here(a.config, job.world_size)
        job.config.auto_parallel.hardware = a.hardware
    from titan_autopar.cost.hardware import get_hardware

    check_profile_given(a.hardware, given_as)  # a bad profile, named where it was given
    get_hardware(a.hardware)  # an unknown preset, before the model is built
    t0 = time.perf_counter()
    say = lambda s: print(f"[{time.perf_counter() - t0:6.1f}s] {s}", flush=True)  # noqa: E731
    if search:
        return _search(a, job, say)
    from titan_autopar import plan_with_options
    from titan_autopar.fake_mesh import fake_mesh
    from titan_autopar.titan.models import build_model

    say(f"building {a.model} {a.flavor} on the meta device")
    model, _ = build_model(a.model, a.flavor, a.seq_len)
    from titan_autopar.titan.manual_marks import mark_job_regions, mark_mesh_regions

    if job is not None:
        marked = mark_job_regions(model, job.expert_parallel, job.manual_modules, job.manual_style)
        style = job.manual_style if job.manual_modules else "torchtitan_ep"
    else:  # an ep dim runs the MoE blocks expert-parallel, as a job with that degree does
        marked, style = mark_mesh_regions(model, names, sizes), "torchtitan_ep"
    if marked:
        say(f"manual regions ({style}): {', '.join(marked[:4])}"
            f"{' ...' if len(marked) > 4 else ''}")
    options = job.options(model) if job is not None else _flag_options(a, names, sizes)
    mesh = fake_mesh(names, sizes)
    say(f"planning a global batch of {options.inputs[0][0][0]} x {a.seq_len} tokens on "
        f"{'x'.join(map(str, sizes))} simulated {a.hardware} ranks")
    plan = plan_with_options(model, mesh, options, progress=say)
    plan.save(a.out, timings=a.timings)
    say(f"wrote {a.out}")
    if a.explain:
        print(plan.explain())
    return 0


def _flag_options(a, names, sizes):
    """`titan-autopar plan` without a job: the PlanOptions its flags give (nothing pinned on
    the way out, no training loop priced); a param_dtype of float32 prices tensors at their
    real sizes, as a job computing in fp32 is priced."""
    import torch

    from titan_autopar.plan_options import PlanOptions, token_inputs
    from titan_autopar.titan.models import global_batch

    mixed = a.param_dtype not in (None, "float32")
    return PlanOptions(
        mesh_names=names, mesh_sizes=sizes,
        inputs=token_inputs(global_batch(a.local_batch_size, names, sizes), a.seq_len),
        hardware=a.hardware, memory_budget_gib=a.memory_budget_gib, solver=a.solver,
        time_limit_s=a.time_limit_s, param_dtype=getattr(torch, a.param_dtype) if mixed else None,
        exact_floats=a.param_dtype == "float32", activation_checkpointing=a.activation_checkpointing,
        cp_attention=a.cp_attention or "cheapest")


def _search(a, job, say) -> int:
    """`plan --config X --search`: rank the job's degrees, write the winner's plan, its
    [parallelism] block and the table beside --out."""
    from titan_autopar.fake_mesh import fake_mesh
    from titan_autopar.titan.degree_search import search_degrees, table
    from titan_autopar.titan.search_outputs import write_search_outputs

    res = search_degrees(job, make_mesh=fake_mesh, top=a.top or 2, say=say)
    text = table(res, a.hardware)
    print(text)
    out, block, md = write_search_outputs(a.out, res.plans[res.winner.degrees], a.config,
                                          res.winner.degrees, text, timings=a.timings)
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
    from titan_autopar.files import check_out_file
    from titan_autopar.plan_picture import draw, is_plan_picture

    out = Path(a.out)
    if out.suffix.lower() != ".png":
        raise ValueError(f"--out {a.out}: give a .png file name, such as plan.png")
    check_out_file(out, label=f"--out {a.out}", what="a picture `titan-autopar show` drew",
                   ours=is_plan_picture, force=a.force, example="plan.png")
    print(f"wrote {draw(Plan.load(a.plan), out)}")
    return 0


def cmd_ab(a) -> int:
    from titan_autopar.titan.ab import run_ab, table

    res = run_ab(a.config, nproc=a.nproc, steps=a.steps, out_dir=a.out, twin=a.twin,
                 device=a.device, measure_now=not a.cached_profile, rounds=a.rounds,
                 force=a.force)
    print(table(res))
    out = a.out or f"out/ab/{Path(a.config).stem}"
    print(f"[ab] wrote {out}/ab.json and {out}/ab.png")
    return 0


def cmd_calibrate(a) -> int:
    import subprocess

    from titan_autopar.cost.profile import is_profile_file
    from titan_autopar.files import check_out_file
    from titan_autopar.titan.launch import calibrate_command

    out = check_out_file(a.out, label=f"--out {a.out}", what="a hardware profile",
                         ours=is_profile_file, force=a.force, example="profile.json")
    check_writable(out)  # before measuring, not after
    if a.mesh:
        sizes = [whole_size(x, f"--mesh {a.mesh}: each size") for x in a.mesh.split(",")]
        if math.prod(sizes) != a.nproc:
            raise ValueError(f"--mesh {a.mesh}: give sizes like 2,2 whose product is --nproc "
                             f"{a.nproc}")
    if a.device == "cuda":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have < a.nproc:
            raise ValueError(f"--device cuda --nproc {a.nproc}: torch sees {have} CUDA GPU(s) on "
                             "this machine; " + (f"give --nproc {have} or less, or " if have else "")
                             + "use --device cpu to measure CPU ranks")
    cmd, env = calibrate_command(a.nproc, out, a.device, a.mesh, force=a.force)
    print(f"[calibrate] measuring {a.nproc} {a.device} ranks (about 35 s on CPU)", flush=True)
    run = subprocess.run(cmd, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"calibration failed (exit {run.returncode}); its output is above")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, its refusals in one line (the flag, what is wrong) instead of the usage."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def main(argv=None) -> int:
    ap = _Parser(prog="titan-autopar", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan", help="plan a TorchTitan model on a simulated cluster")
    p.add_argument("--config", default=None, help="a TorchTitan TOML: plan that job (its model, "
                   "flavor, seq_len, local_batch_size, degrees, hardware, budget, solver, "
                   "checkpointing, precision); every other flag given overrides the job's value")
    p.add_argument("--model", default=None, help="a TorchTitan model (default llama3)")
    p.add_argument("--flavor", default=None, help="its flavor (default 8B)")
    p.add_argument("--mesh", default=None, help="name=size,... outermost first (default "
                   "dp_shard=8,tp=8)")
    p.add_argument("--hardware", default=None, help="a preset (h100, h200, a100, b200, cpu) or "
                   "a profile file from `titan-autopar calibrate` (default h100)")
    p.add_argument("--seq-len", type=_positive(int, MAX_SEQ_LEN), default=None,
                   help="tokens per sequence (default 8192)")
    p.add_argument("--local-batch-size", type=_positive(int, MAX_LOCAL_BATCH), default=None,
                   help="sequences per data-parallel rank (default 1)")
    p.add_argument("--memory-budget-gib", type=_positive(float, MAX_MEMORY_BUDGET_GIB), default=None,
                   help="memory per device (default: the hardware's)")
    p.add_argument("--solver", default=None, choices=["highs", "cbc", "joint"],
                   help="highs (default): HiGHS in this process; cbc: CBC in a subprocess; "
                   "joint: one exact program over every mesh dim, a check on the default "
                   "descent for small problems only")
    p.add_argument("--activation-checkpointing", default=None,
                   choices=["none", "selective", "full"],
                   help="recompute block activations in backward (TorchTitan's AC modes; default "
                   "none)")
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
    p.add_argument("--top", type=_positive(int), default=None,
                   help="with --search: how many of the best-screened degrees to plan in full "
                   "(default 2)")
    p.add_argument("--out", default="plan.json")
    p.add_argument("--force", action="store_true",
                   help="replace --out (and with --search the block and table beside it) even "
                   "if it exists and is not what this command writes")
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
    p.add_argument("--force", action="store_true",
                   help="replace --out even if it exists and is not a picture this command drew")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("ab", help="train a TorchTitan config under auto and with its expert "
                       "twin from one seed checkpoint (CPU ranks or GPUs), and compare")
    p.add_argument("--config", required=True, help="a TorchTitan TOML with the auto switch")
    p.add_argument("--twin", default=None, help="the expert-recipe config (default: the same "
                   "config with auto = false)")
    p.add_argument("--nproc", type=_positive(int), default=4)
    p.add_argument("--steps", type=_positive(int), default=20)
    p.add_argument("--out", default=None, help="output folder (default out/ab/<config name>); "
                   "an earlier A/B's results there are cleared")
    p.add_argument("--force", action="store_true", help="clear --out even if it holds files an "
                   "A/B did not write")
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
    p.add_argument("--force", action="store_true",
                   help="replace --out even if it exists and is not a hardware profile")
    p.set_defaults(fn=cmd_calibrate)
    a = ap.parse_args(argv)
    try:
        return a.fn(a)
    except BrokenPipeError:  # the reader stopped early (`| head`): not an error of the command
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second one at exit
        return 0
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
