"""When a plan is FSDP's own schedule, and so may run under TorchTitan's FSDP2.

A plan whose collectives are parameter all-gathers and gradient reductions over the
data-parallel dims (besides the activations' traffic the recipe has too, such as the loss's),
that computes no more per rank than the FSDP recipe, and that gathers each
weight again for the backward (`reshard_after_forward`), is data parallelism with sharded
parameters: the schedule `fully_shard` runs. It may shard a weight on another tensor dim, or
leave a small one replicated, where the recipe shards dim 0: the gathered weight each op uses is
the same. TorchTitan's FSDP2 runs that schedule with its own runtime (prefetched gathers, the
last group kept gathered), which on 4 CPU ranks measured 5-7% faster than the plan's program of
local ops at the same placements (llama3 debug held to the recipe's peak: 1.02-1.08 s against
1.08-1.14 s a step). So such a plan is marked, and TorchTitan's switch runs the job's recipe for
it (`[auto_parallel] recipe_runtime`, default true), priced as the recipe.

A plan with anything else -- an activation redistributed, gathered copies kept for the
backward, a manual region, a parameter the user pinned, a mesh dim that is not data-parallel --
runs as its own program.
"""

from __future__ import annotations

from titan_autopar.solve.recipes import REPLICATE_DP, SHARD_DP

RECIPE = "fsdp"
_REL = 1e-3  # how close two prices of the same work are (placements of one op differ in rounding)


def fsdp_schedule(names, price, recipe_price, *, reshard: bool, budget: float,
                  pinned: bool, manual: bool) -> dict | None:
    """{"recipe": "fsdp", "why": ...} where the plan priced `price` is FSDP's schedule and the
    recipe (priced `recipe_price`, None if it was not priced) fits `budget`; else None."""
    if recipe_price is None or pinned or manual or not reshard:
        return None
    if not set(names) <= (REPLICATE_DP | SHARD_DP):
        return None
    if recipe_price.peak_memory > budget * (1 + 1e-9):
        return None
    moved = price.comm_total - price.comm_param  # activations' traffic (e.g. the loss's)
    if moved > (recipe_price.comm_total - recipe_price.comm_param) * (1 + 1e-9) + 1e-12:
        return None  # an activation is redistributed where the recipe moves none
    if price.compute > recipe_price.compute * (1 + _REL):
        return None  # some rank computes more than its share of the batch
    return {"recipe": RECIPE,
            "why": "every collective beyond the recipe's own is a parameter gather or a gradient "
                   "reduction over the data-parallel dims, each rank computes its share of the "
                   "batch, and weights "
                   "are gathered again for the backward: FSDP's schedule, which TorchTitan's "
                   "FSDP2 runs with its own runtime"}
