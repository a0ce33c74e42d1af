"""What a TorchTitan job plans with: its `JobConfig` read into `PlanOptions`, in one place.

`job_plan_options(job_config, names, sizes, model)` is the only reading of a job's planner
settings. The switch (`auto = true`, `titan/parallelize.py`), `titan-autopar plan --config` and
the degree search (`titan/degree_search.py`) all call it, so a plan previewed from a config is
the plan that config's job runs. From the job it takes:

- the inputs: `local_batch_size` x the data-parallel degrees by `seq_len` tokens (a pipeline
  stage gives its own, `titan/parallelize.stage_inputs`);
- the output pinned to the same batch split: the logits meet each rank's own labels;
- `[auto_parallel]` hardware, memory budget (0: the hardware's), solver, time guard (0: the
  planner's default) and cp attention;
- `[activation_checkpoint] mode`;
- `[training] mixed_precision_param` as the compute dtype where it differs from the
  parameters' dtype (`compute_dtype`); every tensor priced at its real size, since the job's
  graph carries its real dtypes;
- the collectives TorchTitan's training loop issues each step (`titan/loop_collectives.py`,
  `[metrics] log_freq`).
The mesh comes in as names and sizes: the job's own (`titan/job_file.planner_mesh`), or a
searched candidate's.
"""

from __future__ import annotations

import torch

from titan_autopar.plan_options import PlanOptions, token_inputs
from titan_autopar.solve.recipes import default_input_placements
from titan_autopar.titan.loop_collectives import trainer_loop_collectives
from titan_autopar.titan.models import global_batch


def compute_dtype(model, job_config) -> torch.dtype | None:
    """`training.mixed_precision_param` as the plan's param_dtype (None: the parameters' own)."""
    want = getattr(torch, job_config.training.mixed_precision_param)
    return None if want == next(model.parameters()).dtype else want


def job_plan_options(job_config, names, sizes, model, inputs=None) -> PlanOptions:
    """The PlanOptions of `job_config` on the mesh `names` x `sizes` for `model` (on meta);
    `inputs` (`PlanOptions.inputs`) replaces the job's tokens, for a pipeline stage."""
    names, sizes = tuple(names), tuple(sizes)
    ap, t = job_config.auto_parallel, job_config.training
    if inputs is None:
        inputs = token_inputs(global_batch(t.local_batch_size, names, sizes), t.seq_len)
    return PlanOptions(
        mesh_names=names, mesh_sizes=sizes, inputs=tuple(inputs),
        hardware=ap.hardware, memory_budget_gib=ap.memory_budget_gib or None,
        solver=ap.solver, time_limit_s=ap.time_limit_s or None,
        param_dtype=compute_dtype(model, job_config), exact_floats=True,
        activation_checkpointing=job_config.activation_checkpoint.mode,
        cp_attention=ap.cp_attention,
        output_placements=(default_input_placements(names, torch.empty(1, 1, 1)),),
        loop_collectives=trainer_loop_collectives(names, sizes, job_config.metrics.log_freq))
