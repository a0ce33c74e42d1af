"""TorchTitan's parallelize step, planned: what `[parallelism] auto = true` runs.

`register_auto_train_specs()` re-registers the train specs of llama3, llama4, deepseek_v3 and
qwen3 under their own names (TorchTitan consults registered specs first) with one change: the
parallelize function. With `auto = false` it calls the model's hand-written recipe, untouched.
With `auto = true`, `plan_and_apply`:

1. builds the mesh from the config's degrees (dp_replicate, dp_shard, tp; dims of degree 1 are
   left out),
2. plans the model for TorchTitan's global batch (local batch x data-parallel degrees, the
   configured sequence length) with the batch split over the data-parallel dims on the way in
   and on the way out (the logits meet each rank's own labels) -- rank 0 solves and sends the
   plan to the others, so every rank runs the same plan -- or loads `[auto_parallel] plan_file`,
3. applies it (`apply_plan`) and returns the model, still on meta; TorchTitan then materialises
   it and calls `init_weights`, which gives the single-device weights for the job's seed.

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

MODELS = ("llama3", "llama4", "deepseek_v3", "qwen3")
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
        if getattr(job_config.parallelism, "auto", False):
            return plan_and_apply(model, parallel_dims, job_config)
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
    if pd.cp > 1:
        raise AutoConfigError(
            f"context_parallel_degree = {pd.cp} with auto = true: the planner has no ring "
            "attention yet, so cp cannot be planned. Set context_parallel_degree = 1 (and give "
            "the ranks to data_parallel_shard_degree), or use auto = false for TorchTitan's CP.")
    dims = [(n, s) for n, s in (("dp_replicate", pd.dp_replicate), ("dp_shard", pd.dp_shard),
                                ("tp", pd.tp)) if s > 1]
    if not dims:
        dims = [("dp_shard", 1)]
    names, sizes = zip(*dims)
    return tuple(names), tuple(sizes)


def _mesh(parallel_dims, names, sizes):
    from torch.distributed.device_mesh import init_device_mesh
    from torchtitan.tools.utils import device_type

    if parallel_dims.pp > 1:
        full = init_device_mesh(device_type, (parallel_dims.pp, *sizes),
                                mesh_dim_names=("pp", *names))
        return full[names]
    return init_device_mesh(device_type, sizes, mesh_dim_names=names)


def _resolve(path: str, job_config) -> Path:
    p = Path(path)
    return p if p.is_absolute() else Path(job_config.job.dump_folder) / p


def _plan(model, mesh, tokens, names, job_config):
    from titan_autopar import Plan, plan_model
    from titan_autopar.plan import StalePlanError
    from titan_autopar.solve.recipes import default_input_placements

    ap = job_config.auto_parallel
    log = _log()
    if ap.plan_file:
        path = Path(ap.plan_file)
        if not path.exists():
            raise AutoConfigError(f"[auto_parallel] plan_file = {ap.plan_file!r} does not exist: "
                                  "give a plan saved by `save_plan` or `titan-autopar plan`, or "
                                  "remove plan_file to plan now")
        log.info(f"[titan_autopar] replaying the plan in {path}")
        plan = Plan.load(path)
        planned, now = plan.data["fingerprint"]["inputs"], [[list(tokens.shape), str(tokens.dtype)]]
        if planned != now:
            raise StalePlanError(
                f"the plan in {path} was made for something else and cannot be replayed: inputs: "
                f"plan has {planned}, now {now} (local_batch_size x data-parallel degrees, "
                "seq_len). Plan again (remove plan_file) or restore the batch and sequence length.")
        return plan
    plan_json = [None]
    if not dist.is_initialized() or dist.get_rank() == 0:
        log.info(f"[titan_autopar] planning {type(model).__name__} on mesh "
                 f"{dict(zip(names, mesh.shape))} for a {ap.hardware} cluster")
        plan = plan_model(
            model, mesh, (tokens,),
            output_placements=[default_input_placements(names, torch.empty(1, 1, 1))],
            hardware=ap.hardware, memory_budget_gib=ap.memory_budget_gib or None,
            solver=ap.solver, time_limit_s=ap.time_limit_s or None,
            progress=lambda s: log.info(f"[titan_autopar] {s}"),
        )
        plan_json[0] = plan.to_json()
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(plan_json, src=0)  # every rank runs rank 0's plan
    return Plan(json.loads(plan_json[0]))


def plan_and_apply(model, parallel_dims, job_config):
    """`auto = true`: plan (or replay) and apply; returns the model, parameters on meta."""
    from titan_autopar import apply_plan
    from titan_autopar.cost.hardware import get_hardware

    log = _log()
    get_hardware(job_config.auto_parallel.hardware)  # an unknown preset fails here, clearly
    names, sizes = mesh_dims(parallel_dims)
    if parallel_dims.ep > 1:
        log.info(f"[titan_autopar] expert_parallel_degree = {parallel_dims.ep} is not planned yet: "
                 "MoE experts run data-parallel under auto")
    if job_config.activation_checkpoint.mode != "none":
        log.info("[titan_autopar] activation checkpointing is not applied under auto yet "
                 f"(mode {job_config.activation_checkpoint.mode!r} ignored)")
    mesh = _mesh(parallel_dims, names, sizes)
    dp = parallel_dims.dp_replicate * parallel_dims.dp_shard
    tokens = torch.empty(job_config.training.local_batch_size * dp, job_config.training.seq_len,
                         dtype=torch.long, device="meta")
    plan = _plan(model, mesh, tokens, names, job_config)
    if job_config.auto_parallel.save_plan and (not dist.is_initialized() or dist.get_rank() == 0):
        path = plan.save(_resolve(job_config.auto_parallel.save_plan, job_config))
        log.info(f"[titan_autopar] plan saved to {path}")
    for line in plan.explain().splitlines()[:6]:
        log.info(f"[titan_autopar] {line}")
    model = apply_plan(model, plan, mesh, progress=lambda s: log.info(f"[titan_autopar] {s}"))
    return model
