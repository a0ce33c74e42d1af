"""A small training step, measured three ways: what a collective costs inside a step beyond its
clean, barrier-aligned curve, what FSDP2's own runtime costs, and how much of the collectives a
step hides.

`cost/calibrate.py` times each collective with every rank lined up at a barrier and doing nothing
else. Inside a training step the ranks reach each collective at different moments, and on CPU
ranks that share cores, computing ranks and communicating ranks compete for the same cores. On
four gloo ranks on two cores a 3 MB all-gather of the FSDP recipe took 16 ms per call in
TorchTitan's trainer against 6-8 ms alone. `measure_step` measures that difference on the job's
own ranks, in a small training step rather than in a model of it:

  1. a stack of transformer-like blocks (norm, two projections, an MLP), forward and backward of
     a fixed batch, each rank on its own full copy: compute alone, no collective;
  2. the same stack under FSDP2 on a mesh of one rank (each rank its own): the compute of 1 plus
     FSDP2's own runtime (its hooks, its copies into and out of the gathered buffers), no transfer;
     and under tensor parallelism on that mesh (each linear column- or row-parallel, the norm
     sequence-parallel, as TorchTitan's TP plans make them): the compute of 1 plus DTensor's
     runtime with the redistributes around each projection, no transfer;
  3. the same stack under FSDP2 over all ranks: 2 plus the gathers and reduce-scatters FSDP2
     issues, which are counted and sized as they are called;
  4. the clean price of those collectives, from the curves just fitted (`collective_fits`).

    overhead per call  = max(0, (step 3 - step 2 - clean price 4) / collectives called)
    FSDP2 per group    = max(0, (step 2 - step 1) / blocks)
    TP per linear      = max(0, (step 2 under TP - step 1) / linears)
    hidden share       = max(0, 1 - (step 3 - step 2) / clean price 4)

The hidden share caps the overlap `cost/calibrate.py` measures on one all-reduce beside one
matmul: a machine whose training step hid none of its collectives hides none in the plan either
(on 4 CPU ranks the single pair measured 0 to 0.39 from one calibration to the next, while the
step hid nothing).

It becomes `Hardware.collective_step_overhead`: `cost/comm.py` adds it to every collective as
part of its latency (a collective merged with its block's pays its share, as of the latency).
On GPUs the collectives run on their own streams and the figure should come out near 0 (not yet
measured on more than one GPU).

The FSDP2 figure becomes `Hardware.fsdp_group_overhead`, which prices TorchTitan's recipes (each
block and the root a group: `api.py`); the TP figure becomes `Hardware.tp_linear_overhead`, which
prices the fsdp_tp recipe (each matrix of the model a tensor-parallel module). Auto's plans run
their own program of local ops (`apply/`), with neither runtime: what it costs beyond its ops
and collectives is their launch floor and the in-step overhead above.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from titan_autopar.cost.timing import ALL_GATHER, REDUCE_SCATTER, timed

SIZES = {"cpu": {"dim": 256, "hidden": 768, "tokens": 512, "blocks": 6, "dtype": torch.float32},
         "cuda": {"dim": 4096, "hidden": 14336, "tokens": 8192, "blocks": 4, "dtype": torch.bfloat16}}


class _Block(torch.nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.norm = torch.nn.RMSNorm(dim)
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)
        self.up = torch.nn.Linear(dim, hidden, bias=False)
        self.down = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        x = x + self.o(torch.tanh(self.q(self.norm(x))))
        return x + self.down(torch.nn.functional.silu(self.up(self.norm(x))))


def _stack(sz: dict, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    blocks = [_Block(sz["dim"], sz["hidden"]) for _ in range(sz["blocks"])]
    return torch.nn.Sequential(*blocks).to(device=device, dtype=sz["dtype"])


LINEARS = 4  # in each _Block


def _under_tp(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """TorchTitan's TP plan on the stack: the residual stream split by sequence (its input
    (1, tokens, dim) Shard(1)), the norm sequence-parallel, each projection's input gathered
    (column-parallel from Shard(1)) and its row-parallel output reduce-scattered back to
    sequence shards -- the redistributes the model's own plan has around every block."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    for block in model:
        parallelize_module(block, mesh, {
            "norm": SequenceParallel(),
            "q": ColwiseParallel(input_layouts=Shard(1)), "up": ColwiseParallel(input_layouts=Shard(1)),
            "o": RowwiseParallel(output_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1))})
    return model


