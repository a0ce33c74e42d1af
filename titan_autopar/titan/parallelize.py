"""TorchTitan's parallelize step, planned: what `[parallelism] auto = true` runs.

`register_auto_train_specs()` re-registers the train specs of llama3, llama4, deepseek_v3 and
qwen3 under their own names (TorchTitan consults registered specs first) with one change: the
parallelize function. With `auto = false` it calls the model's hand-written recipe, untouched.
With `auto = true`, `plan_and_apply`:

1. builds the mesh from the config's degrees (dp_replicate, dp_shard, ep carved out of dp_shard,
   tp; dims of degree 1 are left out) and marks the manual regions (`titan/manual_marks.py`:
   with expert_parallel_degree > 1, every MoE block runs TorchTitan's own ExpertParallel),
2. plans the model for TorchTitan's global batch (local batch x data-parallel degrees, the
   configured sequence length) with the batch split over the data-parallel dims on the way in
   and on the way out (the logits meet each rank's own labels) -- the mesh's first rank solves
   and sends the plan to the others, so every rank runs the same plan -- or loads
   `[auto_parallel] plan_file`,
3. applies it (`apply_plan`) and returns the model, still on meta; TorchTitan then materialises
   it and calls `init_weights`, which gives the single-device weights for the job's seed. A plan
   predicted less than `MIN_GAIN` faster than FSDP's (`recipe_schedule`) runs as the model's recipe
   instead, under TorchTitan's FSDP2 (`[auto_parallel] recipe_runtime = false`: the plan's
   program).

With pp > 1 TorchTitan splits the model into stages and calls the parallelize function once per
stage it holds: each stage is planned on its own slice of the mesh for one microbatch (a later
stage's input is the hidden state, whose gradient the program returns), by that slice's first
rank, and saved or replayed as its own file ("plan.pp1.json").

TorchTitan's loss is each rank's summed loss over the global token count and the program's
gradients are sums over ranks, so the gradients are those of the global mean, as with FSDP.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import torch
import torch.distributed as dist

from titan_autopar.titan.job_file import planner_mesh
from titan_autopar.titan.job_options import compute_dtype, job_plan_options
from titan_autopar.titan.manual_marks import check_job_regions, mark_job_regions

MODELS = ("llama3", "llama4", "deepseek_v3", "qwen3")
# what each rank logs where the plan runs as the recipe (benchmarks/fidelity.py looks for it)
RUNS_AS_RECIPE = "running it as TorchTitan's recipe"
_MARK = "_titan_autopar_auto"


class AutoConfigError(ValueError):
    """A config that `auto = true` cannot run, with what to change."""


def register_auto_train_specs() -> list[str]:
    """Wrap and register the specs of the models in MODELS that import; returns their names."""
    from torchtitan.protocols.train_spec import _extra_train_specs, register_train_spec

    done = []
    for name in MODELS:
        existing = _extra_train_specs.get(name)
        if existing is not None:
            if getattr(existing.parallelize_fn, _MARK, False):
                done.append(name)
            continue  # someone else's spec under this name: leave it alone
        try:
            spec = importlib.import_module(f"torchtitan.models.{name}").get_train_spec()
        except Exception:  # a model whose package needs what is not installed
            continue
        register_train_spec(name, dataclasses.replace(
            spec, parallelize_fn=_switch(spec.parallelize_fn)))
        done.append(name)
    return done


def _switch(recipe):
    def parallelize(model, parallel_dims, job_config):
        from titan_autopar.titan.config_check import check_job_config, check_section
        from titan_autopar.titan.config_fields import Parallelism

        auto = getattr(job_config.parallelism, "auto", False)
        check_section("parallelism", {"auto": auto}, Parallelism, job_config.job.config_file
                      or "the config")
        if auto:
            check_job_config(job_config, job_config.job.config_file or "the config")
            return plan_and_apply(model, parallel_dims, job_config, recipe)
        return recipe(model, parallel_dims, job_config)

    setattr(parallelize, _MARK, True)
    parallelize.recipe = recipe
    return parallelize


def _log():
    from torchtitan.tools.logging import logger

    return logger


def mesh_dims(parallel_dims) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The planner's mesh dims from the config's degrees (degree-1 dims left out)."""
    pd = parallel_dims
    return planner_mesh(pd.dp_replicate, pd.dp_shard, pd.tp, pd.ep, pd.cp)


