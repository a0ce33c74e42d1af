"""Our own single-mesh-dim sharding rules, for ops DTensor has no strategy for.

Each rule takes the node and returns a list of single-dim strategies, each a list of placements:
first one per tensor output, then one per tensor input (the order DTensor's single-dim strategy
functions use). The all-Replicate strategy is always added by the caller.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx
from torch.distributed.tensor import Partial, Replicate, Shard

aten = torch.ops.aten

Rule = Callable[[fx.Node, int, int], list[list]]


def _attention_forward(node: fx.Node, n_out: int, n_in: int) -> list[list]:
    """CPU flash attention: q, k, v are (batch, heads, seq, head_dim); shard batch or heads."""
    # outputs: out (b,h,s,d), logsumexp (b,h,s); inputs: q, k, v (+ optional mask)
    rules = []
    for d in (0, 1):
        rules.append([Shard(d)] * n_out + [Shard(d)] * n_in)
    return rules


def _attention_backward(node: fx.Node, n_out: int, n_in: int) -> list[list]:
    """Backward of CPU flash attention: every tensor shares the batch or the head sharding."""
    return [[Shard(d)] * (n_out + n_in) for d in (0, 1)]


def _opaque_forward(node: fx.Node, n_out: int, n_in: int) -> list[list]:
    """An opaque block (e.g. an MoE with data-dependent routing) runs data-parallel only:
    activations sharded on the batch, its parameters replicated inside the block."""
    return [[Shard(0)] * n_out + [Shard(0)] + [Replicate()] * (n_in - 1)]


def _opaque_backward(node: fx.Node, n_out: int, n_in: int) -> list[list]:
    """Data-parallel backward of an opaque block: input gradient batch-sharded, parameter
    gradients partial sums; inputs are (grad_out, x, *params)."""
    outs = [Shard(0)] + [Partial()] * (n_out - 1)
    ins = [Shard(0), Shard(0)] + [Replicate()] * (n_in - 2)
    return [outs + ins]


def own_rules() -> dict[object, Rule]:
    rules: dict[object, Rule] = {
        aten._scaled_dot_product_flash_attention_for_cpu.default: _attention_forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _attention_backward,
    }
    ns = getattr(torch.ops, "titan_autopar", None)
    if ns is not None:
        for name, rule in (("opaque_forward", _opaque_forward), ("opaque_backward", _opaque_backward)):
            if hasattr(ns, name):
                rules[getattr(ns, name).default] = rule
    return rules
