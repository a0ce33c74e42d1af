"""`PlanOptions`: everything a plan depends on besides the model, in one value.

A plan is a function of the model and of these options: the mesh, the global shape of what the
step is fed, the hardware and memory budget it is priced for, the precision it computes in, the
activation checkpointing it runs, what attention may do on a cp dim, the placements pinned on
the way in and out and on parameters, the training loop's own collectives, and the solver's
settings. Every road to a plan builds one `PlanOptions` and hands it to
`api.plan_with_options`:

- a TorchTitan job under `[parallelism] auto = true`, `titan-autopar plan --config` and
  `plan --search` build theirs from the job's parsed `JobConfig` in one place,
  `titan/job_options.job_plan_options`, so the plan a user previews is the plan the job runs;
- `titan-autopar plan` without a config builds one from its flags;
- `plan_model(...)`'s keywords are the same fields (`PlanOptions.keywords`).

Plain data: no TorchTitan, nothing of the solver's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch.distributed.tensor.placement_types import Placement


@dataclass(frozen=True)
class PlanOptions:
    mesh_names: tuple[str, ...]
    mesh_sizes: tuple[int, ...]
    # each input of the step at its global shape, with its dtype: tokens (batch, seq) as int64,
    # or a later pipeline stage's hidden states (batch, seq, dim) in the compute dtype
    inputs: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    hardware: str = "h100"  # a preset or a profile file (`cost/hardware.get_hardware`)
    memory_budget_gib: float | None = None  # None: the hardware's memory
    solver: str = "highs"  # highs | cbc | joint
    time_limit_s: float | None = None  # None: the planner's default guard
    effort: str = "full"  # full | screen (the degree search's first pass)
    param_dtype: torch.dtype | None = None  # compute dtype; None: the parameters' own
    # price every tensor at its real size (a job, whose graph has its real dtypes) rather than
    # activations at bf16's 2 bytes (the Python API's default)
    exact_floats: bool = False
    activation_checkpointing: str = "none"  # none | selective | full
    cp_attention: str = "cheapest"  # cheapest | ring
    input_placements: tuple[tuple[Placement, ...], ...] | None = None  # None: batch over dp
    output_placements: tuple[tuple[Placement, ...], ...] | None = None  # None: free
    parameter_placements: dict | str | None = None  # name -> placements, or a recipe's name
    loop_collectives: tuple = field(default=())  # `cost.loop.LoopCollective`s, each step

    def sample_inputs(self) -> tuple[torch.Tensor, ...]:
        """The step's inputs on the meta device, at their global shapes."""
        return tuple(torch.empty(shape, dtype=dtype, device="meta") for shape, dtype in self.inputs)

    def keywords(self) -> dict:
        """`plan_model`'s keyword arguments for these options."""
        from titan_autopar.cost.memory import Precision

        return dict(
            input_placements=None if self.input_placements is None else list(self.input_placements),
            output_placements=(None if self.output_placements is None
                               else list(self.output_placements)),
            parameter_placements=self.parameter_placements, hardware=self.hardware,
            memory_budget_gib=self.memory_budget_gib, solver=self.solver,
            time_limit_s=self.time_limit_s,
            precision=Precision(exact_floats=True) if self.exact_floats else None,
            activation_checkpointing=self.activation_checkpointing, param_dtype=self.param_dtype,
            effort=self.effort, cp_attention=self.cp_attention,
            loop_collectives=self.loop_collectives)

    def replace(self, **changes) -> "PlanOptions":
        return dataclasses.replace(self, **changes)


def token_inputs(batch: int, seq_len: int) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """`PlanOptions.inputs` of a step fed `batch` sequences of `seq_len` tokens."""
    return (((batch, seq_len), torch.int64),)
