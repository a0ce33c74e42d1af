"""What a TorchTitan job file asks the planner for, read without starting TorchTitan.

`planning_job(path)` reads a TOML config (the `[model]`, `[training]`, `[parallelism]` and
`[auto_parallel]` sections) and returns what `titan-autopar plan --config` needs to plan that
job on a simulated cluster: model and flavor, sequence length, local batch, the mesh (the same
dims `auto = true` builds at run time: dp_replicate, dp_shard, ep, tp, degree-1 dims left out), the
manual regions (`manual_modules`, or with ep > 1 every MoE block) and
the hardware preset, memory budget, solver, activation checkpointing mode and mixed precision
(TorchTitan's defaults where a section leaves them out: selective checkpointing, bf16 compute).
The file's keys (`config_keys.py`), types (`config_check.py`) and values (`config_values.py`)
are checked as a job under the switch checks them; a config the planner cannot take says what
to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from titan_autopar.limits import MAX_MESH_RANKS
from titan_autopar.titan.config_check import ConfigError, check_section, read_toml
from titan_autopar.titan.config_keys import check_keys
from titan_autopar.titan.config_values import check_values
from titan_autopar.titan.manual_marks import check_job_regions


@dataclass
class PlanningJob:
    model: str
    flavor: str
    seq_len: int
    local_batch_size: int
    mesh_names: tuple[str, ...]
    mesh_sizes: tuple[int, ...]
    hardware: str
    memory_budget_gib: float | None
    world_size: int
    activation_checkpointing: str
    param_dtype: str | None  # mixed precision compute dtype, None for the parameters' own
    expert_parallel: int = 1
    manual_modules: tuple[str, ...] = ()
    manual_style: str = "torchtitan_ep"
    search_degrees: bool = False
    cp_attention: str = "cheapest"
    solver: str = "highs"
    time_limit_s: float | None = None  # None: the planner's default
    log_freq: int = 10  # [metrics] log_freq: the trainer's logging collectives run that often


def planner_mesh(dp_replicate: int, dp_shard: int, tp: int, ep: int = 1,
                 cp: int = 1) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The planner's mesh dims for these degrees, outermost first, degree-1 dims left out, in
    TorchTitan's order (dp_replicate, dp_shard, cp, tp), so each rank holds the same data in
    both. The ep ranks are carved out of the data-parallel shard ranks, innermost, as
    TorchTitan's dp2ep does: (dp_replicate, dp_shard / ep, ep, tp)."""
    if ep > 1 and cp > 1:
        raise ConfigError(
            f"expert_parallel_degree = {ep} with context_parallel_degree = {cp}: under auto the "
            "ep ranks are carved out of the data-parallel ranks only, and cp with ep is not "
            "planned yet. Set one of them to 1 (or use auto = false for TorchTitan's recipe)")
    if ep > 1 and dp_shard % ep:
        raise ConfigError(
            f"expert_parallel_degree = {ep} must divide data_parallel_shard_degree = {dp_shard} "
            "under auto (the ep ranks are carved out of the data-parallel ranks; taking them from "
            "tensor-parallel ranks is not planned yet): choose an ep degree that divides "
            f"{dp_shard}")
    dims = [(n, s) for n, s in (("dp_replicate", dp_replicate), ("dp_shard", dp_shard // ep),
                                ("ep", ep), ("cp", cp), ("tp", tp)) if s > 1] or [("dp_shard", 1)]
    names, sizes = zip(*dims)
    return tuple(names), tuple(sizes)


def _checked_sections(cfg: dict, source: str) -> dict:
    """The sections this module reads, each value checked against TorchTitan's (and this
    package's) declared type."""
    from torchtitan.config import job_config as tt

    from titan_autopar.titan import config_fields as ours

    declared = {"model": [tt.Model], "training": [tt.Training],
                "parallelism": [tt.Parallelism, ours.Parallelism],
                "auto_parallel": [ours.AutoParallel],
                "activation_checkpoint": [tt.ActivationCheckpoint], "metrics": [tt.Metrics]}
    out = {}
    for section, classes in declared.items():
        values = cfg.get(section, {})
        for cls in classes:
            check_section(section, values, cls, source)
        out[section] = values
    return out


def planning_job(path: str | Path) -> PlanningJob:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"no config at {path}: give a TorchTitan TOML such as "
                          "train_configs/llama3_8b_64gpu_auto.toml")
    cfg = read_toml(path)
    check_keys(cfg, str(path))
    sections = _checked_sections(cfg, str(path))
    check_values(sections, str(path))  # the same rules as a job under the switch
    model, training = sections["model"], sections["training"]
    par, ap = sections["parallelism"], sections["auto_parallel"]
    deg = {k: int(par.get(f"{k}_degree", 1)) for k in (
        "data_parallel_replicate", "data_parallel_shard", "tensor_parallel", "pipeline_parallel",
        "context_parallel", "expert_parallel")}
    if deg["data_parallel_shard"] < 1:
        raise ValueError(f"{path}: data_parallel_shard_degree = {deg['data_parallel_shard']}; "
                         "planning ahead needs the cluster size: write the degree out (e.g. 64 "
                         "for 64 GPUs with no other parallelism)")
    if deg["pipeline_parallel"] > 1:
        raise ValueError(f"{path}: pipeline_parallel_degree = {deg['pipeline_parallel']}: "
                         "`plan --config` plans the whole model on one mesh; pipeline stages are "
                         "planned when the job runs. Set it to 1 to plan ahead.")
    check_job_regions(deg["expert_parallel"], ap.get("manual_modules", ()),
                      ap.get("manual_style", "torchtitan_ep"), str(path))
    names, sizes = planner_mesh(deg["data_parallel_replicate"], deg["data_parallel_shard"],
                                deg["tensor_parallel"], deg["expert_parallel"],
                                deg["context_parallel"])
    world = 1
    for s in sizes:
        world *= s
    if world > MAX_MESH_RANKS:
        raise ConfigError(f"{path}: the [parallelism] degrees multiply to {world} ranks; a "
                          f"simulated cluster holds at most {MAX_MESH_RANKS}: lower them")
    budget = float(ap.get("memory_budget_gib", 0.0)) or None
    return PlanningJob(
        model=model.get("name", "llama3"), flavor=model.get("flavor", "debugmodel"),
        seq_len=int(training.get("seq_len", 2048)),
        local_batch_size=int(training.get("local_batch_size", 8)),
        mesh_names=tuple(names), mesh_sizes=tuple(sizes),
        hardware=ap.get("hardware", "h100"), memory_budget_gib=budget, world_size=world,
        activation_checkpointing=sections["activation_checkpoint"].get("mode", "selective"),
        param_dtype=(None if training.get("mixed_precision_param", "bfloat16") == "float32"
                     else training.get("mixed_precision_param", "bfloat16")),
        expert_parallel=deg["expert_parallel"],
        manual_modules=tuple(ap.get("manual_modules", ())),
        manual_style=ap.get("manual_style", "torchtitan_ep"),
        search_degrees=bool(ap.get("search_degrees", False)),
        cp_attention=ap.get("cp_attention", "cheapest"), solver=ap.get("solver", "highs"),
        time_limit_s=float(ap.get("time_limit_s", 0.0)) or None,
        log_freq=int(sections["metrics"].get("log_freq", 10)))