def contiguous_sequence_shards(parallel_dims, job_config, log) -> None:
    """With cp > 1, TorchTitan's trainer cuts each sequence into cp shards before the forward
    (`prepare_context_parallel_input`), by default head-tail for load balance. The plan's
    sequence shards (and its ring attention) are contiguous chunks, so under auto the trainer is
    told to cut contiguous ones (load balancer None); the model checks the positions it is
    given each step."""
    par = job_config.parallelism
    if parallel_dims.cp > 1 and par.context_parallel_load_balancer is not None:
        log.info(f"[titan_autopar] cp = {parallel_dims.cp}: sequence shards are contiguous under "
                 f"auto (context_parallel_load_balancer {par.context_parallel_load_balancer!r} -> "
                 "None); the plan prices the ring attention's imbalance")
        par.context_parallel_load_balancer = None


_MESHES: dict[tuple, object] = {}


def _mesh(parallel_dims, names, sizes):
    """This rank's planning mesh (built once per process: pipeline stages share it). With
    pp > 1 it is the slice of a ("pp", *names) mesh that holds this rank's stage -- pp
    outermost, as in TorchTitan's own mesh, so the stage's ranks are the same in both."""
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.tools.utils import device_type

    key = (parallel_dims.pp, names, sizes)
    if key not in _MESHES:
        if parallel_dims.pp > 1:
            full = init_device_mesh(device_type, (parallel_dims.pp, *sizes),
                                    mesh_dim_names=("pp", *names))
            _MESHES[key] = full[names]
        else:
            _MESHES[key] = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    return _MESHES[key]


def stage_inputs(model, parallel_dims, job_config) -> torch.Tensor:
    """What the (stage) model is called with, at the planned global shape, on meta.

    Without pp: the step's tokens, local_batch_size x data-parallel degrees by seq_len. With
    pp each call is one microbatch (pipeline_parallel_microbatch_size per rank), and a stage
    without the token embedding (every stage after the first) takes the previous stage's
    hidden states, (batch, seq_len, dim), in the compute dtype."""
    t = job_config.training
    dp = parallel_dims.dp_replicate * parallel_dims.dp_shard
    per_rank = (job_config.parallelism.pipeline_parallel_microbatch_size
                if parallel_dims.pp > 1 else t.local_batch_size)
    if parallel_dims.pp > 1 and getattr(model, "tok_embeddings", True) is None:
        dtype = compute_dtype(model, job_config) or next(model.parameters()).dtype
        return torch.empty(per_rank * dp, t.seq_len, model.model_args.dim, dtype=dtype,
                           device="meta")
    return torch.empty(per_rank * dp, t.seq_len, dtype=torch.long, device="meta")


def stage_tag(parallel_dims, job_config) -> str:
    """Empty without pp; else which model part this call parallelises: "pp1" for pipeline rank 1's
    stage, "pp1-2" for its third model part under a looped schedule (TorchTitan parallelises a
    rank's parts in order, one call each)."""
    if parallel_dims.pp <= 1:
        return ""
    k = getattr(job_config, "_titan_autopar_parts", 0)
    job_config._titan_autopar_parts = k + 1
    pp_rank = dist.get_rank() // (dist.get_world_size() // parallel_dims.pp)
    return f"pp{pp_rank}" + (f"-{k}" if k else "")


def with_tag(path: str, tag: str) -> str:
    """Each pipeline stage has its own plan: "plan.json" -> "plan.pp1.json"."""
    if not tag:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.{tag}{p.suffix}"))


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _first_rank(mesh) -> int:
    """The global rank that plans (and saves the plan of) the stage on `mesh`."""
    return int(mesh.mesh.flatten()[0])


def _resolve(path: str, job_config) -> Path:
    p = Path(path)
    return p if p.is_absolute() else Path(job_config.job.dump_folder) / p


