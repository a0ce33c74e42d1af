"""Ring attention: causal attention on sequence shards, keys and values passed round a ring.

What a plan's sequence-sharded attention (`Shard(2)` of q, k, v on a context-parallel mesh dim,
`strategy/rules.py`) runs on each rank. Rank r of the ring's n ranks holds the r-th contiguous
chunk of the sequence of q, k and v (the placement's own layout). In n steps each rank sees
every rank's keys and values: step 0 its own (causal within the chunk), step t the chunk of rank
(r - t) mod n, passed on by a point-to-point rotation (`_functional_collectives.permute_tensor`,
recorded as an all-to-all with one peer). A chunk from an earlier rank is attended in full; one
from a later rank is masked out. Partial results are merged by their log-sum-exp, so the output
and log-sum-exp are those of single-device attention, to rounding.

The backward rotates the keys and values once more, with two accumulators for their gradients
that travel with them and arrive home after the last step; each block's gradient comes from the
attention op's own backward given the row's global output and log-sum-exp (exact for a block).

Every rank records the same ops and collectives in the same order (a masked block is computed
with probabilities forced to zero), so the program partitions and buckets as any other. The layout is not
load-balanced: the last rank's queries see every chunk and the first rank's only its own. The
price (`cost/ring.py`) charges the last rank's work.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol

from titan_autopar.apply.layout import laid_out_like

aten = torch.ops.aten
FORWARD = aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _rotate(x: torch.Tensor, group, n: int) -> torch.Tensor:
    """Each rank's `x` to the next rank of the ring (rank n-1's to rank 0)."""
    flat = funcol.permute_tensor(x.contiguous().view(-1), [(i + 1) % n for i in range(n)], group)
    return flat.view(x.shape)


def _visible(rank: int, step: int, n: int, causal: bool) -> bool:
    """Whether rank `rank`'s queries see the keys it holds at `step` (without a causal mask,
    every chunk; with one, a chunk from an earlier rank)."""
    return not causal or (rank - step) % n < rank


def ring_forward(q, k, v, scale, causal: bool, group, rank: int, n: int):
    """(out, logsumexp) of attention of this rank's sequence chunk over the whole ring. The next
    chunk's keys and values are sent on before this one's block is computed, so the transfer
    can run behind it."""
    acc = lse = first = None
    for step in range(n):
        if step < n - 1:
            k_next, v_next = _rotate(k, group, n), _rotate(v, group, n)
        o, s = FORWARD(q, k, v, 0.0, causal and step == 0, scale=scale)
        if acc is None:
            acc, lse, first = o.to(torch.promote_types(o.dtype, torch.float32)), s, o
        else:
            s = s + (0.0 if _visible(rank, step, n, causal) else float("-inf"))
            new = torch.logaddexp(lse, s)
            acc = (acc * torch.exp(lse - new).unsqueeze(-1)
                   + o.to(acc.dtype) * torch.exp(s - new).unsqueeze(-1))
            lse = new
        if step < n - 1:
            k, v = k_next, v_next
    return laid_out_like(acc.to(q.dtype), first), lse


def ring_backward(grad, q, k, v, out, lse, scale, causal: bool, group, rank: int, n: int):
    """(dq, dk, dv) of `ring_forward`, each for this rank's chunk."""
    wide = torch.promote_types(q.dtype, torch.float32)  # accumulate at least in fp32
    dq = dk = dv = first = None
    for step in range(n):
        if step < n - 1:
            k_next, v_next = _rotate(k, group, n), _rotate(v, group, n)
        # a masked block's probabilities exp(score - inf) are exactly 0, so are its gradients
        hide = lse if _visible(rank, step, n, causal) or step == 0 else lse + float("inf")
        gq, gk, gv = BACKWARD(grad, q, k, v, out, hide, 0.0, causal and step == 0, scale=scale)
        if dq is None:
            dq, dk, dv, first = gq.to(wide), gk.to(wide), gv.to(wide), (gq, gk, gv)
        else:
            dq, dk, dv = dq + gq.to(wide), dk + gk.to(wide), dv + gv.to(wide)
        # the gradients of the keys and values held now go on with them; after the last step
        # they reach the rank that owns them
        dk, dv = _rotate(dk, group, n), _rotate(dv, group, n)
        if step < n - 1:
            k, v = k_next, v_next
    # each in the memory order the kernel gives its own (the model may view them so)
    return tuple(laid_out_like(g.to(x.dtype), ref) for g, x, ref in zip((dq, dk, dv), (q, k, v), first))
