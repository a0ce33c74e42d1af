"""Timing on every rank at once: `timed(fn, device)` is the slowest rank's seconds per call.

Shared by the calibration's measurements (`cost/calibrate.py`) and the measured FSDP step
(`cost/calibrate_step.py`), with the collective functions both time (their tensor forms, under
torch 2.13's names where it has them).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

# torch 2.13 renamed the tensor forms of these two (the old names warn)
ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, group=None, reps: int = 3, trials: int = 5) -> float:
    """Seconds per call of `fn`: the slowest rank's, median over `trials` of `reps` calls."""
    fn()
    _sync(device)
    out = []
    for _ in range(trials):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync(device)
        t = torch.tensor([(time.perf_counter() - t0) / reps], dtype=torch.float64)
        t = t.to(device) if device == "cuda" else t
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        out.append(float(t.item()))
    return statistics.median(out)
