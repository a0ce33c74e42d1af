"""`titan-autopar plan --config X.toml --search`: the parallelism degrees chosen too.

Owns `search_degrees`: for a TorchTitan job's rank count, GPUs per node and memory, it takes the
factorizations `solve/search.py` keeps, then

  1. screens each on the simulated mesh: the recipe TorchTitan would run on those degrees
     (FSDP/HSDP, with TP where tp > 1) priced by one round of descent, after the memory floor
     with activations (from the traced graph) has set aside the meshes that cannot hold the
     model; the graph is traced once per global batch shape and reused across meshes;
  2. plans the `top` best-screened meshes and the job's own degrees in full (auto, with every
     recipe priced beside it);
  cp > 1 only where no mesh with cp = 1 passes the screen, or where the job itself has cp > 1
     (`solve/search.py`): a second round of candidates, screened the same way;
  3. ranks by predicted tokens/s per GPU -- the local batch stays the job's, so the global batch
     grows with the data-parallel degrees -- and names the winner with its [parallelism] block.

Every figure is predicted by the cost model for the job's hardware; none is measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from titan_autopar.solve.search import Candidate, Degrees, ModelShape, candidate_degrees, rank_rows
from titan_autopar.titan.search_outputs import TABLE_END, TABLE_HEAD

GiB = 1024 ** 3
KEY = "tokens_per_gpu_s"


@dataclass
class SearchResult:
    rows: list[Candidate]
    winner: Candidate
    job_degrees: Degrees
    seconds: float
    plans: dict  # Degrees -> Plan, for the fully planned ones


def model_shape(model: torch.nn.Module, args, param_bytes: int = 16) -> ModelShape:
    moe = getattr(args, "moe_args", None)
    has_moe = any(type(m).__name__ == "MoE" for m in model.modules())
    return ModelShape(params=sum(p.numel() for p in model.parameters()),
                      n_heads=args.n_heads, n_kv_heads=getattr(args, "n_kv_heads", None) or args.n_heads,
                      experts=int(getattr(moe, "num_experts", 0) or 0) if has_moe else 0,
                      state_bytes_per_param=param_bytes)


def search_degrees(job, *, make_mesh: Callable, top: int = 2,
                   say: Callable[[str], None] = print) -> SearchResult:
    """Search the degrees of `job` (a `titan/job_file.PlanningJob`), each candidate planned
    with the job's own options (`PlanningJob.options`) on its mesh."""
    from titan_autopar import plan_with_options
    from titan_autopar.cost.hardware import get_hardware
    from titan_autopar.solve.errors import MemoryBudgetError
    from titan_autopar.titan.job_file import planner_mesh
    from titan_autopar.titan.manual_marks import mark_job_regions
    from titan_autopar.titan.models import build_model

    t0 = time.perf_counter()
    hw = get_hardware(job.hardware)
    budget_gib = job.memory_budget_gib or hw.hbm_bytes / GiB
    models: dict[int, torch.nn.Module] = {}

    def model_for(ep: int):
        if ep not in models:  # manual regions (ep > 1) are marked on the model itself
            m, args = build_model(job.model, job.flavor, job.seq_len)
            mark_job_regions(m, ep, job.manual_modules, job.manual_style)
            models[ep] = (m, args)
        return models[ep]

    model, args = model_for(1)
    shape = model_shape(model, args)
    cands = candidate_degrees(job.world_size, hw.gpus_per_node, shape, budget_gib)
    job_deg = Degrees(*_job_degrees(job))
    regions_aside = _keep_regions_runnable(cands, job)
    kept = [c for c in cands if not c.reason]
    say(f"[search] {job.world_size} ranks ({hw.gpus_per_node} per node), budget {budget_gib:.3g} "
        f"GiB: {len(cands)} factorizations, {len(kept)} left after the divisibility, node and "
        "parameter-state bounds" + (f" and the ep degrees the job's manual regions run with "
                                    f"({regions_aside} set aside)" if regions_aside else ""))
    if not kept:
        raise ValueError(f"no degrees for {job.world_size} ranks fit: "
                         + "; ".join(f"{c.degrees.label}: {c.reason}" for c in cands[:4]))
    cache: dict = {}
    quiet = lambda s: None  # noqa: E731

    def plan(d: Degrees, effort: str):
        m, _ = model_for(d.ep)
        names, sizes = planner_mesh(d.dp_replicate, d.dp_shard, d.tp, d.ep, d.cp)
        options = job.options(m, names, sizes).replace(effort=effort)
        return plan_with_options(m, make_mesh(names, sizes), options, progress=quiet,
                                 trace_cache=cache)

    tokens_per_gpu = job.local_batch_size * job.seq_len  # per data-parallel rank and step

    def per_gpu(d: Degrees, step_s: float) -> float:  # tp and cp ranks share their tokens
        return tokens_per_gpu / (d.tp * d.cp) / step_s

    def screen(batch: list[Candidate]) -> None:
        for i, c in enumerate(batch, 1):
            t = time.perf_counter()
            try:
                p = plan(c.degrees, "screen")
            except MemoryBudgetError as e:
                c.reason = (f"memory floor {e.floor / GiB:.3g} GiB per rank is above the budget"
                            if e.floor > e.budget else
                            f"its recipe needs {e.found / GiB:.3g} GiB per rank, above the budget")
                say(f"[search] screen {i}/{len(batch)} {c.degrees.label}: set aside ({c.reason})")
                continue
            step = p.data["predicted"]["step_time_s"]
            c.results.update(screen_step_s=step, peak_gib=p.data["predicted"]["peak_memory_gib"],
                             screen_recipe=p.data["solver"]["best_start"].removeprefix("recipe "),
                             **{KEY: per_gpu(c.degrees, step)})
            say(f"[search] screen {i}/{len(batch)} {c.degrees.label}: {c.results['screen_recipe']} "
                f"{step * 1e3:.1f} ms, "
                f"{num(c.results[KEY])} tokens/s/GPU ({time.perf_counter() - t:.1f}s)")

    screen(kept)
    # split the sequences too where nothing fits without, or where the job itself does
    if (not any(c.results for c in kept) or job_deg.cp > 1) and not shape.experts:
        more = candidate_degrees(job.world_size, hw.gpus_per_node, shape, budget_gib, cp=True,
                                 seq_len=job.seq_len)
        more_kept = [c for c in more if not c.reason]
        why = "the job uses cp" if job_deg.cp > 1 else "nothing fits with cp = 1"
        say(f"[search] {why}: {len(more)} factorizations with cp > 1, "
            f"{len(more_kept)} left after the bounds")
        cands += more
        kept += more_kept
        screen(more_kept)
    screened = rank_rows([c for c in kept if c.results], KEY)
    if not screened:
        raise ValueError("no degrees for this job fit its memory budget; the floors are: "
                         + "; ".join(f"{c.degrees.label}: {c.reason}" for c in kept[:4]))
    full = screened[:top]
    own = next((c for c in kept if c.degrees == job_deg), None)
    if own is not None and own.results and own not in full:
        full.append(own)
    plans = {}
    for c in full:
        t = time.perf_counter()
        p = plan(c.degrees, "full")
        plans[c.degrees] = p
        pred = p.data["predicted"]
        recipe = _best_recipe(p.data["recipes"], budget_gib, c.degrees)
        rstep = p.data["recipes"][recipe]["step_time_s"]
        c.results.update(step_s=pred["step_time_s"], peak_gib=pred["peak_memory_gib"],
                         recipe=recipe, recipe_step_s=rstep,
                         recipe_tokens_per_gpu_s=per_gpu(c.degrees, rstep),
                         **{KEY: per_gpu(c.degrees, pred["step_time_s"])})
        say(f"[search] planned {c.degrees.label}: auto {pred['step_time_s'] * 1e3:.1f} ms, "
            f"{recipe} {rstep * 1e3:.1f} ms ({time.perf_counter() - t:.1f}s)")
    winner = max(full, key=lambda c: (round(c.results[KEY], 6), -c.degrees.dp_replicate,
                                      -c.degrees.tp))
    rows = rank_rows(cands, KEY)
    return SearchResult(rows, winner, job_deg, time.perf_counter() - t0, plans)


