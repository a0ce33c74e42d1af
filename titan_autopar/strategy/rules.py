"""Our own single-mesh-dim sharding rules, for ops DTensor has no strategy for.

Each rule takes the node and returns a list of single-dim strategies, each a list of placements:
first one per tensor output, then one per tensor input (the order DTensor's single-dim strategy
functions use). The all-Replicate strategy is always added by the caller.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx
from torch.distributed.tensor import Shard

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


def own_rules() -> dict[object, Rule]:
    from titan_autopar.graph import attention

    rules: dict[object, Rule] = {
        aten._scaled_dot_product_flash_attention_for_cpu.default: _attention_forward,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default: _attention_backward,
        # flex attention (graph/attention.py): (q, k, v) -> out; (grad, q, k, v) -> (dq, dk, dv)
        attention.FORWARD: _attention_forward,
        attention.BACKWARD: _attention_backward,
    }
    return rules