def replay_differences(plan, model, tokens, names, sizes, job_config, *,
                       settings: bool = False) -> list[str]:
    """What keeps `plan` from running this job (model, inputs, mesh, mixed precision,
    activation checkpointing), each as "what: plan has X, the job Y"; with `settings`, also
    what the planner would now decide differently (hardware, memory budget, solver)."""
    from titan_autopar.cost.hardware import GiB, get_hardware
    from titan_autopar.plan import fingerprint

    ap = job_config.auto_parallel
    hw = get_hardware(ap.hardware)
    fp = fingerprint(model, (tokens,), names, sizes, hw)
    mine = plan.data["fingerprint"]
    keys = ("model", "parameters", "inputs", "mesh") + (("hardware",) if settings else ())
    out = [f"{k}: plan has {mine.get(k)!r}, the job {fp[k]!r}" for k in keys if mine.get(k) != fp[k]]
    want = compute_dtype(model, job_config)
    want = str(want).removeprefix("torch.") if want else None
    if plan.data.get("param_dtype") != want:
        planned = plan.data.get("param_dtype") or "the parameters' dtype"
        out.append(f"mixed precision: plan computes in {planned}, the job asks for "
                   f"mixed_precision_param = {job_config.training.mixed_precision_param!r}")
    ac = plan.data.get("activation_checkpointing", "none")
    if ac != job_config.activation_checkpoint.mode:
        out.append(f"activation checkpointing: plan has {ac!r}, the job "
                   f"{job_config.activation_checkpoint.mode!r}")
    if settings:
        from titan_autopar.plan import PLANNER_REVISION

        made = plan.data.get("planner_revision", 1)
        if made != PLANNER_REVISION:
            out.append(f"planner: plan made by revision {made}, this one is {PLANNER_REVISION}")
        budget = round((ap.memory_budget_gib * GiB if ap.memory_budget_gib else hw.hbm_bytes) / GiB, 6)
        if plan.data.get("memory_budget_gib") != budget:
            out.append(f"memory budget: plan has {plan.data.get('memory_budget_gib')} GiB, the job "
                       f"{budget} GiB")
        if plan.data.get("cp_attention", "cheapest") != ap.cp_attention:
            out.append(f"cp attention: plan has {plan.data.get('cp_attention', 'cheapest')!r}, "
                       f"the job {ap.cp_attention!r}")
        if plan.data.get("solver", {}).get("name") != ap.solver:
            out.append(f"solver: plan has {plan.data.get('solver', {}).get('name')!r}, the job "
                       f"{ap.solver!r}")
    return out


def _replayed(path: Path, model, tokens, names, sizes, job_config):
    """The plan file `[auto_parallel] plan_file` names, refused with what differs."""
    from titan_autopar import Plan
    from titan_autopar.plan import PlanError, StalePlanError

    try:
        plan = Plan.load(path)
    except PlanError as e:
        raise PlanError(f"[auto_parallel] plan_file = {job_config.auto_parallel.plan_file!r}: "
                        f"{e}") from None
    diffs = replay_differences(plan, model, tokens, names, sizes, job_config)
    if diffs:
        raise StalePlanError(
            f"the plan in {path} was made for something else and cannot be replayed: "
            + "; ".join(diffs) + ". Plan again (remove plan_file), or restore the job's settings "
            "(inputs are local_batch_size x data-parallel degrees by seq_len; with pp, the "
            "microbatch).")
    return plan


def _saved(path: Path, model, tokens, names, sizes, job_config, log):
    """The plan an earlier run of this job saved at `path`, if it was made for exactly this job
    (a restart, e.g. to resume from a checkpoint, replays it instead of solving again)."""
    from titan_autopar import Plan
    from titan_autopar.plan import PlanError

    if not path.is_file():
        return None
    try:
        plan = Plan.load(path)
    except PlanError as e:
        log.info(f"[titan_autopar] not reusing {path}: {e}")
        return None
    diffs = replay_differences(plan, model, tokens, names, sizes, job_config, settings=True)
    if diffs:
        log.info(f"[titan_autopar] the plan saved in {path} was made for another job or planner ("
                 + "; ".join(diffs) + "): planning again, it will be overwritten")
        return None
    log.info(f"[titan_autopar] reusing the plan saved in {path} by an earlier run of this job "
             "(same model, inputs, mesh and settings); delete it to plan again")
    return plan


def check_plan_paths(job_config, tag: str, saves: bool) -> None:
    """Before anything is measured or planned: `plan_file` names a file, and, on the rank that
    saves the plan (`saves`), `save_plan` can be written and holds nothing but a plan
    (`files.check_out_file`; `save_plan_force` lets it replace another file)."""
    from titan_autopar.files import check_out_file
    from titan_autopar.plan import is_plan_file

    ap = job_config.auto_parallel
    if ap.plan_file:
        path = _resolve(with_tag(ap.plan_file, tag), job_config)
        if path.is_dir():
            raise AutoConfigError(
                f"[auto_parallel] plan_file = {ap.plan_file!r}: {path} is a folder, not a plan: "
                f"give the plan file in it (such as {path / 'plan.json'}), or remove plan_file "
                "to plan now")
        if not path.exists():
            raise AutoConfigError(
                f"[auto_parallel] plan_file = {ap.plan_file!r}: looked for {path}, which does not "
                "exist (a relative plan_file is under [job] dump_folder, as save_plan is). Give a "
                "plan saved by `save_plan` or `titan-autopar plan` (with pp > 1, one per stage: "
                "<name>.pp<rank>.json), or remove plan_file to plan now")
    if ap.save_plan and saves:
        path = _resolve(with_tag(ap.save_plan, tag), job_config)
        check_out_file(path, label=f"[auto_parallel] save_plan = {ap.save_plan!r} ({path})",
                       what="a plan", ours=is_plan_file, force=ap.save_plan_force,
                       force_how="set [auto_parallel] save_plan_force = true")


