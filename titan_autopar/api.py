"""The public entry points: orchestration only.

`plan_with_options` plans for a `PlanOptions` (what every road to a plan calls); `plan_model` runs trace -> shared blocks -> options -> prices -> integer programs -> Plan, logging each
phase's time and size. `apply_plan` turns a Plan into a running module (trace -> per-rank
program -> forward/backward split -> DTensor parameters); `auto_parallelize` does both.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Placement

from titan_autopar import checks
from titan_autopar.apply.bucket import bucket_collectives
from titan_autopar.apply.dedupe import dedupe_state_values
from titan_autopar.apply.interpret import trace_local_joint
from titan_autopar.apply.module import parallelize_module, tied_names
from titan_autopar.apply.partition import split_joint
from titan_autopar.cost.hardware import GiB, get_hardware
from titan_autopar.cost.memory import Precision
from titan_autopar.graph.attention import flex_modules
from titan_autopar.graph.recompute import check_mode
from titan_autopar.graph.manual import resolve_all
from titan_autopar.graph.stamp import trace_step
from titan_autopar.limits import MAX_MEMORY_BUDGET_GIB
from titan_autopar.plan import Plan, build_plan, fingerprint
from titan_autopar.plan_check import check_against_graph, check_plan_data
from titan_autopar.plan_options import PlanOptions
from titan_autopar.solve.ilp import SolveLimits
from titan_autopar.solve.recipe_schedule import fsdp_schedule
from titan_autopar.solve.planner import Pins, Planner, PlannerSettings
from titan_autopar.solve.recipes import check_dim_names, default_input_placements

log = logging.getLogger("titan_autopar")


def _mesh_info(mesh: DeviceMesh) -> tuple[tuple[str, ...], tuple[int, ...]]:
    names = mesh.mesh_dim_names
    if not names:
        raise ValueError(
            "the mesh has no dim names: build it with init_device_mesh(..., mesh_dim_names=(...)) "
            "so that plans can say what each dim carries"
        )
    return tuple(names), tuple(mesh.shape)


def plan_model(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    sample_inputs: tuple[torch.Tensor, ...] | torch.Tensor,
    *,
    input_placements: list[tuple[Placement, ...]] | None = None,
    output_placements: list[tuple[Placement, ...]] | None = None,
    parameter_placements: dict[str, tuple[Placement, ...]] | str | None = None,
    hardware="h100",
    memory_budget_gib: float | None = None,
    solver: str = "highs",
    time_limit_s: float | None = None,
    precision: Precision | None = None,
    activation_checkpointing: str = "none",
    param_dtype: torch.dtype | None = None,
    progress=None,
    effort: str = "full",
    trace_cache: dict | None = None,
    cp_attention: str = "cheapest",
    loop_collectives=(),
) -> Plan:
    """Plan `model`'s training step on `mesh`: one placement per parameter and per graph node.

    `sample_inputs` are global-shaped; `input_placements` (default: batch over the data-parallel
    dims, sequence over cp) and `output_placements` (default: free) pin what enters and leaves.
    `parameter_placements` pins parameters: a dict name -> placements (parameters left out stay
    free), or a recipe name ("fsdp", "fsdp_tp") for that recipe's placements of every parameter.
    `activation_checkpointing` ("none", "selective", "full"; see `graph/recompute.py`) prices
    the recomputation of each block's activations, and the plan's program recomputes them.
    `param_dtype` (e.g. torch.bfloat16) computes with parameters cast to it, gradients and
    optimizer state staying in the parameters' dtype (mixed precision, as FSDP's param_dtype).
    `solver`: "highs" (default, HiGHS in this process) or "cbc" (CBC in a subprocess) solves the
    per-mesh-dim programs of the descent;
    "joint" plans by one exact program over every mesh dim at once, the check on the descent,
    for small problems only (`solve/joint.py`; a larger one is refused before any program).
    `progress` receives one line per phase (default: the "titan_autopar" logger).
    `effort="screen"` (the degree search's first pass) prices each recipe by one round of
    descent and returns the cheapest recipe as the plan, a few times faster than the full search;
    it refuses, before any program, a mesh whose memory floor is above the budget.
    `trace_cache` (a dict kept between calls) reuses the traced graph of a model planned again
    with the same input shapes, dtype and manual regions, e.g. on another mesh.
    `cp_attention` is what attention may do on a cp dim: "cheapest" (default: shard its batch,
    its heads or its sequence -- ring attention --, or replicate it, whichever is priced
    lowest) or "ring" (shard its sequence, as TorchTitan's CP recipe does).
    `loop_collectives` (`cost.loop.LoopCollective`s) are what the training loop communicates each
    step outside the model (TorchTitan's: `titan/loop_collectives.py`); they are priced into every
    prediction (`loop_s`), the same for every plan.
    """
    say = progress or log.info
    hw = get_hardware(hardware)
    checks.positive_number("memory_budget_gib", memory_budget_gib, most=MAX_MEMORY_BUDGET_GIB)
    checks.positive_number("time_limit_s", time_limit_s)
    check_mode(activation_checkpointing)
    if param_dtype is not None and not (isinstance(param_dtype, torch.dtype)
                                        and param_dtype.is_floating_point):
        raise ValueError(f"param_dtype must be a floating-point torch.dtype such as "
                         f"torch.bfloat16, got {param_dtype!r}")
    prec = precision or Precision()
    if param_dtype is not None:
        prec = dataclasses.replace(prec, exact_floats=True)
    if solver not in ("highs", "cbc", "joint"):
        raise ValueError(f"unknown solver {solver!r}: use 'highs' (default), 'cbc', or 'joint' "
                         "(an exact check for small problems)")
    if cp_attention not in ("cheapest", "ring"):
        raise ValueError(f"unknown cp_attention {cp_attention!r}: use 'cheapest' (default) or "
                         "'ring' (attention on a cp dim always sequence-sharded)")
    if effort not in ("full", "screen"):
        raise ValueError(f"unknown effort {effort!r}: use 'full' (default) or 'screen'")
    if effort == "screen" and solver == "joint":
        raise ValueError("effort='screen' prices recipes by the descent: use solver='highs' or "
                         "'cbc' (the joint check is for one small problem at a time)")
    if effort == "screen" and parameter_placements is not None:
        raise ValueError("effort='screen' prices the recipes' own placements: leave "
                         "parameter_placements out")
    names, sizes = _mesh_info(mesh)
    check_dim_names(names)
    manual = resolve_all(model, names, sizes)  # a declaration that cannot be used stops here
    sample_inputs = checks.tensor_inputs(sample_inputs)
    checks.token_inputs(model, sample_inputs)
    if input_placements is None:
        input_placements = [default_input_placements(names, x) for x in sample_inputs]
    input_placements = checks.placement_list("input_placements", input_placements,
                                             len(sample_inputs), len(names))
    for i, (x, pl) in enumerate(zip(sample_inputs, input_placements)):
        checks.even_split(f"sample_inputs[{i}]", x, pl, names, sizes)
    if output_placements is not None:
        output_placements = checks.placement_list("output_placements", output_placements, 1,
                                                  len(names))
    budget = (memory_budget_gib * GiB) if memory_budget_gib is not None else hw.hbm_bytes
    settings = PlannerSettings(
        hardware=hw, precision=prec, budget=budget, solver=solver, effort=effort,
        limits=SolveLimits(guard_s=time_limit_s) if time_limit_s else SolveLimits(),
        activation_checkpointing=activation_checkpointing, cp_attention=cp_attention,
        param_dtype=param_dtype, loop_collectives=tuple(loop_collectives))
    pins = Pins(inputs=input_placements,
                output=output_placements[0] if output_placements is not None else None,
                parameters=parameter_placements)
    sol = Planner(settings, say, trace_cache).solve(model, mesh, names, sizes, sample_inputs,
                                                    manual, pins)
    jg, pb, price, phases = sol.graph, sol.problem, sol.price, sol.phases

    t = time.perf_counter()
    plan = build_plan(
        pb, sol.assign, price,
        fingerprint=fingerprint(model, sample_inputs, names, sizes, hw),
        mesh_names=names, hardware=hw, budget=budget, solver=solver, stats=sol.stats,
        recipes=sol.priced, fallbacks=dict(sol.builder.fallbacks), start=sol.start,
    )
    if solver == "joint":
        plan.data["solver"]["method"] = "one integer program over products of per-dim choices"
    plan.data["reshard_after_forward"] = pb.reshard
    plan.data["recipe_schedule"] = fsdp_schedule(
        names, price, sol.priced["fsdp"]["price"] if "fsdp" in sol.priced else None,
        budget=budget, pinned=bool(sol.user_pins),
        manual=any(r.style != "data_parallel" for r in jg.manual_regions.values()),
        tied=any(len(names) > 1 for names in tied_names(model).values()))
    plan.data["activation_checkpointing"] = activation_checkpointing
    plan.data["cp_attention"] = cp_attention
    plan.data["param_dtype"] = str(param_dtype).removeprefix("torch.") if param_dtype else None
    phases["plan"] = {"seconds": time.perf_counter() - t}
    plan.timings = phases
    return plan


def plan_with_options(model: torch.nn.Module, mesh: DeviceMesh, options: PlanOptions, *,
                      progress=None, trace_cache: dict | None = None) -> Plan:
    """`plan_model` for `options` (`plan_options.PlanOptions`), on `mesh`, whose dim names and
    sizes must be the options' own: the one call every road to a plan makes."""
    names, sizes = _mesh_info(mesh)
    if (names, sizes) != (tuple(options.mesh_names), tuple(options.mesh_sizes)):
        raise ValueError(f"the mesh {dict(zip(names, sizes))} is not the options' "
                         f"{dict(zip(options.mesh_names, options.mesh_sizes))}")
    return plan_model(model, mesh, options.sample_inputs(), **options.keywords(),
                      progress=progress, trace_cache=trace_cache)


def _planned_inputs(plan: Plan) -> tuple[torch.Tensor, ...]:
    out = []
    for shape, dtype in plan.data["fingerprint"]["inputs"]:
        out.append(torch.empty(shape, dtype=getattr(torch, dtype.removeprefix("torch.")), device="meta"))
    return tuple(out)


def apply_plan(model: torch.nn.Module, plan: Plan, mesh: DeviceMesh, *,
               recompute_parameters: bool | None = None, bucket: bool = True,
               progress=None) -> torch.nn.Module:
    """Make `model` (on meta or one device) run `plan` on `mesh`; returns `model`, changed in
    place: DTensor parameters, and a forward that runs this rank's planned program.

    Inputs are fed as the local shards their planned placements imply, and the output comes
    back as the local shard of its placement (`model.autopar.input_placements`,
    `model.autopar.output_placement`). `recompute_parameters` gathers parameters again for
    the backward instead of keeping the gathered copies (FSDP's reshard-after-forward; default:
    what the plan chose, its `reshard_after_forward`);
    `bucket` merges each block's parameter all-gathers and gradient reduce-scatters into one.
    The plan's activation checkpointing mode decides which activations the backward recomputes,
    and its `param_dtype` the dtype the program computes in.
    A plan made for another model, inputs or mesh is refused with what differs.
    """
    say = progress or log.info
    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise ValueError("the model already has DTensor parameters: apply a plan to the plain "
                         "model (on meta or on one device), not to a parallelised one")
    names, sizes = _mesh_info(mesh)
    check_plan_data(json.loads(plan.to_json()), plan.source)  # as its file would be checked
    if flex_modules(model):
        raise ValueError(
            f"{type(model).__name__} uses flex attention (attn_type = 'flex'), whose masks are "
            "built per batch from the tokens: such flavors can be planned (titan-autopar plan) "
            "but not run under auto yet. Choose a flavor with sdpa attention, or auto = false")
    inputs = _planned_inputs(plan)
    fp = fingerprint(model, inputs, names, sizes, get_hardware("h100"))
    fp["hardware"] = plan.data["fingerprint"].get("hardware")  # any hardware runs any plan
    plan.check(fp)
    manual = resolve_all(model, names, sizes)
    plan.check_regions(manual)
    timings = {}
    t = time.perf_counter()
    dtype = plan.data.get("param_dtype")
    jg = trace_step(model, inputs, getattr(torch, dtype) if dtype else None, manual)
    check_against_graph(plan.data, jg, plan.source, mesh)
    timings["trace_s"] = time.perf_counter() - t
    t = time.perf_counter()
    local = trace_local_joint(jg, plan, mesh)
    timings["program_s"] = time.perf_counter() - t
    t = time.perf_counter()
    n_state = len(jg.param_names) + len(jg.buffer_names)
    local.deduped = dedupe_state_values(local.gm, n_state)
    if recompute_parameters is None:
        recompute_parameters = plan.data.get("reshard_after_forward", True)
    local.kept_gathered = not recompute_parameters
    split = split_joint(local.gm, n_state, recompute_parameters=recompute_parameters,
                        checkpointing=plan.data.get("activation_checkpointing", "none"))
    if bucket:
        phs = [n.name for n in local.gm.graph.nodes if n.op == "placeholder"]
        local.buckets = bucket_collectives(split.forward, split.backward,
                                           dict(zip(phs, jg.param_names)), jg.param_names,
                                           [b.name for b in jg.blocks])
    timings["split_s"] = time.perf_counter() - t
    model = parallelize_module(model, plan, mesh, jg, local, split)
    model.autopar.timings = timings
    say(f"[apply] program built in {sum(timings.values()):.2f}s "
        f"({', '.join(f'{k[:-2]} {v:.2f}s' for k, v in timings.items())})\n{model.autopar.summary()}")
    return model


def auto_parallelize(model: torch.nn.Module, mesh: DeviceMesh, sample_inputs, *,
                     recompute_parameters: bool | None = None, bucket: bool = True,
                     **plan_keywords) -> torch.nn.Module:
    """`plan_model` then `apply_plan`; the plan is kept as `model.autopar.plan`."""
    plan = plan_model(model, mesh, sample_inputs, **plan_keywords)
    return apply_plan(model, plan, mesh, recompute_parameters=recompute_parameters,
                      bucket=bucket, progress=plan_keywords.get("progress"))
