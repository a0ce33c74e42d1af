"""Manual regions in traced graphs: each region call becomes one op in the forward and one in
the backward.

While `regions_as_ops(model, resolved)` is active, every manual region (see `graph/manual.py`)
runs as one call of `titan_autopar::manual_forward`; its gradient is one call of
`titan_autopar::manual_backward`. Both have shape-only (fake) implementations, so the joint
forward+backward trace goes through regions whose code is data-dependent (MoE routing) or
issues its own collectives. Real tensors never reach these ops: a built program
(`apply/regions_run.py`) replaces their nodes by calls of the region's own code.

  manual_forward(Tensor[] inputs, Tensor[] params, str name, int[] out_sizes, int[] out_ranks)
      -> Tensor[]
  manual_backward(Tensor[] grad_outputs, Tensor[] inputs, Tensor[] params, str name)
      -> Tensor[]  (one gradient per input, then one per parameter)

Outputs are described by `out_sizes` (their shapes, concatenated) and `out_ranks` (each
shape's length); output j takes the dtype of input j (input 0 where there are fewer inputs). In
the global trace the shapes mirror the inputs'; in a rank's program they are the local shards
the region's declared out_placements imply, which the region's code is held to at run time.
Parameters are passed in the module's `named_parameters()` order; buffers are not op inputs
(a MoE block's routing buffers stay the module's own).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from titan_autopar.graph.manual_checks import check_call

NAMESPACE = "titan_autopar"


def split_sizes(out_sizes: Sequence[int], out_ranks: Sequence[int]) -> list[tuple[int, ...]]:
    shapes, i = [], 0
    for r in out_ranks:
        shapes.append(tuple(int(s) for s in out_sizes[i:i + r]))
        i += r
    return shapes


def flat_sizes(shapes) -> tuple[list[int], list[int]]:
    return [int(s) for sh in shapes for s in sh], [len(sh) for sh in shapes]


def _out_dtype(inputs, j):
    return inputs[min(j, len(inputs) - 1)].dtype


@torch.library.custom_op(f"{NAMESPACE}::manual_forward", mutates_args=())
def manual_forward(inputs: Sequence[torch.Tensor], params: Sequence[torch.Tensor], name: str,
                   out_sizes: Sequence[int], out_ranks: Sequence[int]) -> list[torch.Tensor]:
    raise NotImplementedError(f"manual region {name!r} runs only inside a program built by "
                              "apply_plan")


@manual_forward.register_fake
def _forward_fake(inputs, params, name, out_sizes, out_ranks):
    return [inputs[0].new_empty(shape, dtype=_out_dtype(inputs, j))
            for j, shape in enumerate(split_sizes(out_sizes, out_ranks))]


@torch.library.custom_op(f"{NAMESPACE}::manual_backward", mutates_args=())
def manual_backward(grad_outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                    params: Sequence[torch.Tensor], name: str) -> list[torch.Tensor]:
    raise NotImplementedError(f"manual region {name!r} runs only inside a program built by "
                              "apply_plan")


@manual_backward.register_fake
def _backward_fake(grad_outputs, inputs, params, name):
    return [x.new_empty(x.shape) for x in inputs] + [p.new_empty(p.shape) for p in params]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output) -> None:
    xs, params, name, out_sizes, out_ranks = inputs
    ctx.save_for_backward(*xs, *params)
    ctx.n_in, ctx.name = len(xs), name
    ctx.out_shapes = split_sizes(out_sizes, out_ranks)
    ctx.out_dtypes = [_out_dtype(xs, j) for j in range(len(out_ranks))]


def _backward(ctx: Any, grads) -> tuple[Any, ...]:
    saved = ctx.saved_tensors
    xs, params = list(saved[:ctx.n_in]), list(saved[ctx.n_in:])
    grads = [g if g is not None else xs[0].new_zeros(s, dtype=d)
             for g, s, d in zip(grads, ctx.out_shapes, ctx.out_dtypes)]
    out = torch.ops.titan_autopar.manual_backward(grads, xs, params, ctx.name)
    gx = [g if x.is_floating_point() else None for g, x in zip(out[:ctx.n_in], xs)]
    return gx, list(out[ctx.n_in:]), None, None, None


manual_forward.register_autograd(_backward, setup_context=_setup_context)

FORWARD = torch.ops.titan_autopar.manual_forward.default
BACKWARD = torch.ops.titan_autopar.manual_backward.default
OPS = {FORWARD, BACKWARD}


def region_name(node) -> str:
    """The region a manual_forward / manual_backward node belongs to."""
    return node.args[2] if node.target is FORWARD else node.args[3]


def _as_op(module: nn.Module, qname: str, r):
    n_out = r.n_out

    def forward(*args: Any, **kwargs: Any):
        if kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args):
            raise TypeError(
                f"manual region {qname!r} ({type(module).__name__}) is called with "
                f"{len(args)} positional and {sorted(kwargs)} keyword arguments; a manual "
                "region takes tensors as positional arguments only")
        # parameters are read at call time: functional_call swaps them in
        named = dict(module.named_parameters())
        check_call(r, module, args, named)
        params = list(named.values())
        shapes = [args[min(j, len(args) - 1)].shape for j in range(n_out)]
        sizes, ranks = flat_sizes(shapes)
        outs = torch.ops.titan_autopar.manual_forward(list(args), params, qname, sizes, ranks)
        return outs[0] if n_out == 1 else tuple(outs)

    return forward


_MISSING = object()


@contextlib.contextmanager
def regions_as_ops(model: nn.Module, resolved: dict) -> Iterator[list[str]]:
    """While active, each region in `resolved` (qualified name -> `Resolved`) runs as one op in
    traces. Only the instances' `forward` is replaced; it is restored on exit."""
    saved: list[tuple[nn.Module, Any]] = []
    try:
        for qname, r in resolved.items():
            block = model.get_submodule(qname)
            saved.append((block, block.__dict__.get("forward", _MISSING)))
            block.forward = _as_op(block, qname, r)
        yield list(resolved)
    finally:
        for block, prev in reversed(saved):
            if prev is _MISSING:
                block.__dict__.pop("forward", None)
            else:
                block.forward = prev
