"""Memory layouts of local tensors: keeping the one the single-device program had.

A kernel may return a tensor whose memory order is not its dims' order (CPU flash attention
returns (batch, heads, seq, dim) laid out as (batch, seq, heads, dim)), and the model's next op
may rely on it (a `view` after a transpose). A collective (DTensor's redistribute, a ring's
merge) returns its result contiguous, so where one sits between the two, `laid_out_like` puts
the result back in the memory order the single-device value had.
"""

from __future__ import annotations

import torch


def same_layout(x: torch.Tensor, ref: torch.Tensor) -> bool:
    """Whether `x` is laid out in `ref`'s memory order (dims of size 1 aside)."""
    keep = [d for d in range(ref.dim()) if ref.shape[d] > 1 and x.shape[d] > 1]
    key = lambda t: sorted(keep, key=lambda d: -t.stride(d))  # noqa: E731
    return key(x) == key(ref)


def laid_out_like(x: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """`x` (same dims as `ref`) copied into `ref`'s memory order, or `x` itself if it is."""
    if x.dim() != ref.dim() or same_layout(x, ref):
        return x
    order = sorted(range(ref.dim()), key=lambda d: -ref.stride(d))
    back = sorted(range(ref.dim()), key=lambda d: order[d])
    return x.permute(order).contiguous().permute(back)
