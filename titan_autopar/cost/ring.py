"""Prices of ring attention: attention whose sequence a plan shards over a context-parallel dim.

`apply/ring_attention.py` runs it. On a ring of n ranks, each rank:
  compute   load-balanced causal attention (head-tail halves; a local sequence of even length):
            the balanced share, 1/n of the work; otherwise (odd length) the contiguous ring,
            whose every rank runs n blocks of (seq/n)^2 -- its own chunk under the causal mask
            and n-1 full ones, masked ones included --, (2n - 1) / n times the balanced share
            (`ring_imbalance`; 1 for non-causal attention)
  forward   n - 1 rotations of its keys and values (one send and one receive each)
  backward  n - 1 rotations of keys and values, and n of their two gradient accumulators
            (kept in fp32 where the compute dtype is narrower)
  re-layout the balanced ring's all-to-alls into head-tail order and back: every input and
            output of the op moves once (`ring_relayout_seconds`), not hidden
Each rotation is sent before the block it runs beside, so the rotations hide behind the
attention's own compute: exposed = re-layout + max(0, rotations - compute).
"""

from __future__ import annotations

from titan_autopar.strategy.rules import RING_OPS, balanced, is_causal, sequence_dims


def ring_dims(node, opts) -> list[int]:
    """Mesh dims on which `opts` (one option per dim) shard the attention op's sequence."""
    if node.target not in RING_OPS:  # most ops; and a placeholder's options have no inputs
        return []
    return sequence_dims(node, [o.ins[0] for o in opts])


def ring_imbalance(node, n: int, local_len: int) -> float:
    """The ring's compute over a balanced split's: 1 for the load-balanced ring and for
    non-causal attention; (2n - 1) / n for causal attention on contiguous chunks."""
    if not is_causal(node) or balanced(True, local_len, n):
        return 1.0
    return (2 * n - 1) / n


def ring_relayout_seconds(node, topo, dim: int, local_len: int, op_bytes: float) -> float:
    """Seconds of the balanced ring's re-layout: `op_bytes` (this rank's inputs and outputs of
    the op) through one-peer exchanges; 0 where the ring runs unbalanced."""
    if not balanced(is_causal(node), local_len, topo.sizes[dim]):
        return 0.0
    return topo.collective_time("send_recv", dim, op_bytes)


def ring_transfer_seconds(node, topo, dim: int, kv_bytes: float, itemsize: int) -> float:
    """Seconds of the rotations one rank makes for one call of the op; `kv_bytes` is this
    rank's keys plus values."""
    n = topo.sizes[dim]
    one = topo.collective_time("send_recv", dim, kv_bytes)
    if "backward" not in str(node.target):
        return (n - 1) * one
    acc = topo.collective_time("send_recv", dim, kv_bytes * max(1.0, 4 / itemsize))
    return (n - 1) * one + n * acc
