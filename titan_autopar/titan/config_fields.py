"""The fields this package adds to TorchTitan's JobConfig: `[parallelism] auto` and the
`[auto_parallel]` section, with their defaults and meaning. Plain dataclasses, no side effects:
`titan/job_config.py` merges them into TorchTitan's config, `titan/job_file.py` checks TOML
values against them.

(No `from __future__ import annotations` here: TorchTitan merges these dataclasses by their
field types, which must be classes, not strings.)
"""

from dataclasses import dataclass, field


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
    is refused with what differs. A relative path is under the job's dump folder."""
    save_plan: str = ""
    """Write the plan (JSON) here; a relative path is under the job's dump folder. A job that
    restarts (e.g. to resume from a checkpoint) finds it there and replays it when it was made
    for the same model, batch, mesh and settings, instead of solving again. A file there that
    is not a plan stops the job before it plans, unless `save_plan_force`."""
    save_plan_force: bool = False
    """Let `save_plan` replace a file that is not a plan (never a folder, device or pipe)."""
    search_degrees: bool = False
    """`titan-autopar plan --config` searches this job's degrees (as with --search): it ranks the
    factorizations of its ranks into dp_replicate x dp_shard x tp (x ep) by predicted tokens/s
    per GPU and writes the winner's [parallelism] block. A running job builds its mesh from
    [parallelism] before it plans, so at run time it uses the degrees written there."""
    hardware: str = "h100"
    """What the planner prices: a preset (h100, h200, a100, b200, cpu), a profile file written
    by `titan-autopar calibrate` (it must describe this machine and rank count), or "calibrate":
    measure this job's ranks at start, once per machine (cached)."""
    memory_budget_gib: float = 0.0
    """Per-device memory budget for the plan; 0 means the preset's memory."""
    cp_attention: str = "cheapest"
    """What attention may do on the cp dim: "cheapest" (shard its batch, its heads or its
    sequence -- ring attention --, or replicate it, whichever the plan prices lowest) or "ring"
    (always ring attention on sequence shards, as TorchTitan's CP recipe). Sequence shards are
    contiguous under auto: context_parallel_load_balancer is set to None."""
    solver: str = "highs"
    """highs (default, in this process), cbc (a subprocess) or joint (one exact program over
    every mesh dim: a check on the default descent, for small problems only)."""
    time_limit_s: float = 0.0
    """Wall-clock guard per integer program in seconds; 0 means the planner's default (600).
    Programs stop by counted limits (gap, nodes), so plans do not depend on the machine's load;
    the guard only stops a runaway program, and the plan then says "time_guard"."""
    recipe_runtime: bool = True
    """Where the plan is predicted less than `MIN_GAIN` faster than the FSDP recipe (the rule:
    `solve/recipe_schedule.py`) (the
    plan says `recipe_schedule`; typically a budget too tight to keep gathered weights), run the
    job's FSDP recipe under TorchTitan's FSDP2 instead of the plan's program; false runs the
    plan's program anyway. Other plans always run as their own program."""
    manual_modules: list[str] = field(default_factory=list)
    """Modules to run as manual regions, by qualified-name pattern (fnmatch: "layers.*.moe"):
    the planner plans around them and they run their own code. Empty: with
    expert_parallel_degree > 1 every MoE block, else none (a MoE block is then planned
    data-parallel). A pattern that matches nothing stops the job."""
    manual_style: str = "torchtitan_ep"
    """How the `manual_modules` run: "torchtitan_ep" (TorchTitan's ExpertParallel: experts split
    over the ep dim, tokens exchanged by all-to-all) or "data_parallel" (the block on each rank's
    own tokens, its parameters gathered)."""


@dataclass
class JobConfig:
    """What TorchTitan's config manager merges into its JobConfig: `titan/job_config.py` (the
    module a job names, which also installs the switch) exports this class, and
    `titan-autopar plan --config` parses a job with this module, which installs nothing."""

    parallelism: Parallelism = field(default_factory=Parallelism)
    auto_parallel: AutoParallel = field(default_factory=AutoParallel)
