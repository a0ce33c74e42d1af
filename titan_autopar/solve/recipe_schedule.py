"""When a plan gains nothing the cost model can resolve over TorchTitan's FSDP recipe, and so
runs as that recipe.

Both sides are priced as they run: the recipe with FSDP2's runtime per group as calibration
measured it (`hardware.fsdp_group_overhead`, the recipe's `framework_s`), the plan's program of
local ops with its ops' launch floor and each collective's in-step overhead (a profile's
`launch_overhead` and `collective_step_overhead`), which is what its runtime is made of: it has no
hooks and no copies into flat buffers beyond its merged collectives. Measured on 4 CPU ranks,
each side lies as close to its prediction as the other (`benchmarks/fidelity.py`, two runs:
auto's own llama3 plans 8.5% under to 2% over their predicted step, FSDP's 14% under to 7%
over), and the llama3 plans that keep gathered weights, predicted 7-10% faster than the
recipe, measured 1.06-1.10x its throughput in the run where they ran as their program, and
1.10-1.19x in `make demo`'s three-round A/Bs.

A plan is worth running as its own program only where it is predicted faster than the recipe
by at least `MIN_GAIN` of the recipe's step: below that, one arm's spread from round to round
and the prices' error (larger on MoE models) decide the order, not the plan. Where it is not
(typically a budget too tight to keep gathered weights, which leaves FSDP's two gathers per
weight and a plan 4% ahead; or deepseek_v3's data-parallel MoE blocks, 2-3% ahead), the plan
says so (`recipe_schedule`) and TorchTitan's switch runs the job's FSDP recipe
(`[auto_parallel] recipe_runtime`, default true), predicted as the recipe.

An earlier rule compared the plan with the recipe's schedule without FSDP2's runtime, on the
view that the program's own runtime was unpriced and about as large. The llama3 plans then sat
at 4-5.5% over that schedule, on either side of `MIN_GAIN` from one calibration to the next,
and ran as the recipe in one fidelity run and as their program (1.06-1.10x) in the other.

Only where the recipe is what TorchTitan would run on this mesh and the user left the choice to
the planner: every mesh dim data-parallel, no manual region with its own distributed code (a
MoE block planned "data_parallel" -- every MoE block of a job with expert_parallel_degree = 1
-- is what the recipe runs too: each rank routes its own tokens through experts FSDP gathers;
a "user" or "torchtitan_ep" region is not), no parameter the user pinned, no parameter shared
between modules (TorchTitan's FSDP recipe stops on tied weights: qwen3's dense flavor, "shared
with a parameter already managed by another FSDP group"), the recipe within the budget.
"""

from __future__ import annotations

from titan_autopar.solve.recipes import REPLICATE_DP, SHARD_DP

RECIPE = "fsdp"
# the least predicted gain over the recipe, as a share of its step, for which a plan runs as its
# own program. A smaller one is not a prediction the model can make: it is under one arm's own
# spread from round to round (4.3-4.6% at the median in benchmarks/fidelity.py) and under the
# prices' error (up to 10% on llama3's arms, 8-15% on the MoE models' data-parallel ones);
# deepseek_v3's plan, predicted 2.9% faster, measured 1.15x and then 0.96x the recipe.
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
