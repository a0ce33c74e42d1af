"""Prices of manual regions: what one rank spends inside a region the planner does not see.

A region's op carries its tokens (the rows of its first input on this rank). For TorchTitan MoE
blocks (styles "data_parallel" and "torchtitan_ep") the work per token is known from the
block's shapes (`graph/manual.py` records them):
  router      2 * dim * experts
  shared      2 * 3 * dim * shared_hidden                 (SwiGLU: w1, w3, w2)
  routed      2 * 3 * dim * hidden * top_k * MOE_LOAD_IMBALANCE
i.e. top-k *active* experts, not all of them; the backward is twice the forward. Under
"torchtitan_ep" each forward adds two all-to-alls on the ep dim (dispatch and combine), each
moving tokens * top_k * dim elements per rank, also scaled by the imbalance; the backward has
two more. A region the user wrote is priced as dense work, 2 FLOPs per parameter element and
token, with no collectives of its own.

A TorchTitan MoE block in a program without activation checkpointing keeps its autograd graph
from forward to backward (`kept_regions`; `apply/regions_run.py`), as it does under TorchTitan's
recipes: its backward is twice its forward, and its forward op holds what autograd saved inside
the block until the backward, counted per token (forward FLOPs' operands, d = dim, h = hidden,
s = shared_hidden, E = experts, k = top_k):
  router  2 E + 2 k              (logits, scores, top-k values and indices)
  routed  k (3 d + 4 h) x MOE_LOAD_IMBALANCE   (tokens sent to experts, w1 and w3 outputs,
                                  their SiLU and product, w2's output, the scored copy)
  shared  4 s + d                (the same for the shared experts, and the sum)
Any other region (and every region under activation checkpointing) is recomputed: its backward
runs the forward again, so a backward op's price includes one more forward, all-to-alls
included, and nothing inside it is held. Compute is scaled by the measured `compute_scale`, as
every op's is (`cost/compute.py`).

MOE_LOAD_IMBALANCE = 1.2: the busiest rank's share of routed tokens over the mean. Balanced
routing (TorchTitan's auxiliary-loss-free bias) keeps it near 1; 1.2 is an assumption, not a
measurement, and the same figure prices the expert recipes, so it does not favour either side.
"""

from __future__ import annotations

from dataclasses import dataclass

MOE_LOAD_IMBALANCE = 1.2


BUILT_IN_STYLES = ("data_parallel", "torchtitan_ep")


def kept_regions(resolved: dict, recompute: str) -> set[str]:
    """The regions whose autograd graph a program keeps from forward to backward: TorchTitan's
    MoE blocks (the built-in styles, whose activations `region_work` counts), when activations
    are not recomputed. `apply/regions_run.py` runs, and `solve/problem.py` prices, this set."""
    if recompute != "none":
        return set()
    return {n for n, r in resolved.items() if r.style in BUILT_IN_STYLES}


@dataclass(frozen=True)
class RegionWork:
    flops_per_token: float  # forward
    a2a_elements_per_token: float = 0.0  # per all-to-all, on the ep dim
    ep_dim: int | None = None
    kept_elements_per_token: float = 0.0  # held from forward to backward when kept


def region_work(resolved) -> RegionWork:
    facts = resolved.extra
    if "moe" in facts:
        m = facts["moe"]
        routed = 2.0 * 3 * m["dim"] * m["hidden"] * m["top_k"] * MOE_LOAD_IMBALANCE
        flops = 2.0 * m["dim"] * m["experts"] + 2.0 * 3 * m["dim"] * m["shared_hidden"] + routed
        a2a = m["top_k"] * m["dim"] * MOE_LOAD_IMBALANCE if resolved.ep_dim is not None else 0.0
        kept = (2 * m["experts"] + 2 * m["top_k"]
                + m["top_k"] * (3 * m["dim"] + 4 * m["hidden"]) * MOE_LOAD_IMBALANCE
                + 4 * m["shared_hidden"] + m["dim"])
        return RegionWork(flops, a2a, resolved.ep_dim, kept)
    return RegionWork(2.0 * facts.get("param_elements", 0))


def region_seconds(work: RegionWork, backward: bool, tokens: float, hw, topo,
                   itemsize: int, kept: bool = False) -> tuple[float, float]:
    """(compute seconds, all-to-all seconds) of one rank for a region's forward or backward op;
    `kept`: the region's graph is kept from forward to backward (no recomputation)."""
    peak = hw.peak_bf16_flops if itemsize <= 2 else hw.peak_fp32_flops
    forward = work.flops_per_token * tokens / (peak * hw.compute_efficiency)
    passes = (2 if kept else 3) if backward else 1  # bwd = 2x fwd (+ the recomputed forward)
    compute = hw.launch_overhead + passes * forward
    compute *= hw.compute_scale  # a measured layer's time over its priced ops (cost/layer_check.py)
    comm = 0.0
    if work.ep_dim is not None and work.a2a_elements_per_token:
        k = topo.sizes[work.ep_dim]
        nbytes = work.a2a_elements_per_token * tokens * itemsize * k  # as seen unsharded on ep
        one = topo.collective_time("all_to_all", work.ep_dim, nbytes)
        comm = (2 if kept or not backward else 4) * one
    return compute, comm