def _keep_regions_runnable(cands: list[Candidate], job) -> int:
    """Set aside the candidates whose ep degree the job's manual regions cannot run with
    (`titan/manual_marks.ep_rule`): torchtitan_ep regions need ep > 1, data_parallel ones run
    no expert parallelism. Returns how many were set aside."""
    from titan_autopar.titan.manual_marks import ep_rule

    rule = ep_rule(job.manual_modules, job.manual_style)
    aside = 0
    for c in cands:
        if c.reason or rule == "any" or (c.degrees.ep > 1) == (rule == "ep>1"):
            continue
        c.reason = ("the job's manual_modules run torchtitan_ep, which needs ep > 1"
                    if rule == "ep>1" else
                    "manual_style data_parallel runs no expert parallelism: ep = 1 only")
        aside += 1
    return aside


def _best_recipe(recipes: dict, budget_gib: float, d: Degrees) -> str:
    """The recipe to set beside a plan: the fastest one that fits the budget (TorchTitan's own
    for these degrees when none does)."""
    fits = [r for r, v in recipes.items() if v["peak_memory_gib"] <= budget_gib * (1 + 1e-9)]
    if not fits:
        return "fsdp_tp" if d.tp > 1 else "fsdp"
    return min(fits, key=lambda r: (recipes[r]["step_time_s"], r))