def _plan(model, mesh, tokens, names, job_config, tag):
    from titan_autopar import Plan, plan_with_options

    ap = job_config.auto_parallel
    log = _log()
    what = f"stage {tag} of " if tag else ""
    sizes = tuple(mesh.shape)
    if ap.plan_file:
        path = _resolve(with_tag(ap.plan_file, tag), job_config)
        log.info(f"[titan_autopar] replaying the plan in {path}")
        return _replayed(path, model, tokens, names, sizes, job_config)
    # the first rank of each stage's mesh plans that stage; every rank takes its stage's plan
    first = _first_rank(mesh)
    plan_json = None
    if _rank() == first:
        plan = None
        if ap.save_plan:
            plan = _saved(_resolve(with_tag(ap.save_plan, tag), job_config), model, tokens, names,
                          sizes, job_config, log)
        if plan is None:
            log.info(f"[titan_autopar] planning {what}{type(model).__name__} on mesh "
                     f"{dict(zip(names, mesh.shape))} for a {ap.hardware} cluster")
            options = job_plan_options(job_config, names, sizes, model,
                                       inputs=[(tuple(tokens.shape), tokens.dtype)])
            plan = plan_with_options(model, mesh, options,
                                     progress=lambda s: log.info(f"[titan_autopar] {s}"))
        plan_json = plan.to_json()
    if dist.is_initialized() and dist.get_world_size() > 1:
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, plan_json)
        plan_json = every[first]
    return Plan(json.loads(plan_json))


def plan_and_apply(model, parallel_dims, job_config, recipe=None):
    """`auto = true`: plan (or replay) and apply; returns the model, parameters on meta. A plan
    predicted less than `MIN_GAIN` faster than FSDP's runs as `recipe` (the model's own parallelize
    function), unless
    `[auto_parallel] recipe_runtime = false`."""
    from titan_autopar import apply_plan
    from titan_autopar.cost.hardware import get_hardware
    from titan_autopar.titan.job_hardware import resolve_hardware
    from titan_autopar.titan.predictions import write_predictions

    log = _log()
    ap = job_config.auto_parallel
    check_job_regions(parallel_dims.ep, ap.manual_modules, ap.manual_style,
                      job_config.job.config_file or "the config")
    names, sizes = mesh_dims(parallel_dims)
    mesh = _mesh(parallel_dims, names, sizes)
    tag = stage_tag(parallel_dims, job_config)
    check_plan_paths(job_config, tag, saves=_rank() == _first_rank(mesh))
    resolve_hardware(job_config, log)  # a profile of another machine, or "calibrate"
    get_hardware(job_config.auto_parallel.hardware)  # an unknown preset fails here, clearly
    contiguous_sequence_shards(parallel_dims, job_config, log)
    marked = mark_job_regions(model, parallel_dims.ep, ap.manual_modules, ap.manual_style)
    if marked:
        style = ap.manual_style if ap.manual_modules else "torchtitan_ep"
        more = " ..." if len(marked) > 4 else ""
        log.info(f"[titan_autopar] manual regions ({style}): {', '.join(marked[:4])}{more}")
    inputs = stage_inputs(model, parallel_dims, job_config)
    plan = _plan(model, mesh, inputs, names, job_config, tag)
    if job_config.auto_parallel.save_plan and _rank() == _first_rank(mesh):
        path = plan.save(_resolve(with_tag(job_config.auto_parallel.save_plan, tag), job_config))
        log.info(f"[titan_autopar] plan saved to {path}")
    if write_predictions(plan, parallel_dims, job_config, tag):
        log.info("[titan_autopar] predicted step time and peak memory written to TensorBoard")
    for line in plan.explain().splitlines()[:6]:
        log.info(f"[titan_autopar] {line}")
    if plan.recipe_schedule and ap.recipe_runtime and recipe is not None:
        log.info(f"[titan_autopar] the plan gains less than the prices resolve over the "
                 f"{plan.recipe_schedule} recipe: {RUNS_AS_RECIPE} (FSDP2's runtime); "
                 "[auto_parallel] recipe_runtime = false runs the plan's own program")
        return recipe(model, parallel_dims, job_config)
    model = apply_plan(model, plan, mesh, progress=lambda s: log.info(f"[titan_autopar] {s}"))
    comp = job_config.compile
    if comp.enable and "model" in comp.components:
        model.autopar.compile()
        log.info("[titan_autopar] [compile] the plan's forward and backward graphs go through "
                 "torch.compile (inductor); the first step compiles them")
    return model
