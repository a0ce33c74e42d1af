"""Activation checkpointing: which forward values the backward computes again instead of keeping.

TorchTitan's `[activation_checkpoint] mode` names a policy; under auto it is honoured here, one
rule for the planner's prices (on the joint graph) and for the program (on each rank's graph):

- "none": every forward value the backward reads is kept;
- "full": inside each repeated block (a transformer layer), only what leaves the block is kept;
  everything else the backward needs is computed again from it, block by block;
- "selective": as "full", but attention's outputs and every other matrix product's output
  (the 1st, 3rd, ... of each block) are kept too, as TorchTitan's op-level selective policy does.

`recomputable(nodes_by_block, bwd, mode)` returns the forward nodes to compute again; a node is
in a block when the block's forward produced it. Collectives inside a block are recomputed with
it, as TorchTitan's checkpointing re-runs a layer's tensor-parallel communication.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from titan_autopar.graph.attention import FORWARD as FLEX_ATTENTION

MODES = ("none", "selective", "full")

aten = torch.ops.aten
MATMULS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.linear.default}
ATTENTION = {
    FLEX_ATTENTION,  # graph/attention.py
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



def _kept_by_selective(block_of: dict[fx.Node, str]) -> set[fx.Node]:
    """Attention outputs, and each block's 1st, 3rd, 5th ... matrix product (node order)."""
    kept, seen = set(), {}
    for n, block in block_of.items():
        if n.target in MATMULS:
            k = seen[block] = seen.get(block, -1) + 1
            if k % 2 == 0:
                kept.add(n)
        elif n.target in ATTENTION:
            kept.add(n)
    kept |= {n for n in block_of if n.target is operator.getitem and n.args[0] in kept}
    return kept


def recomputable(block_of: dict[fx.Node, str], bwd: set[fx.Node], mode: str) -> set[fx.Node]:
    """Forward nodes (keys of `block_of`, each with its block's name) that `mode` recomputes:
    those whose every forward user is in the same block (what leaves a block is kept)."""
    if check_mode(mode) == "none":
        return set()
    out = set()
    kept = _kept_by_selective({n: b for n, b in block_of.items() if n not in bwd}) \
        if mode == "selective" else set()
    for n, block in block_of.items():
        if n in bwd or n.op != "call_function" or n in kept:
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
