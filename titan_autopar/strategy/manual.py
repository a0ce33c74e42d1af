"""The options of a manual region's ops: exactly what the region declares, one per mesh dim.

A region's forward op takes its inputs and parameters and gives its outputs in the declared
placements; its backward op takes the outputs' gradients, the inputs and the parameters the same
way and gives each input's gradient in that input's placement and each parameter's gradient
where the region leaves it (`graph/manual.grad_placement`: sharded stays sharded, a whole
parameter used on sharded data is a partial sum). There is nothing to choose inside a region:
each mesh dim gets the option its declaration implies, and the planner prices the moves into and
out of it. (A built-in style may leave the tokens' placement open on dims other than ep: there
the planner picks data-parallel or replicated, for the inputs and outputs alike.)

`region_options(node, resolved)` returns the distinct single-dim options, each as (output
placements, input placements), and, per mesh dim, which of them that dim may take.
"""

from __future__ import annotations

import torch.fx as fx
from torch.distributed.tensor import Replicate, Shard

from titan_autopar.graph.manual import Resolved, grad_placement
from titan_autopar.graph.manual_ops import FORWARD


def _is_float(a) -> bool:
    v = a.meta.get("val") if isinstance(a, fx.Node) else None
    return v is not None and v.is_floating_point()


def region_options(node: fx.Node, r: Resolved) -> tuple[list[tuple], list[list[int]]]:
    ndim = len(r.ins[0])
    uses = [r.param_use(n) for n in r.params]
    forward = node.target is FORWARD
    inputs = node.args[0] if forward else node.args[1]
    floats = [_is_float(a) for a in inputs]
    options: list[tuple] = []
    per_dim: list[list[int]] = []
    for m in range(ndim):
        allowed = []
        for data in _token_choices(r, m):
            ins_m = [data if t[m] is None else t[m] for t in r.ins]
            outs_m = [data if t[m] is None else t[m] for t in r.outs]
            use_m = [u[m] for u in uses]
            if forward:
                opt = (tuple(outs_m), tuple(ins_m + use_m))
            else:
                sharded = [p for p, f in zip(ins_m, floats) if f]
                grads = [grad_placement(u, sharded) for u in use_m]
                opt = (tuple(ins_m + grads), tuple(outs_m + ins_m + use_m))
            if opt not in options:
                options.append(opt)
            allowed.append(options.index(opt))
        per_dim.append(allowed)
    return options, per_dim


def _token_choices(r: Resolved, m: int) -> list:
    """Where a built-in style leaves the tokens' placement on dim m open (None), the planner may
    give every rank all of them (Replicate) or split them (Shard(0), data-parallel)."""
    if any(t[m] is None for t in (*r.ins, *r.outs)):
        return [Replicate(), Shard(0)]
    return [None]
