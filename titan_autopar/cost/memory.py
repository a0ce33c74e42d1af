"""Per-rank memory of the training step.

Owns the four memory kinds the planner budgets -- parameters, gradients, optimizer state (AdamW:
two fp32 moments) and activations saved for backward -- and `saved_activations`, which finds the
forward values the backward reads (views are charged to the value they alias, parameters are
charged as parameters). Peak memory is modelled as all four held at once, the moment backward
starts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.fx as fx

from titan_autopar.cost.compute import VIEW_OPS


@dataclass(frozen=True)
class Precision:
    """Bytes per element of each kind (TorchTitan's default mixed precision: bf16 compute,
    fp32 parameters, gradients and AdamW state). Unless `exact_floats`, every floating-point
    activation or message is priced at `activation` bytes, the size bf16 compute would give."""

    activation: int = 2
    parameter: int = 4
    gradient: int = 4
    optimizer: int = 8  # two moments
    # a mixed-precision program (traced with its parameters cast, `plan_model(param_dtype=)`)
    # has its real dtypes in the graph: price every tensor at its own size (an fp32 weight
    # gathered before its bf16 cast costs twice the bytes)
    exact_floats: bool = False

    @property
    def per_parameter(self) -> int:
        return self.parameter + self.gradient + self.optimizer


def base_of(node: fx.Node) -> fx.Node:
    """Follow view ops to the value whose storage `node` aliases."""
    while node.op == "call_function" and node.target in VIEW_OPS and node.args:
        a = node.args[0]
        if not isinstance(a, fx.Node):
            break
        node = a
    return node


def saved_activations(gm: fx.GraphModule, backward_nodes: set[fx.Node]) -> set[fx.Node]:
    """Forward values (bases, not views; not placeholders) that some backward node reads."""
    saved = set()
    for n in gm.graph.nodes:
        if n in backward_nodes or n.op != "call_function":
            continue
        if any(u in backward_nodes for u in n.users):
            b = base_of(n)
            if b.op == "call_function":
                saved.add(b)
    return saved


def backward_nodes(gm: fx.GraphModule, tangent: fx.Node) -> set[fx.Node]:
    """Nodes that depend on the tangent: the backward pass."""
    bwd = {tangent}
    for n in gm.graph.nodes:
        if n.op == "call_function" and any(a in bwd for a in n.all_input_nodes):
            bwd.add(n)
    bwd.discard(tangent)
    return bwd
