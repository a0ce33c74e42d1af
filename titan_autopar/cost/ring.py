"""Prices of ring attention: attention whose sequence a plan shards over a context-parallel dim.

`apply/ring_attention.py` runs it. On a ring of n ranks, each rank:
  compute   n blocks of (seq/n)^2: its own chunk under the causal mask (half a block) and n-1
            full blocks (masked ones included: every rank runs the same program), i.e.
            (2n - 1) / n times the balanced share of causal attention's work
            (`RING_IMBALANCE`; 1 for non-causal attention)
  forward   n - 1 rotations of its keys and values (one send and one receive each)
  backward  n - 1 rotations of keys and values, and n of their two gradient accumulators
            (kept in fp32 where the compute dtype is narrower)
Each rotation is sent before the block it runs beside, so the transfers hide behind the
attention's own compute: exposed = max(0, transfers - compute).
"""

from __future__ import annotations

from torch.distributed.tensor import Shard

from titan_autopar.strategy.rules import RING_OPS, SEQUENCE, is_causal


def ring_dims(node, opts) -> list[int]:
    """Mesh dims on which `opts` (one option per dim) shard the attention op's sequence."""
    if node.target not in RING_OPS:
        return []
    return [m for m, o in enumerate(opts) if isinstance(o.ins[0], Shard) and o.ins[0].dim == SEQUENCE]


def ring_imbalance(node, n: int) -> float:
    """The ring's compute over a balanced split's (causal attention on a contiguous layout)."""
    return (2 * n - 1) / n if is_causal(node) else 1.0


def ring_transfer_seconds(node, topo, dim: int, kv_bytes: float, itemsize: int) -> float:
    """Seconds of the rotations one rank makes for one call of the op; `kv_bytes` is this
    rank's keys plus values."""
    n = topo.sizes[dim]
    one = topo.collective_time("send_recv", dim, kv_bytes)
    if "backward" not in str(node.target):
        return (n - 1) * one
    acc = topo.collective_time("send_recv", dim, kv_bytes * max(1.0, 4 / itemsize))
    return (n - 1) * one + n * acc
