"""Joint forward+backward tracing on fake tensors.

Owns `trace_joint`: it turns a model (on meta, CPU or fake) and global-shaped sample inputs into
one aten-level FX graph of the training step -- the forward, then the backward that starts from
the gradient of the model's output (TorchTitan computes the loss outside the model, so that
gradient enters the graph as a placeholder, the *tangent*). Floating-point inputs are
differentiated too (a pipeline stage after the first sends its input's gradient back to the stage
before), integer inputs such as token ids are not. It also records, for every repeated
block (a child of an `nn.ModuleList` / `nn.ModuleDict`), which node ranges belong to its forward
and its backward, so that `graph/blocks.py` can share one decision among identical blocks.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx._lazy_graph_module import _use_lazy_graph_module
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx

from titan_autopar.graph.attention import flex_as_ops, flex_kwargs
from titan_autopar.graph.manual_ops import NAMESPACE, regions_as_ops


@dataclass
class BlockTrace:
    """Where one repeated block's nodes lie in the traced graph (positions in node order)."""

    name: str  # qualified module name, e.g. "layers.3"
    signature: str  # class + parameter names/shapes: blocks with equal signatures may share
    fwd: tuple[int, int] = (-1, -1)
    bwd: tuple[int, int] = (-1, -1)


@dataclass
class JointGraph:
    """The traced training step and what each placeholder/output stands for."""

    gm: fx.GraphModule
    param_names: list[str]
    buffer_names: list[str]
    num_inputs: int
    blocks: list[BlockTrace]
    manual_regions: dict  # qualified name -> graph.manual.Resolved
    output_shape: tuple[int, ...]
    seconds: float
    # filled from the graph
    param_nodes: dict[str, fx.Node] = field(default_factory=dict)
    buffer_nodes: dict[str, fx.Node] = field(default_factory=dict)
    input_nodes: list[fx.Node] = field(default_factory=list)
    tangent_node: fx.Node | None = None
    output_value: fx.Node | None = None  # the producer of the model output
    grad_nodes: dict[str, fx.Node | None] = field(default_factory=dict)  # param -> grad producer
    input_grad_nodes: dict[int, fx.Node] = field(default_factory=dict)  # float input -> grad
    # how it was made (`graph/stamp.py`): blocks traced and nodes traced where the graph was
    # stamped from a few blocks (None: traced whole), and why it was not stamped
    traced_blocks: int | None = None
    traced_nodes: int | None = None
    stamp_note: str = ""