class _Counted:
    """While active, records (kind, bytes as the collective sees them) of each gather and
    reduce-scatter called through torch.distributed (what FSDP2 calls)."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self._saved = {}

    def __enter__(self):
        for kind, fn in (("all_gather", ALL_GATHER), ("reduce_scatter", REDUCE_SCATTER)):
            name = fn.__name__
            self._saved[name] = fn

            def counted(*a, _kind=kind, _fn=fn, **kw):
                # all_gather: the gathered output (first); reduce_scatter: the full input (second)
                t = (a[0] if a else kw.get("output_tensor", kw.get("output"))) if _kind == "all_gather" \
                    else (a[1] if len(a) > 1 else kw.get("input", kw.get("input_tensor")))
                self.calls.append((_kind, t.numel() * t.element_size()))
                return _fn(*a, **kw)
            setattr(dist, name, counted)
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(dist, name, fn)


def measure_step(device: str, fits: dict) -> tuple[float, float, float, dict]:
    """(seconds per collective call beyond its curve, seconds per FSDP2 group per step, seconds
    per tensor-parallel linear per step, the measurements); every rank calls it at once. `fits`
    maps (kind, group size) to the clean (latency s, seconds per byte) just measured."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    world = dist.get_world_size()
    sz = SIZES["cuda" if device == "cuda" else "cpu"]
    x = torch.randn(sz["tokens"], sz["dim"], device=device, dtype=sz["dtype"],
                    generator=torch.Generator(device).manual_seed(1))

    def step(model):
        model(x).float().square().mean().backward()

    def under_fsdp(mesh):
        model = _stack(sz, device)
        for block in model:
            fully_shard(block, mesh=mesh)
        return fully_shard(model, mesh=mesh)

    plain = _stack(sz, device)
    alone = timed(lambda: step(plain), device)
    # FSDP2's own runtime: each rank its own mesh of one, nothing to transfer
    own = init_device_mesh(device, (world, 1), mesh_dim_names=("ranks", "own"))["own"]
    solo = under_fsdp(own)
    one_rank = timed(lambda: step(solo), device)
    per_group = max(0.0, (one_rank - alone) / sz["blocks"])
    # DTensor's runtime under tensor parallelism, on the same mesh of one: every linear a
    # column- or row-parallel module, as TorchTitan's TP plans make them
    tp = _under_tp(_stack(sz, device), own)
    x3 = x.unsqueeze(0)  # (batch, sequence, dim): the sequence is what SequenceParallel splits
    tp_one_rank = timed(lambda: tp(x3).float().square().mean().backward(), device)
    per_linear = max(0.0, (tp_one_rank - alone) / (LINEARS * sz["blocks"]))
    meas = {"compute_alone_s": alone, "fsdp_one_rank_step_s": one_rank, "groups": sz["blocks"],
            "per_group_s": per_group, "tp_one_rank_step_s": tp_one_rank,
            "tp_linears": LINEARS * sz["blocks"], "per_tp_linear_s": per_linear}
    if world < 2:
        return 0.0, per_group, per_linear, meas
    sharded = under_fsdp(init_device_mesh(device, (world,)))
    with _Counted() as counted:
        step(sharded)
    calls = counted.calls
    clean = sum(fits[(kind, world)][0] + fits[(kind, world)][1] * nbytes for kind, nbytes in calls
                if (kind, world) in fits)
    in_step = timed(lambda: step(sharded), device)
    per_call = max(0.0, (in_step - one_rank - clean) / len(calls)) if calls else 0.0
    # the share of the collectives' clean time the step hid behind compute: 0 where the step
    # took longer than compute and collectives one after the other
    hidden = min(1.0, max(0.0, 1.0 - (in_step - one_rank) / clean)) if clean else 0.0
    meas.update({"fsdp_step_s": in_step, "collectives": len(calls),
                 "collective_bytes": sum(b for _, b in calls), "clean_collectives_s": clean,
                 "per_call_s": per_call, "hidden_share": hidden})
    return per_call, per_group, per_linear, meas
