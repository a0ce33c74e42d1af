"""Opaque regions in traced graphs: MoE blocks as single custom ops.

This module owns the mechanism that lets the planner trace TorchTitan MoE
models.  The token routing inside an MoE block is data dependent
(``torch.histc`` on int64 expert indices, ``argsort``, grouped matmuls with
data-dependent offsets, ``.tolist()`` in the for-loop expert path), so a fake
tensor ``make_fx`` trace of the joint forward+backward graph fails inside it.

While :func:`opaque_moe_blocks` is active, each MoE block instance runs as
one call to the custom op ``titan_autopar::opaque_forward`` in the forward
pass and one call to ``titan_autopar::opaque_backward`` in the backward pass.
Those ops have fake (shape-only) implementations, so tracing works; the
parameter gradients of the block come out of ``opaque_backward`` (through
``getitem``).  On real tensors the ops call the *runner* registered under
their ``name`` with :func:`register_runner` (``apply/opaque_run.py`` registers
one per block of a program built by ``apply_plan``; the registry holds it
weakly, so it lives as long as that program).  With no runner they raise
``NotImplementedError``.

Op schemas (parameters are passed in :func:`opaque_param_names` order, and
``name`` is the block's qualified module name in the model):

* ``titan_autopar::opaque_forward(Tensor x, Tensor[] params, str name) -> Tensor``
  returns a tensor with the shape and dtype of ``x`` (MoE blocks map
  ``(bs, slen, dim)`` to ``(bs, slen, dim)``).
* ``titan_autopar::opaque_backward(Tensor grad_out, Tensor x, Tensor[] params, str name) -> Tensor[]``
  returns ``[grad_x, *grad_params]`` with the shapes of ``x`` and ``params``.

Only parameters are op inputs.  The block's buffers (``expert_bias``, which
steers routing, and ``tokens_per_expert``, which the real forward updates in
place for load balancing) do not appear in the traced graph.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

__all__ = [
    "OPAQUE_NAMESPACE",
    "opaque_backward",
    "opaque_forward",
    "find_moe_blocks",
    "is_moe_block",
    "opaque_moe_blocks",
    "opaque_param_names",
    "register_runner",
]

OPAQUE_NAMESPACE = "titan_autopar"

_RUNNERS: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


def register_runner(name: str, runner: Any) -> None:
    """Run opaque region `name` with `runner.forward(x, params)` and
    `runner.backward(grad_out, x, params)` (held weakly)."""
    _RUNNERS[name] = runner


def _runner(name: str) -> Any:
    r = _RUNNERS.get(name)
    if r is None:
        raise NotImplementedError(
            f"opaque region {name!r} runs only inside a program built by apply_plan"
        )
    return r


# --------------------------------------------------------------------------
# Custom ops
# --------------------------------------------------------------------------


@torch.library.custom_op(f"{OPAQUE_NAMESPACE}::opaque_forward", mutates_args=())
def opaque_forward(
    x: torch.Tensor, params: Sequence[torch.Tensor], name: str
) -> torch.Tensor:
    """Forward of the opaque region ``name``; output has ``x``'s shape and dtype."""
    return _runner(name).forward(x, list(params))


@opaque_forward.register_fake
def _opaque_forward_fake(
    x: torch.Tensor, params: Sequence[torch.Tensor], name: str
) -> torch.Tensor:
    return x.new_empty(x.shape)


@torch.library.custom_op(f"{OPAQUE_NAMESPACE}::opaque_backward", mutates_args=())
def opaque_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    params: Sequence[torch.Tensor],
    name: str,
) -> list[torch.Tensor]:
    """Backward of the opaque region ``name``: ``[grad_x, *grad_params]``."""
    return _runner(name).backward(grad_out, x, list(params))


@opaque_backward.register_fake
def _opaque_backward_fake(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    params: Sequence[torch.Tensor],
    name: str,
) -> list[torch.Tensor]:
    return [x.new_empty(x.shape)] + [p.new_empty(p.shape) for p in params]


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
    x, params, name = inputs
    ctx.save_for_backward(x, *params)
    ctx.name = name
    ctx.num_params = len(params)


def _backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
    x, *params = ctx.saved_tensors
    grads = torch.ops.titan_autopar.opaque_backward(grad_out, x, params, ctx.name)
    grad_x, grad_params = grads[0], list(grads[1:])
    if len(grad_params) != ctx.num_params:
        raise RuntimeError(
            f"opaque_backward for {ctx.name!r} returned {len(grad_params)} "
            f"parameter gradients, expected {ctx.num_params}"
        )
    return grad_x, grad_params, None


opaque_forward.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------
# MoE detection and patching
# --------------------------------------------------------------------------


def _titan_moe_class() -> type | None:
    try:
        from torchtitan.models.moe import MoE
    except Exception:  # torchtitan absent or broken: fall back to class names
        return None
    return MoE


def is_moe_block(module: nn.Module) -> bool:
    """True for TorchTitan's MoE class (and subclasses, e.g. DeepEPMoE,
    GptOssMoE) and for any module with a class named ``MoE`` in its MRO."""
    moe_cls = _titan_moe_class()
    if moe_cls is not None and isinstance(module, moe_cls):
        return True
    return any(c.__name__ == "MoE" for c in type(module).__mro__)


def opaque_param_names(block: nn.Module) -> list[str]:
    """Names (relative to ``block``) of the parameters passed to the opaque
    ops, in order: the ``named_parameters()`` order of the block."""
    return [n for n, _ in block.named_parameters()]


def find_moe_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Outermost MoE blocks of ``model`` in ``named_modules`` order."""
    found: list[tuple[str, nn.Module]] = []
    for qname, mod in model.named_modules():
        if any(qname == p or qname.startswith(p + ".") for p, _ in found):
            continue  # nested inside a block already made opaque
        if is_moe_block(mod):
            found.append((qname, mod))
    return found


def _make_opaque_forward(block: nn.Module, qname: str):
    def forward(*args: Any, **kwargs: Any) -> torch.Tensor:
        if len(args) != 1 or kwargs or not isinstance(args[0], torch.Tensor):
            raise TypeError(
                f"opaque MoE block {qname!r} ({type(block).__name__}) expects "
                f"exactly one tensor argument, got {len(args)} positional "
                f"and {sorted(kwargs)} keyword arguments"
            )
        # Parameters are read at call time so that tensors swapped in by
        # torch.func.functional_call (or a parametrization) are used.
        params = [p for _, p in block.named_parameters()]
        return torch.ops.titan_autopar.opaque_forward(args[0], params, qname)

    return forward


_MISSING = object()


@contextlib.contextmanager
def opaque_moe_blocks(model: torch.nn.Module) -> Iterator[list[str]]:
    """While active, every MoE block of `model` (TorchTitan's torchtitan.models.moe MoE module class, and any module whose class name is 'MoE') runs as ONE opaque op in traces; yields the list of qualified module names so treated (e.g. ['layers.1.moe', ...]).

    Only the ``forward`` of the block *instances* is replaced (by an
    instance attribute); the class is untouched, module hooks still run, and
    the previous state is restored on exit, also when the body raises.
    A block nested in another MoE block is covered by the outer one.
    """
    blocks = find_moe_blocks(model)
    saved: list[tuple[nn.Module, Any]] = []
    try:
        for qname, block in blocks:
            saved.append((block, block.__dict__.get("forward", _MISSING)))
            block.forward = _make_opaque_forward(block, qname)
        yield [qname for qname, _ in blocks]
    finally:
        for block, prev in reversed(saved):
            if prev is _MISSING:
                block.__dict__.pop("forward", None)
            else:
                block.forward = prev
