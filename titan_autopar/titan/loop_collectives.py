"""The collectives TorchTitan's trainer issues each step outside the model, for the planner to price.

TorchTitan 0.2.2's `Trainer.train_step` (torchtitan/train.py), beside the model's forward and
backward:
  - sums the batch's valid tokens over the data-parallel ranks (`dist_sum` on the batch mesh),
    when data parallelism is on: one all-reduce of an int64;
  - clips the gradients (`dist_utils.clip_grad_norm_`): the gradient norm is a partial sum on
    every mesh dim the gradients are split on, reduced by `full_tensor()`: priced as one
    all-reduce of a float per mesh dim;
  - on the steps it logs (`metrics.log_freq`), with data or context parallelism on, sums the
    loss, maxes it and sums the tokens seen over the loss mesh (the data and context dims):
    three all-reduces.
A mesh whose data dims TorchTitan flattens into one group (dp_replicate x dp_shard) is priced as
one call per dim. `cost/loop.py` prices them; they are the same for every plan of a job.
"""

from __future__ import annotations

from titan_autopar.cost.loop import LoopCollective
from titan_autopar.solve.recipes import CONTEXT, DATA


def trainer_loop_collectives(names, sizes, log_freq: int = 10) -> tuple[LoopCollective, ...]:
    on = [n for n, s in zip(names, sizes) if s > 1]
    data = tuple(n for n in on if n in DATA)
    loss = tuple(n for n in on if n in DATA or n in CONTEXT)
    out = []
    if data:
        out.append(LoopCollective("all_reduce", 8, data, 1.0, "valid tokens in the batch"))
    if on:
        out.append(LoopCollective("all_reduce", 4, tuple(on), 1.0, "gradient norm for clipping"))
    if loss:
        out.append(LoopCollective("all_reduce", 8, loss, 3.0 / max(1, int(log_freq)),
                                  "logged loss (sum, max) and tokens seen"))
    return tuple(out)
