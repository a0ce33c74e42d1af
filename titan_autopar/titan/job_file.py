"""A TorchTitan job file read for planning ahead, as TorchTitan's trainer reads it.

`planning_job(path)` checks the file's keys (`config_keys.py`), the types (`config_check.py`)
and values (`config_values.py`) of the sections the planner reads, with the words a job under
the switch gets, then parses it with TorchTitan's own `ConfigManager` (TorchTitan's defaults
for whatever the file leaves out) and returns a `PlanningJob`: that `JobConfig`, and the mesh
the job's degrees make (`planner_mesh`: the dims `auto = true` builds at run time).
`with_flags` writes `titan-autopar plan`'s flags into it (one rule: a flag given overrides the
config). What the planner is given comes from `PlanningJob.options`, i.e.
`titan/job_options.job_plan_options`, the function the running job calls.

The file is parsed with this package's fields module (`config_fields.JobConfig`) in place of
the switch module it names, which would also register the train specs of every model.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

from titan_autopar.limits import MAX_MESH_RANKS
from titan_autopar.titan.config_check import ConfigError, check_section, read_toml
from titan_autopar.titan.config_keys import SWITCH_MODULE, check_keys
from titan_autopar.titan.config_values import check_values
from titan_autopar.titan.job_options import job_plan_options
from titan_autopar.titan.manual_marks import check_job_regions

FIELDS_MODULE = "titan_autopar.titan.config_fields"
# flag -> (section, key) of the JobConfig it overrides
FLAG_KEYS = {"model": ("model", "name"), "flavor": ("model", "flavor"),
             "seq_len": ("training", "seq_len"),
             "local_batch_size": ("training", "local_batch_size"),
             "hardware": ("auto_parallel", "hardware"),
             "memory_budget_gib": ("auto_parallel", "memory_budget_gib"),
             "solver": ("auto_parallel", "solver"), "time_limit_s": ("auto_parallel", "time_limit_s"),
             "activation_checkpointing": ("activation_checkpoint", "mode"),
             "cp_attention": ("auto_parallel", "cp_attention"),
             "param_dtype": ("training", "mixed_precision_param")}


@dataclass(frozen=True)
class PlanningJob:
    config: object  # TorchTitan's JobConfig, flags written in
    mesh_names: tuple[str, ...]
    mesh_sizes: tuple[int, ...]

    def options(self, model, names=None, sizes=None):
        """The PlanOptions this job plans `model` with on its mesh (or on `names` x `sizes`)."""
        return job_plan_options(self.config, names or self.mesh_names, sizes or self.mesh_sizes,
                                model)

    model = property(lambda self: self.config.model.name)
    flavor = property(lambda self: self.config.model.flavor)
    seq_len = property(lambda self: self.config.training.seq_len)
    local_batch_size = property(lambda self: self.config.training.local_batch_size)
    hardware = property(lambda self: self.config.auto_parallel.hardware)
    memory_budget_gib = property(lambda self: self.config.auto_parallel.memory_budget_gib or None)
    search_degrees = property(lambda self: self.config.auto_parallel.search_degrees)
    manual_modules = property(lambda self: tuple(self.config.auto_parallel.manual_modules))
    manual_style = property(lambda self: self.config.auto_parallel.manual_style)
    activation_checkpointing = property(lambda self: self.config.activation_checkpoint.mode)
    world_size = property(lambda self: math.prod(self.mesh_sizes))
    expert_parallel = property(lambda self: dict(zip(self.mesh_names, self.mesh_sizes)).get("ep", 1))


def with_flags(job: PlanningJob, flags: dict) -> PlanningJob:
    """`job` with `titan-autopar plan`'s flags written over its config: each of FLAG_KEYS, and
    "mesh" as (names, sizes). A param_dtype of "float32" computes in the parameters' fp32."""
    for flag, value in flags.items():
        if flag == "mesh":
            continue
        section, key = FLAG_KEYS[flag]
        setattr(getattr(job.config, section), key, value)
    if "mesh" in flags:
        names, sizes = flags["mesh"]
        job = PlanningJob(job.config, tuple(names), tuple(sizes))
    return job


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
    """The sections the planner reads, each value checked against TorchTitan's (and this
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


def _parsed(path: Path, cfg: dict):
    """TorchTitan's JobConfig for the file, parsed by its ConfigManager. Its warnings about
    the trainer's own files (a tokenizer folder not there yet) are not the plan's: muted."""
    from torchtitan.config import ConfigManager
    from torchtitan.tools.logging import logger

    named = (cfg.get("job") or {}).get("custom_config_module") or SWITCH_MODULE
    module = FIELDS_MODULE if named == SWITCH_MODULE else named
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        return ConfigManager().parse_args(["--job.config_file", str(path),
                                           "--job.custom_config_module", module])
    finally:
        logger.setLevel(level)


def planning_job(path: str | Path) -> PlanningJob:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"no config at {path}: give a TorchTitan TOML such as "
                          "train_configs/llama3_8b_64gpu_auto.toml")
    cfg = read_toml(path)
    check_keys(cfg, str(path))
    check_values(_checked_sections(cfg, str(path)), str(path))  # as a job under the switch
    config = _parsed(path, cfg)
    par, ap = config.parallelism, config.auto_parallel
    deg = {k: getattr(par, f"{k}_degree") for k in (
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
    check_job_regions(deg["expert_parallel"], ap.manual_modules, ap.manual_style, str(path))
    names, sizes = planner_mesh(deg["data_parallel_replicate"], deg["data_parallel_shard"],
                                deg["tensor_parallel"], deg["expert_parallel"],
                                deg["context_parallel"])
    world = math.prod(sizes)
    if world > MAX_MESH_RANKS:
        raise ConfigError(f"{path}: the [parallelism] degrees multiply to {world} ranks; a "
                          f"simulated cluster holds at most {MAX_MESH_RANKS}: lower them")
    return PlanningJob(config, tuple(names), tuple(sizes))
