"""Collective prices on the real topology.

Owns `Topology` (which mesh dims stay inside a node, and the bandwidth/latency each sees) and
`redistribute_time` / `redistribute_steps`: the collectives that move a tensor from one N-D
placement to another, priced per mesh dim. A mesh dim whose ranks all sit inside one node uses
NVLink figures; one that crosses nodes is bound by the inter-node link. Ring-style bandwidth
terms, a log-depth latency term (a share of it for a parameter's or a gradient's collective that
`apply/bucket.py` merges with the rest of its block's, and only for that one: `_merged`); where a measured profile has a fitted curve for the collective
and group size (`Hardware.collective_fits`), that curve instead; either way plus what a call
costs inside a training step beyond it (`Hardware.collective_step_overhead`, a share of it where
merged, as of the latency).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from titan_autopar.cost.hardware import Hardware


@dataclass(frozen=True)
class Step:
    collective: str  # all_gather | all_reduce | reduce_scatter | all_to_all | send_recv
    mesh_dim: int
    bytes: float  # bytes of the tensor as this collective sees it (unsharded on mesh_dim)
    seconds: float


class Topology:
    def __init__(self, mesh_shape: tuple[int, ...], hw: Hardware):
        self.sizes = tuple(int(s) for s in mesh_shape)
        self.hw = hw
        self.intra: list[bool] = []
        for i, s in enumerate(self.sizes):
            stride = math.prod(self.sizes[i + 1 :])
            self.intra.append(stride * s <= hw.gpus_per_node)
        self.bandwidth = [hw.intra_node_bandwidth if a else hw.inter_node_bandwidth for a in self.intra]
        self.latency = [hw.intra_node_latency if a else hw.inter_node_latency for a in self.intra]
        self.fits = {(kind, k): (lat, spb) for kind, k, lat, spb in hw.collective_fits}

    def collective_time(self, kind: str, dim: int, nbytes: float, latency_share: float = 1.0) -> float:
        """Seconds of one collective; `latency_share` of its fixed latency is charged (a
        collective merged with others into one pays a share of one latency)."""
        if self.sizes[dim] <= 1 or nbytes <= 0:
            return 0.0
        # what a call costs inside a training step beyond its curve (cost/calibrate_step.py)
        in_step = self.hw.collective_step_overhead * latency_share
        latency, transfer = self._curve(kind, dim, nbytes, latency_share)
        return in_step + latency + transfer

    def _curve(self, kind: str, dim: int, nbytes: float, latency_share: float) -> tuple[float, float]:
        """(latency, transfer) seconds of the collective alone: the profile's fitted curve, else
        the formula."""
        k = self.sizes[dim]
        fit = self.fits.get((kind, k))
        if fit is not None:  # measured on this machine (cost/calibrate.py)
            return fit[0] * latency_share, fit[1] * nbytes
        if kind == "send_recv":  # each rank sends `nbytes` to one peer and receives as many
            return self.latency[dim] * latency_share, nbytes / self.bandwidth[dim]
        bw, lat = self.bandwidth[dim], self.latency[dim] * math.ceil(math.log2(k)) * latency_share
        frac = (k - 1) / k
        if kind == "all_reduce":
            return 2 * lat, 2 * frac * nbytes / bw
        if kind in ("all_gather", "reduce_scatter"):
            return lat, frac * nbytes / bw
        if kind == "all_to_all":
            return lat, frac * nbytes / k / bw
        raise ValueError(kind)


def transition(src: Placement, dst: Placement) -> str | None:
    """The collective that turns `src` into `dst` on one mesh dim (None: local or nothing)."""
    if src == dst:
        return None
    if isinstance(dst, Replicate):
        if isinstance(src, Shard):
            return "all_gather"
        if isinstance(src, Partial):
            return "all_reduce"
    if isinstance(dst, Shard):
        if isinstance(src, Replicate):
            return None  # a local slice
        if isinstance(src, Partial):
            return "reduce_scatter"
        if isinstance(src, Shard):
            return "all_to_all"
    if isinstance(dst, Partial):
        if isinstance(src, Replicate):
            return None  # zero on all but one rank
        if isinstance(src, Partial):
            return None if type(src) is type(dst) else "all_reduce"
        return "all_gather"
    return "all_gather"


def _merged(kind: str, k: int, last: int, gradient: bool) -> bool:
    """Whether the `k`-th of a redistribution's collectives (`last` the index of its last) is
    one `apply/bucket.py` merges with the rest of its block's: a parameter's first gather (a
    later one gathers the result of a collective, not a parameter shard), and a gradient's last
    reduce-scatter (an earlier one, or a gather after it, feeds another collective, not the
    gradient). A gradient's gathers and every all-reduce run alone."""
    if gradient:
        return kind == "reduce_scatter" and k == last
    return kind == "all_gather" and k == 0


def redistribute_steps(
    topo: Topology, numel: int, itemsize: int, src: tuple, dst: tuple, bucket: int = 1,
    gradient: bool = False,
) -> list[Step]:
    """The collectives, per mesh dim; with `bucket` > 1 the tensor is a parameter (or, with
    `gradient`, a parameter's gradient) moved together with `bucket` - 1 others of its block:
    the collective that `apply/bucket.py` merges pays 1/bucket of a latency (`_merged`)."""
    kinds = [(i, transition(s, d)) for i, (s, d) in enumerate(zip(src, dst))]
    kinds = [(i, kind) for i, kind in kinds if kind is not None]
    steps = []
    total = numel * itemsize
    for k, (i, kind) in enumerate(kinds):
        # the collective runs on the smallest view of the tensor: other dims sharded where
        # either side shards them (slices first, gathers last)
        shrink = 1
        for j, (sj, dj) in enumerate(zip(src, dst)):
            if j != i and (isinstance(sj, Shard) or isinstance(dj, Shard)):
                shrink *= topo.sizes[j]
        nbytes = total / shrink
        merged = bucket > 1 and _merged(kind, k, len(kinds) - 1, gradient)
        share = 1.0 / bucket if merged else 1.0
        steps.append(Step(kind, i, nbytes, topo.collective_time(kind, i, nbytes, share)))
    return steps


def redistribute_time(topo: Topology, numel: int, itemsize: int, src: tuple, dst: tuple,
                      bucket: int = 1, gradient: bool = False) -> float:
    if src == dst:
        return 0.0
    return sum(s.seconds for s in redistribute_steps(topo, numel, itemsize, src, dst, bucket,
                                                     gradient))
