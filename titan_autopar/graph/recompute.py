"""Activation checkpointing: which forward values the backward computes again instead of keeping.

TorchTitan's `[activation_checkpoint] mode` names a policy; under auto it is honoured here, one
rule for the planner's prices (on the joint graph) and for the program (on each rank's graph):

- "none": every forward value the backward reads is kept;
- "full": inside each repeated block (a transformer layer), only what leaves the block is kept;
  everything else the backward needs is computed again from it, block by block;
- "selective": as "full", but the outputs of matrix products and attention (the expensive ops)
  are kept too -- the spirit of TorchTitan's op-level selective policy.

`recomputable(nodes_by_block, bwd, mode)` returns the forward nodes to compute again; a node is
in a block when the block's forward produced it. Collectives inside a block are recomputed with
it, as TorchTitan's checkpointing re-runs a layer's tensor-parallel communication.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

MODES = ("none", "selective", "full")

aten = torch.ops.aten
KEPT_BY_SELECTIVE = {
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.linear.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"activation checkpointing mode {mode!r} is not known: use one of "
                         f"{', '.join(MODES)}")
    return mode


def _kept(n: fx.Node) -> bool:
    if n.target is operator.getitem:
        n = n.args[0]
    return n.target in KEPT_BY_SELECTIVE


def recomputable(block_of: dict[fx.Node, str], bwd: set[fx.Node], mode: str) -> set[fx.Node]:
    """Forward nodes (keys of `block_of`, each with its block's name) that `mode` recomputes:
    those whose every forward user is in the same block (what leaves a block is kept)."""
    if check_mode(mode) == "none":
        return set()
    out = set()
    for n, block in block_of.items():
        if n in bwd or n.op != "call_function" or (mode == "selective" and _kept(n)):
            continue
        if all(u in bwd or block_of.get(u) == block for u in n.users):
            out.add(n)
    return out


def blocks_by_position(gm: fx.GraphModule, blocks) -> dict[fx.Node, str]:
    """Node -> block name for the joint graph, from the traced forward ranges (node positions)."""
    owner: dict[int, str] = {}
    for b in blocks:
        for i in range(*b.fwd):
            owner[i] = b.name
    return {n: owner[i] for i, n in enumerate(gm.graph.nodes) if i in owner}
