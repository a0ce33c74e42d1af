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

The program recomputes a region's forward in the backward (its activations are not kept between
the two), so a backward op's price includes one more forward, all-to-alls included. Compute is
scaled by the measured `compute_scale`, as every op's is (`cost/compute.py`).

MOE_LOAD_IMBALANCE = 1.2: the busiest rank's share of routed tokens over the mean. Balanced
routing (TorchTitan's auxiliary-loss-free bias) keeps it near 1; 1.2 is an assumption, not a
measurement, and the same figure prices the expert recipes, so it does not favour either side.
"""

from __future__ import annotations

from dataclasses import dataclass

MOE_LOAD_IMBALANCE = 1.2


@dataclass(frozen=True)
class RegionWork:
    flops_per_token: float  # forward
    a2a_elements_per_token: float = 0.0  # per all-to-all, on the ep dim
    ep_dim: int | None = None


def region_work(resolved) -> RegionWork:
    facts = resolved.extra
    if "moe" in facts:
        m = facts["moe"]
        routed = 2.0 * 3 * m["dim"] * m["hidden"] * m["top_k"] * MOE_LOAD_IMBALANCE
        flops = 2.0 * m["dim"] * m["experts"] + 2.0 * 3 * m["dim"] * m["shared_hidden"] + routed
        a2a = m["top_k"] * m["dim"] * MOE_LOAD_IMBALANCE if resolved.ep_dim is not None else 0.0
        return RegionWork(flops, a2a, resolved.ep_dim)
    return RegionWork(2.0 * facts.get("param_elements", 0))


def region_seconds(work: RegionWork, backward: bool, tokens: float, hw, topo,
                   itemsize: int) -> tuple[float, float]:
    """(compute seconds, all-to-all seconds) of one rank for a region's forward or backward op."""
    peak = hw.peak_bf16_flops if itemsize <= 2 else hw.peak_fp32_flops
    forward = work.flops_per_token * tokens / (peak * hw.compute_efficiency)
    compute = hw.launch_overhead + (3 * forward if backward else forward)  # bwd = 2x fwd + recompute
    compute *= hw.compute_scale  # a measured layer's time over its priced ops (cost/layer_check.py)
    comm = 0.0
    if work.ep_dim is not None and work.a2a_elements_per_token:
        k = topo.sizes[work.ep_dim]
        nbytes = work.a2a_elements_per_token * tokens * itemsize * k  # as seen unsharded on ep
        one = topo.collective_time("all_to_all", work.ep_dim, nbytes)
        comm = (4 if backward else 2) * one
    return compute, comm
