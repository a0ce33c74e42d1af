"""A manual region's declaration held against the tensors it is called with.

`manual()` is given placements before any tensor exists; only when the traced forward calls the
region (`graph/manual_ops.py`) are its inputs' and parameters' shapes known. `check_call`
then refuses, naming the region, a declaration the planner could not keep: a number of
`in_placements` other than the number of tensors the forward receives, a Shard of a dim a
tensor does not have, or a Shard the mesh dim does not divide evenly (every rank's local shard
must have the same shape, since the region's code and the program around it are built for one).
Each output has the shape of the input at the same position (the first where there are fewer).
"""

from __future__ import annotations

import math

from torch.distributed.tensor import Shard

from titan_autopar.graph.manual import ManualRegionError, Resolved


def check_call(r: Resolved, module, args, params) -> None:
    """Refuse a declaration of region `r` that the tensors `args` and the module's `params`
    (name -> tensor) cannot take; see the module docstring."""
    where = f"manual region {r.name!r} ({type(module).__name__})"
    if len(args) != len(r.ins):
        raise ManualRegionError(
            f"{where} declares {len(r.ins)} in_placements, but its forward is called with "
            f"{len(args)} tensor input{'s' if len(args) != 1 else ''}: give one in_placements "
            "entry per tensor input, in the order the forward takes them")
    names = [n for n, _ in r.mesh]
    sizes = [k for _, k in r.mesh]
    tensors = [(f"in_placements[{i}]", f"input {i}", x, pl) for i, (x, pl)
               in enumerate(zip(args, r.ins))]
    tensors += [(f"out_placements[{j}]", f"output {j}", args[min(j, len(args) - 1)], pl)
                for j, pl in enumerate(r.outs)]
    tensors += [(f"param_placements[{n!r}]", f"parameter {n}", params[n], pl)
                for n, pl in r.params.items() if n in params]
    for what, tensor, x, pl in tensors:
        shape = tuple(x.shape)
        ways: dict[int, list[tuple[str, int]]] = {}
        for p, n, k in zip(pl, names, sizes):
            if not isinstance(p, Shard):
                continue
            if p.dim >= len(shape):
                raise ManualRegionError(
                    f"{where}: {what} puts Shard({p.dim}) on {n!r}, but {tensor} has "
                    f"{len(shape)} dims (shape {shape}): shard a dim from 0 to "
                    f"{len(shape) - 1}, or Replicate()")
            if k > 1:
                ways.setdefault(p.dim, []).append((n, k))
        for d, over in ways.items():
            w = math.prod(k for _, k in over)
            if shape[d] % w:
                on = ", ".join(f"{n}={k}" for n, k in over)
                raise ManualRegionError(
                    f"{where}: {what} shards dim {d} of {tensor} (shape {shape}) over {on}, "
                    f"whose {w} ranks do not divide its size {shape[d]}: declare a dim that "
                    f"{w} divides (or Replicate()), or give a size that is a multiple of {w}")
