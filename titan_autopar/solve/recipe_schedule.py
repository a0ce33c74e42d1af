"""When a plan gains nothing the cost model can resolve over FSDP's own schedule, and so runs as
TorchTitan's FSDP recipe.

The planner prices a plan's compute and communication; what it does not price is the runtime
that runs them. TorchTitan's FSDP2 is priced with its measured runtime per group
(`hardware.fsdp_group_overhead`, the recipe's `framework_s`); the plan's program of local ops is
priced with none, and on 4 CPU ranks it measured anywhere from 10% faster to 10% slower than
FSDP2 at FSDP-like placements from one hour to the next (llama3 debug held to the recipe's peak:
0.87-0.89 s against 0.79-0.80 s a step in one run, 0.77-0.80 s against 0.86-0.87 s in the next).
So a plan is only worth running as a program where it is predicted faster than the recipe's
schedule on equal terms -- compute, communication and the training loop, neither runtime --
by at least `MIN_GAIN` of the step. Where it is not (typically a budget too tight to keep
gathered weights, which leaves FSDP's two gathers per weight), the plan says so
(`recipe_schedule`) and TorchTitan's switch runs the job's FSDP recipe
(`[auto_parallel] recipe_runtime`, default true), predicted as the recipe.

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
# the least predicted gain over the recipe's schedule, as a share of its step, for which a plan
# runs as its own program. A smaller one is not a prediction the model can make: it is under
# one arm's own spread from round to round (4.6% at the median in benchmarks/fidelity.py) and
# under the prices' error (3-10% on llama3's arms, 22-29% on the MoE models' data-parallel
# ones); deepseek_v3's plan, predicted 2.9% faster, measured 1.15x and then 0.96x the recipe.
MIN_GAIN = 0.05


def fsdp_schedule(names, price, recipe_price, *, budget: float, pinned: bool,
                  manual: bool, tied: bool) -> dict | None:
    """{"recipe": "fsdp", "gain_pct": ..., "why": ...} where the plan priced `price` is predicted
    less than MIN_GAIN faster than the fsdp recipe (priced `recipe_price`, None if it was not)
    on equal terms and the recipe fits `budget`; else None. `manual`: the plan has a manual
    region with its own distributed code; `tied`: the model shares a parameter between modules."""
    if recipe_price is None or pinned or manual or tied:
        return None
    if not set(names) <= (REPLICATE_DP | SHARD_DP):
        return None
    if recipe_price.peak_memory > budget * (1 + 1e-9):
        return None
    schedule = recipe_price.step_time - recipe_price.framework  # without FSDP2's runtime
    gain = (schedule - price.step_time) / schedule if schedule > 0 else 0.0
    if gain >= MIN_GAIN:
        return None
    return {"recipe": RECIPE, "gain_pct": round(100 * gain, 3),
            "why": f"predicted {100 * gain:.2f}% faster than the recipe's own schedule (compute "
                   f"and communication, neither runtime), under the {100 * MIN_GAIN:.0f}% the "
                   "prices can resolve: TorchTitan's FSDP2 runs the recipe"}
