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


SEQUENCE = 2  # q, k, v are (batch, heads, seq, head_dim); the log-sum-exp (batch, heads, seq)


def _attention_forward(node: fx.Node, n_out: int, n_in: int) -> list[list]:
    """Attention: shard the batch or the heads; or the sequence, as ring attention
    (`apply/ring_attention.py`), which a plan may choose on context-parallel dims only
    (`solve/problem.py`) and only without an explicit mask."""
    # outputs: out (b,h,s,d), logsumexp (b,h,s); inputs: q, k, v (+ optional mask)
    dims = (0, 1, SEQUENCE) if node.target in RING_OPS and n_in == 3 else (0, 1)
    return [[Shard(d)] * (n_out + n_in) for d in dims]


def _attention_backward(node: fx.Node, n_out: int, n_in: int) -> list[list]:
    """Backward of attention: every tensor shares the batch, head or (ring) sequence sharding.
    Inputs: grad, q, k, v, out, logsumexp (+ optional mask); outputs dq, dk, dv."""
    dims = (0, 1, SEQUENCE) if node.target in RING_OPS and n_in == 6 else (0, 1)
    return [[Shard(d)] * (n_out + n_in) for d in dims]


def sequence_dims(node: fx.Node, placements) -> list[int]:
    """Mesh dims on which `placements` (one per mesh dim, of the op's first tensor input) shard
    an attention op's sequence: it runs as ring attention there (empty for any other op)."""
    if node.target not in RING_OPS:
        return []
    return [m for m, p in enumerate(placements) if isinstance(p, Shard) and p.dim == SEQUENCE]


def is_causal(node: fx.Node) -> bool:
    """The `is_causal` argument of a CPU flash attention op (forward or backward)."""
    k = 7 if "backward" in str(node.target) else 4
    return bool(node.kwargs.get("is_causal", node.args[k] if len(node.args) > k else False))


def balanced(causal: bool, local_len: int, n: int) -> bool:
    """Whether ring attention on n ranks runs load-balanced (head-tail halves): causal, with a
    local sequence of even length (`apply/ring_attention.py`, priced by `cost/ring.py`)."""
    return causal and n > 1 and local_len % 2 == 0


# the attention ops a plan may run as ring attention (flex attention is planned, not run)
RING_OPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default}


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
