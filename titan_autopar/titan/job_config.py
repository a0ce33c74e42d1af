"""The TorchTitan switch: `[parallelism] auto = true` and the `[auto_parallel]` section.

A TorchTitan 0.2.2 job names this module in `[job] custom_config_module`; TorchTitan's config
manager imports it and merges `JobConfig` below into its own, field by field. Importing it also
registers, under the same names, wrapped train specs of llama3, llama4, deepseek_v3 and qwen3
whose parallelize function plans the model when `parallelism.auto` is set and otherwise calls
the model's own recipe unchanged (`titan/parallelize.py`), and puts a clear check of the
parallelism degrees against the rank count before TorchTitan's own (`titan/degree_check.py`).

(No `from __future__ import annotations` here: TorchTitan merges these dataclasses by their
field types, which must be classes, not strings.)
"""

from dataclasses import dataclass, field

from titan_autopar.titan.degree_check import install_degree_check
from titan_autopar.titan.parallelize import register_auto_train_specs


@dataclass
class Parallelism:
    auto: bool = False
    """Plan this model's parallelism with titan_autopar instead of its hand-written recipe. The
    degrees (dp_replicate, dp_shard, cp, tp, pp) still define the mesh; the planner decides
    what each of its dims carries."""


@dataclass
class AutoParallel:
    plan_file: str = ""
    """Replay this saved plan instead of solving; a plan made for another model, batch or mesh
    is refused with what differs."""
    save_plan: str = ""
    """Write the plan (JSON) here; relative paths are under the job's dump folder."""
    hardware: str = "h100"
    """Hardware preset whose costs the planner uses: h100, h200, a100 or b200."""
    memory_budget_gib: float = 0.0
    """Per-device memory budget for the plan; 0 means the preset's memory."""
    solver: str = "cbc"
    """cbc (default) or highs."""
    time_limit_s: float = 0.0
    """Time limit of each integer program in seconds; 0 means the planner's default."""


@dataclass
class JobConfig:
    parallelism: Parallelism = field(default_factory=Parallelism)
    auto_parallel: AutoParallel = field(default_factory=AutoParallel)


register_auto_train_specs()
install_degree_check()