def _block_containers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Children of every ModuleList/ModuleDict: the candidates for repeated blocks."""
    out = []
    for cname, mod in model.named_modules():
        if isinstance(mod, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            for child_name, child in mod.named_children():
                out.append((f"{cname}.{child_name}" if cname else child_name, child))
    return out


def _signature(block: torch.nn.Module) -> str:
    parts = [type(block).__name__]
    for n, p in block.named_parameters():
        parts.append(f"{n}:{tuple(p.shape)}:{p.dtype}")
    return "|".join(parts)


def _graph_len() -> int:
    mode = get_proxy_mode()
    return len(mode.tracer.graph.nodes) if mode is not None else -1


@contextlib.contextmanager
def _block_hooks(model: torch.nn.Module, blocks: list[BlockTrace]):
    """Forward hooks and gradient hooks that note where each block's nodes start and end."""
    handles = []
    by_name = {b.name: b for b in blocks}
    modules = dict(model.named_modules())

    def pre_hook(bt: BlockTrace):
        def hook(mod, args, kwargs):
            bt.fwd = (_graph_len(), -1)
            x = args[0] if args else None
            if isinstance(x, torch.Tensor) and x.requires_grad:
                def end_bwd(grad):
                    bt.bwd = (bt.bwd[0], _graph_len())
                x.register_hook(end_bwd)
        return hook

    def post_hook(bt: BlockTrace):
        def hook(mod, args, kwargs, out):
            bt.fwd = (bt.fwd[0], _graph_len())
            if isinstance(out, torch.Tensor) and out.requires_grad:
                def start_bwd(grad):
                    bt.bwd = (_graph_len(), bt.bwd[1])
                out.register_hook(start_bwd)
        return hook

    try:
        for name, bt in by_name.items():
            mod = modules[name]
            handles.append(mod.register_forward_pre_hook(pre_hook(bt), with_kwargs=True))
            handles.append(mod.register_forward_hook(post_hook(bt), with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


def _fake_like(fake_mode: FakeTensorMode, t: torch.Tensor) -> torch.Tensor:
    with fake_mode:
        return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")


def trace_joint(model: torch.nn.Module, sample_inputs: tuple[torch.Tensor, ...],
                param_dtype: torch.dtype | None = None, manual: dict | None = None) -> JointGraph:
    """Trace forward + backward of `model(*sample_inputs)` on fake tensors.

    The graph's placeholders are, in order: parameters, buffers, sample inputs, the tangent (the
    gradient of the model's output). Its outputs are the model output then one gradient per
    parameter, then one per floating-point input (`differentiable_inputs`), zeros where the
    output does not depend on it.

    `param_dtype` (mixed precision, e.g. bf16) computes with a cast of every floating-point
    parameter; the parameters and their gradients keep their own dtype (the cast's backward
    casts the gradient back), as with FSDP's `MixedPrecisionPolicy(param_dtype=...)`.

    `manual` (qualified name -> `graph.manual.Resolved`) lists the manual regions: each is
    traced as one `manual_forward` op and one `manual_backward` op (`graph/manual_ops.py`).
    TorchTitan's flex attention is traced as one op each way too (`graph/attention.py`).
    """
    t0 = time.perf_counter()
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    params = {n: _fake_like(fake_mode, p) for n, p in model.named_parameters()}
    buffers = {n: _fake_like(fake_mode, b) for n, b in model.named_buffers()}
    inputs = tuple(_fake_like(fake_mode, x) for x in sample_inputs)
    for p in params.values():
        p.requires_grad_(True)
    diff = differentiable_inputs(sample_inputs)
    for i in diff:
        inputs[i].requires_grad_(True)

    blocks = [BlockTrace(n, _signature(m)) for n, m in _block_containers(model)]
    manual = manual or {}
    kwargs = flex_kwargs(model)  # a flex-attention model asserts it is given a mask
    with regions_as_ops(model, manual), flex_as_ops(model):
        pnames = list(params)

        def joint(params, buffers, inputs):
            out = torch.func.functional_call(model, {**_cast(params, param_dtype), **buffers},
                                             inputs, kwargs)
            if not isinstance(out, torch.Tensor):
                raise TypeError(
                    f"the model returns {type(out).__name__}; the planner needs a model whose "
                    "forward returns one tensor (TorchTitan models return logits)")
            with torch.no_grad():
                tangent = tangent_of(out)  # becomes the graph's last placeholder, below
            needs = list(params.values()) + [inputs[i] for i in diff]
            grads = torch.autograd.grad(out, needs, tangent, allow_unused=True)
            # a parameter the output does not depend on gets an explicit zero gradient
            grads = [torch.zeros_like(p) if g is None else g for p, g in zip(needs, grads)]
            return (out, *grads)

        with _block_hooks(model, blocks), _use_lazy_graph_module(True):
            gm = make_fx(joint, tracing_mode="fake", _allow_non_fake_inputs=True)(
                params, buffers, inputs
            )
    out, at = _tangent_as_placeholder(gm)
    blocks = [_shifted(b, at) for b in blocks if b.fwd[0] >= 0 and b.fwd[1] >= 0]
    jg = JointGraph(
        gm=gm,
        param_names=pnames,
        buffer_names=list(buffers),
        num_inputs=len(inputs),
        blocks=blocks,
        manual_regions=dict(manual),
        output_shape=tuple(out.shape),
        seconds=0.0,
    )
    return joint_graph_of(jg, diff, t0)


def joint_graph_of(jg: JointGraph, diff: list[int], t0: float) -> JointGraph:
    """`jg` with what each placeholder and output stands for read from its graph (parameters,
    buffers, inputs and the tangent in that order; the model output, then one gradient per
    parameter and per differentiated input `diff`), and `seconds` since `t0`."""
    gm = jg.gm
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    np_, nb, ni = len(jg.param_names), len(jg.buffer_names), jg.num_inputs
    if len(placeholders) != np_ + nb + ni + 1:
        raise RuntimeError(
            f"traced graph has {len(placeholders)} placeholders, expected {np_ + nb + ni + 1}"
        )
    jg.param_nodes = dict(zip(jg.param_names, placeholders[:np_]))
    jg.buffer_nodes = dict(zip(jg.buffer_names, placeholders[np_ : np_ + nb]))
    jg.input_nodes = placeholders[np_ + nb : np_ + nb + ni]
    jg.tangent_node = placeholders[-1]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    flat = torch.utils._pytree.tree_leaves(output.args[0])
    jg.output_value = flat[0]
    grads = flat[1:]
    jg.grad_nodes = dict(zip(jg.param_names, grads[:np_]))
    jg.input_grad_nodes = dict(zip(diff, grads[np_:]))
    jg.seconds = time.perf_counter() - t0
    return jg


@torch.library.custom_op(f"{NAMESPACE}::tangent_of", mutates_args=())
def tangent_of(out: torch.Tensor) -> torch.Tensor:
    """Stands for the gradient of the model output while the step is traced: the graph's tangent
    placeholder takes its place (`_tangent_as_placeholder`). Creating it inside the trace spares a
    whole forward run only to learn the output's shape."""
    return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)


@tangent_of.register_fake
def _tangent_of_fake(out):
    return torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, device=out.device)


def _tangent_as_placeholder(gm: fx.GraphModule) -> tuple[torch.Tensor, int]:
    """Replace the traced `tangent_of` op by a placeholder after the others, named and described
    as a placeholder of the traced function would be; returns its value (the output's shape) and
    the op's position in node order."""
    graph = gm.graph
    ((at, op),) = [(i, n) for i, n in enumerate(graph.nodes) if n.op == "call_function"
                   and n.target is torch.ops.titan_autopar.tangent_of.default]
    first = next(n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(first):
        ph = graph.placeholder("tangent_1")
    ph.meta.update({k: op.meta[k] for k in ("val", "tensor_meta") if k in op.meta})
    op.replace_all_uses_with(ph)
    graph.erase_node(op)
    gm.recompile()  # lazy: the code is generated only if the module is ever called
    return ph.meta["val"], at


def _shifted(b: BlockTrace, at: int) -> BlockTrace:
    """`b` with positions noted before the tangent existed moved one on: the placeholder that
    replaced the op at `at` now stands before them."""
    def move(r):
        return tuple(p + 1 if 0 <= p <= at else p for p in r)
    b.fwd, b.bwd = move(b.fwd), move(b.bwd)
    return b


def _cast(params: dict, dtype: torch.dtype | None) -> dict:
    if dtype is None:
        return params
    return {n: p.to(dtype) if p.is_floating_point() and p.dtype != dtype else p
            for n, p in params.items()}


def differentiable_inputs(sample_inputs) -> list[int]:
    """Positions of the inputs the step differentiates: the floating-point ones."""
    return [i for i, x in enumerate(sample_inputs) if x.dtype.is_floating_point]
