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

Causal attention is load-balanced as TorchTitan's CP balances it (head-tail): the sequence is
cut in 2n half-chunks and rank r works on half-chunks r and 2n-1-r, so every rank has the same
work. The plan's own layout stays contiguous (rank r holds half-chunks 2r and 2r+1); the ring
re-lays q, k, v (and, in the backward, the gradient, output and log-sum-exp) out head-tail with
one all-to-all each on entry, and its results back on exit (`_relayout`). In head-tail order the
local sequence is increasing, so step 0 is causal attention on the local chunk; at step t > 0,
with the keys of rank j, the visible blocks are always two half-by-half blocks:
  second query half x first key half   (always: 2n-1-r >= n > j)
  first x first if j < r, else second x second
so each rank computes the same amount and the same ops, only which halves differ. A local
sequence of odd length, or non-causal attention, runs the plain ring on contiguous chunks
(`balanced`), where a masked block is computed with probabilities forced to zero.

Every rank records the same ops and collectives in the same order, so the program partitions and
buckets as any other. Results come out contiguous; the caller lays them out as the kernel would
have (`apply/layout.py`). The price (`cost/ring.py`) follows the same choice.
"""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol

from titan_autopar.strategy.rules import balanced

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


def _layouts(n: int):
    """Half-chunks each rank holds, in order: contiguous, and head-tail."""
    return ([[2 * r, 2 * r + 1] for r in range(n)], [[r, 2 * n - 1 - r] for r in range(n)])


def _relayout(x: torch.Tensor, group, rank: int, n: int, to_headtail: bool) -> torch.Tensor:
    """`x` (this rank's sequence chunk on dim 2) moved from the contiguous layout to head-tail,
    or back: one all-to-all of half-chunks (each rank sends two, to at most two peers)."""
    contiguous, headtail = _layouts(n)
    src, dst = (contiguous, headtail) if to_headtail else (headtail, contiguous)
    owner = {h: d for d in range(n) for h in dst[d]}

    def sent(s: int) -> list[int]:  # rank s's half-chunks in send order: by destination
        return sorted(src[s], key=lambda h: (owner[h], src[s].index(h)))

    halves = dict(zip(src[rank], (t.contiguous() for t in x.chunk(2, dim=2))))
    shape, numel = halves[src[rank][0]].shape, halves[src[rank][0]].numel()
    got = [h for s in range(n) for h in sent(s) if owner[h] == rank]  # in order of source
    in_splits = [numel * sum(owner[h] == d for h in src[rank]) for d in range(n)]
    out_splits = [numel * sum(owner[h] == rank for h in src[s]) for s in range(n)]
    flat = torch.cat([halves[h].view(-1) for h in sent(rank)])
    pieces = dict(zip(got, funcol.all_to_all_single(flat, out_splits, in_splits, group).split(numel)))
    return torch.cat([pieces[h].view(shape) for h in dst[rank]], dim=2)


def _merge(acc, lse, o, s):
    """Two partial attentions of the same queries merged by their log-sum-exp."""
    new = torch.logaddexp(lse, s)
    return acc * torch.exp(lse - new).unsqueeze(-1) + o.to(acc.dtype) * torch.exp(s - new).unsqueeze(-1), new


def _balanced_forward(q, k, v, scale, group, rank: int, n: int):
    q, k, v = (_relayout(t, group, rank, n, True) for t in (q, k, v))
    k_next, v_next = _rotate(k, group, n), _rotate(v, group, n)  # in flight behind step 0
    o, lse = FORWARD(q, k, v, 0.0, True, scale=scale)
    wide = torch.promote_types(o.dtype, torch.float32)
    acc = [t.to(wide) for t in o.chunk(2, dim=2)]
    lses = list(lse.chunk(2, dim=2))
    qh = q.chunk(2, dim=2)
    for step in range(1, n):
        k, v = k_next, v_next
        if step < n - 1:
            k_next, v_next = _rotate(k, group, n), _rotate(v, group, n)
        kh, vh = k.chunk(2, dim=2), v.chunk(2, dim=2)
        x = 0 if _visible(rank, step, n, True) else 1  # the halves of the second visible block
        for a, b in ((1, 0), (x, x)):  # (query half, key half)
            ob, sb = FORWARD(qh[a], kh[b], vh[b], 0.0, False, scale=scale)
            acc[a], lses[a] = _merge(acc[a], lses[a], ob, sb)
    return (_relayout(torch.cat(acc, dim=2).to(q.dtype), group, rank, n, False),
            _relayout(torch.cat(lses, dim=2), group, rank, n, False))


def _balanced_backward(grad, q, k, v, out, lse, scale, group, rank: int, n: int):
    grad, q, k, v, out, lse = (_relayout(t, group, rank, n, True)
                               for t in (grad, q, k, v, out, lse))
    k_next, v_next = _rotate(k, group, n), _rotate(v, group, n)
    gq, gk, gv = BACKWARD(grad, q, k, v, out, lse, 0.0, True, scale=scale)
    wide = torch.promote_types(q.dtype, torch.float32)
    dq = [t.to(wide) for t in gq.chunk(2, dim=2)]
    # the keys' and values' gradients travel with them, one step behind
    dk, dv = _rotate(gk.to(wide), group, n), _rotate(gv.to(wide), group, n)
    halves = [t.chunk(2, dim=2) for t in (grad, q, out, lse)]
    for step in range(1, n):
        k, v = k_next, v_next
        if step < n - 1:
            k_next, v_next = _rotate(k, group, n), _rotate(v, group, n)
        kh, vh = k.chunk(2, dim=2), v.chunk(2, dim=2)
        x = 0 if _visible(rank, step, n, True) else 1
        blocks = []
        for a, b in ((1, 0), (x, x)):
            g_, q_, o_, l_ = (h[a] for h in halves)
            blocks.append((a, b, BACKWARD(g_, q_, kh[b], vh[b], o_, l_.contiguous(), 0.0, False,
                                          scale=scale)))
        dkh, dvh = list(dk.chunk(2, dim=2)), list(dv.chunk(2, dim=2))
        for a, b, (bq, bk, bv) in blocks:
            dq[a] = dq[a] + bq.to(wide)
            dkh[b], dvh[b] = dkh[b] + bk.to(wide), dvh[b] + bv.to(wide)
        # after the last step they belong to the next rank's keys: the rotation sends them home
        dk, dv = _rotate(torch.cat(dkh, dim=2), group, n), _rotate(torch.cat(dvh, dim=2), group, n)
    grads = (torch.cat(dq, dim=2), dk, dv)
    return tuple(_relayout(g.to(x_.dtype), group, rank, n, False) for g, x_ in zip(grads, (q, k, v)))


def ring_forward(q, k, v, scale, causal: bool, group, rank: int, n: int):
    """(out, logsumexp) of attention of this rank's sequence chunk over the whole ring. The next
    chunk's keys and values are sent on before this one's block is computed, so the transfer
    can run behind it."""
    if balanced(causal, q.shape[2], n):
        return _balanced_forward(q, k, v, scale, group, rank, n)
    acc = lse = None
    for step in range(n):
        if step < n - 1:
            k_next, v_next = _rotate(k, group, n), _rotate(v, group, n)
        o, s = FORWARD(q, k, v, 0.0, causal and step == 0, scale=scale)
        if acc is None:
            acc, lse = o.to(torch.promote_types(o.dtype, torch.float32)), s
        else:
            s = s + (0.0 if _visible(rank, step, n, causal) else float("-inf"))
            new = torch.logaddexp(lse, s)
            acc = (acc * torch.exp(lse - new).unsqueeze(-1)
                   + o.to(acc.dtype) * torch.exp(s - new).unsqueeze(-1))
            lse = new
        if step < n - 1:
            k, v = k_next, v_next
    return acc.to(q.dtype), lse


def ring_backward(grad, q, k, v, out, lse, scale, causal: bool, group, rank: int, n: int):
    """(dq, dk, dv) of `ring_forward`, each for this rank's chunk."""
    if balanced(causal, q.shape[2], n):
        return _balanced_backward(grad, q, k, v, out, lse, scale, group, rank, n)
    wide = torch.promote_types(q.dtype, torch.float32)  # accumulate at least in fp32
    dq = dk = dv = None
    for step in range(n):
        if step < n - 1:
            k_next, v_next = _rotate(k, group, n), _rotate(v, group, n)
        # a masked block's probabilities exp(score - inf) are exactly 0, so are its gradients
        hide = lse if _visible(rank, step, n, causal) or step == 0 else lse + float("inf")
        gq, gk, gv = BACKWARD(grad, q, k, v, out, hide, 0.0, causal and step == 0, scale=scale)
        if dq is None:
            dq, dk, dv = gq.to(wide), gk.to(wide), gv.to(wide)
        else:
            dq, dk, dv = dq + gq.to(wide), dk + gk.to(wide), dv + gv.to(wide)
        # the gradients of the keys and values held now go on with them; after the last step
        # they reach the rank that owns them
        dk, dv = _rotate(dk, group, n), _rotate(dv, group, n)
        if step < n - 1:
            k, v = k_next, v_next
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
