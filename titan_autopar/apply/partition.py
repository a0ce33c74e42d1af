"""Split one rank's joint program into a forward graph and a backward graph.

The joint program takes (parameters, buffers, inputs, tangent) and returns (output, *gradients).
- forward:   (parameters, buffers, inputs) -> (output, *saved): every node the output needs
  (and the tuple items of those nodes), nothing else;
- backward:  (*saved, tangent) -> gradients: every other node the gradients need;
- inference: (parameters, buffers, inputs) -> output, for forwards under `torch.no_grad()`.

`saved` are the forward values the backward reads. With `recompute_parameters` (the default)
a forward value computed from parameters and buffers alone -- a gathered weight, its transpose,
its cast -- is not saved but computed again in the backward from the parameter shard, exactly as
FSDP frees gathered weights after the forward and gathers them again for the backward.
With activation checkpointing (`checkpointing` = "full" or "selective", see
`graph/recompute.py`) the values inside each block are computed again the same way. Every
recomputed value is placed just before its first reader in the backward, so one block's
recomputed activations (and gathered weights) are alive at a time.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch.fx as fx

from titan_autopar.apply.interpret import BLOCK_TAG
from titan_autopar.graph.recompute import recomputable


@dataclass
class Split:
    forward: fx.GraphModule
    backward: fx.GraphModule
    inference: fx.GraphModule
    saved: list[str]  # names, in the joint graph, of the values the forward keeps for backward
    recomputed: list[str]  # names of forward values the backward computes again


def _ancestors(roots) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = [r for r in roots if isinstance(r, fx.Node)]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


def _graph(gm: fx.GraphModule, placeholders, body, outputs, names=None, order=None) -> fx.GraphModule:
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    for i, p in enumerate(placeholders):
        env[p] = g.placeholder(names[i] if names else p.name)
        env[p].meta = dict(p.meta)
    for n in (order if order is not None else gm.graph.nodes):
        if n in body:
            env[n] = g.node_copy(n, lambda a: env[a])
    g.output(tuple(env[o] for o in outputs))
    g.lint()
    return fx.GraphModule(gm, g)


def _lazy_order(gm: fx.GraphModule, bwd: set[fx.Node], recomputed: set[fx.Node]) -> list[fx.Node]:
    """The backward's nodes in program order, each recomputed value placed just before its
    first reader (so a block's values are recomputed when that block's backward runs)."""
    order: list[fx.Node] = []
    done: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n not in bwd or n in recomputed:
            continue
        stack = [(n, False)]
        while stack:
            x, ready = stack.pop()
            if x in done:
                continue
            if ready:
                done.add(x)
                order.append(x)
                continue
            stack.append((x, True))
            stack.extend((a, False) for a in reversed(x.all_input_nodes)
                         if a in recomputed and a not in done)
    return order


def split_joint(gm: fx.GraphModule, n_state: int, *, recompute_parameters: bool = True,
                checkpointing: str = "none") -> Split:
    """`n_state` = number of parameter and buffer placeholders (they come first);
    `checkpointing` is an activation checkpointing mode of `graph/recompute.py`."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    tangent = phs[-1]
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    results = list(out_node.args[0])
    out_v, grads = results[0], results[1:]

    state_only: set[fx.Node] = set(phs[:n_state])  # depends on parameters/buffers alone
    for n in gm.graph.nodes:
        if n.op in ("call_function", "get_attr") and all(a in state_only for a in n.all_input_nodes):
            state_only.add(n)

    infer = _ancestors([out_v]) - set(phs)
    fwd = set(infer)
    for n in gm.graph.nodes:  # keep tuple items beside their producer
        if n.op == "call_function" and n.target is operator.getitem and n.args[0] in fwd:
            fwd.add(n)

    need = _ancestors(grads) - set(phs)
    bwd = need - fwd
    # in program order (not set order): selective keeps every other matmul, which must be the
    # same matmuls on every rank
    again = recomputable({n: n.meta[BLOCK_TAG] for n in gm.graph.nodes
                          if n in fwd and BLOCK_TAG in n.meta},
                         set(gm.graph.nodes) - fwd, checkpointing)
    if recompute_parameters:
        again |= state_only
    recomputed: set[fx.Node] = set()
    work = list(bwd)
    while work:
        n = work.pop()
        for a in n.all_input_nodes:
            if a in fwd and a in again and a.op != "placeholder" and a not in recomputed:
                recomputed.add(a)
                work.append(a)
    bwd |= recomputed

    saved: list[fx.Node] = []
    seen: set[fx.Node] = set()
    for n in gm.graph.nodes:
        if n not in bwd:
            continue
        for a in n.all_input_nodes:
            if a in bwd or a is tangent or a in seen:
                continue
            seen.add(a)
            saved.append(a)
    for g in grads:  # a gradient the forward already has (rare) is saved too
        if g not in bwd and g not in seen and g is not tangent:
            seen.add(g)
            saved.append(g)

    forward = _graph(gm, phs[:-1], fwd, [out_v, *saved])
    backward = _graph(gm, [*saved, tangent], bwd, grads,
                      names=[f"saved_{s.name}" for s in saved] + [tangent.name],
                      order=_lazy_order(gm, bwd, recomputed))
    inference = _graph(gm, phs[:-1], infer, [out_v])
    return Split(forward, backward, inference, [s.name for s in saved],
                 sorted(n.name for n in recomputed))