def num(x: float) -> str:
    """A throughput to read: whole numbers from 100 up, three significant digits below."""
    return f"{x:.0f}" if x >= 100 else f"{x:.3g}"


def _job_degrees(job) -> tuple[int, int, int, int, int]:
    sizes = dict(zip(job.mesh_names, job.mesh_sizes))
    ep = sizes.get("ep", 1)
    return (sizes.get("dp_replicate", 1), sizes.get("dp_shard", 1) * ep, sizes.get("tp", 1), ep,
            sizes.get("cp", 1))


def table(res: SearchResult, hardware: str) -> str:
    """The ranked table: planned rows first, then screened, then those set aside (with why)."""
    lines = [TABLE_HEAD]
    for c in res.rows:
        r = c.results
        mark = " **(winner)**" if c is res.winner else ""
        mark += " (job's own)" if c.degrees == res.job_degrees else ""
        if "step_s" in r:
            lines.append(f"| {c.degrees.label}{mark} | {r['step_s'] * 1e3:.1f} | "
                         f"{r['recipe']} {r['recipe_step_s'] * 1e3:.1f} | {num(r[KEY])} | "
                         f"{r['peak_gib']:.1f} | planned |")
        elif r:
            lines.append(f"| {c.degrees.label}{mark} | | {r['screen_recipe']} {r['screen_step_s'] * 1e3:.1f} | "
                         f"{num(r[KEY])} | {r['peak_gib']:.1f} | screened |")
        else:
            lines.append(f"| {c.degrees.label}{mark} | | | | | set aside: {c.reason} |")
    w = res.winner.results
    why = (f"The winner, {res.winner.degrees.label}, is predicted at {num(w[KEY])} tokens/s per "
           f"GPU on {hardware}")
    own = next((c for c in res.rows if c.degrees == res.job_degrees), None)
    if own is not None and "step_s" in own.results and own is not res.winner:
        o = own.results
        why += (f", {w[KEY] / o[KEY]:.3f}x the job's own degrees ({res.job_degrees.label}: "
                f"auto {num(o[KEY])}, its {o['recipe']} recipe {num(o['recipe_tokens_per_gpu_s'])})")
    elif own is res.winner:
        why += (f": the job's own degrees; its {w['recipe']} recipe is predicted at "
                f"{num(w['recipe_tokens_per_gpu_s'])}")
    return "\n".join(lines) + "\n\n" + why + f". Searched in {res.seconds:.0f} s. {TABLE_END}"
