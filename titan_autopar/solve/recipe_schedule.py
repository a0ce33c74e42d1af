"""When a plan runs as TorchTitan's FSDP recipe instead of as its own program.

Both sides are priced as they run: the recipe with FSDP2's runtime per group as calibration
measures it (`hardware.fsdp_group_overhead`, the recipe's `framework_s`), the plan's program of
local ops with its ops' launch floor and each collective's in-step overhead (a profile's
`launch_overhead` and `collective_step_overhead`), which is what its runtime is made of: it has no
hooks and no copies into flat buffers beyond its merged collectives.

The rule, stated here once: a plan runs as its own program only where it is predicted faster
than the recipe by at least `MIN_GAIN` of the recipe's step. Where it is not (typically a budget
too tight to keep gathered weights, which leaves FSDP's two gathers per weight), the plan says so
(`recipe_schedule`) and TorchTitan's switch runs the job's FSDP recipe (`[auto_parallel]
recipe_runtime`, default true), predicted as the recipe. Other docs link here.

The rule applies only where the recipe is what TorchTitan would run on this mesh and the user
left the choice to the planner: every mesh dim data-parallel, no manual region with its own
distributed code (a MoE block planned "data_parallel" -- every MoE block of a job with
expert_parallel_degree = 1 -- is what the recipe runs too: each rank routes its own tokens
through experts FSDP gathers; a "user" or "torchtitan_ep" region is not), no parameter the user
pinned, no parameter shared between modules (TorchTitan's FSDP recipe stops on tied weights:
qwen3's dense flavor, "shared with a parameter already managed by another FSDP group"), the
recipe within the budget.
"""

from __future__ import annotations

from titan_autopar.solve.recipes import REPLICATE_DP, SHARD_DP

RECIPE = "fsdp"
# the least predicted gain over the recipe, as a share of its step, for which a plan runs as its
# own program. A smaller one is not a prediction the cost model can make: it lies under one arm's
# own spread from round to round and under the prices' error, both measured by
# benchmarks/fidelity.py on CPU ranks
MIN_GAIN = 0.05


def fsdp_schedule(names, price, recipe_price, *, budget: float, pinned: bool,
                  manual: bool, tied: bool) -> dict | None:
    """{"recipe": "fsdp", "gain_pct": ..., "why": ...} where the plan priced `price` is predicted
    less than MIN_GAIN faster than the fsdp recipe (priced `recipe_price` with FSDP2's runtime,
    None if it was not) and the recipe fits `budget`; else None. `manual`: the plan has a manual
    region with its own distributed code; `tied`: the model shares a parameter between modules."""
    if recipe_price is None or pinned or manual or tied:
        return None
    if not set(names) <= (REPLICATE_DP | SHARD_DP):
        return None
    if recipe_price.peak_memory > budget * (1 + 1e-9):
        return None
    recipe = recipe_price.step_time
    gain = (recipe - price.step_time) / recipe if recipe > 0 else 0.0
    if gain >= MIN_GAIN:
        return None
    return {"recipe": RECIPE, "gain_pct": round(100 * gain, 3),
            "why": f"predicted {100 * gain:.2f}% faster than the recipe (each with its runtime), "
                   f"under the {100 * MIN_GAIN:.0f}% the prices can resolve: TorchTitan's FSDP2 "
                   "runs the recipe"}
