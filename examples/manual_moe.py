"""A mixture-of-experts block that does its own all-to-all, marked as a manual region.

    torchrun --standalone --nproc_per_node=4 examples/manual_moe.py

Each rank holds `experts / ep` experts. A token goes to its top-1 expert: the block sorts its
rank's tokens by expert, tells every rank of the `ep` group how many it will send (an all-to-all
of counts, whose values decide the shapes: data-dependent code), sends the tokens with an
autograd-aware all-to-all, runs its local experts, and sends the results back. The planner never
looks inside: `manual(...)` declares what goes in and out, per mesh dim, and the planner plans the
rest of the model around it (here an input and an output projection) and decides where the
block's parameters are stored on the dims the declaration leaves open (`None`: the expert weights
are sharded over `dp_shard` and gathered before the block runs, like FSDP).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd
from torch.distributed.tensor import Shard

from titan_autopar import manual


class AllToAllMoE(nn.Module):
    """Top-1 routing over `experts` experts of shape (dim, dim), `ep` ranks holding
    `experts / ep` each; `self.group` is the process group of the ep ranks (set before use)."""

    def __init__(self, dim: int, experts: int, ep: int):
        super().__init__()
        self.experts, self.ep = experts, ep
        self.gate = nn.Linear(dim, experts, bias=False)
        self.w = nn.Parameter(torch.randn(experts, dim, dim) / dim**0.5)
        self.group = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        tokens = x.reshape(-1, d)
        prob = F.softmax(self.gate(tokens), dim=-1)
        weight, expert = prob.max(dim=-1)
        order = torch.argsort(expert, stable=True)
        counts = torch.bincount(expert, minlength=self.experts)  # tokens per global expert
        local = self.w.shape[0]  # experts on this rank (all of them on one device)
        if self.group is None or self.ep == 1:
            out = self._experts(tokens[order], counts.tolist(), self.w)
        else:
            # how many tokens this rank sends each rank, per expert there; and receives
            sent = counts.view(self.ep, local)
            received = torch.empty_like(sent)
            dist.all_to_all_single(received, sent, group=self.group)
            send_splits = sent.sum(1).tolist()
            recv_splits = received.sum(1).tolist()
            routed = all_to_all_single_autograd(tokens[order], recv_splits, send_splits, self.group)
            # tokens arrive grouped by source rank, then by expert: run expert by expert
            chunks = routed.split(received.flatten().tolist())
            outs = [c @ self.w[i % local].T for i, c in enumerate(chunks)]
            done = torch.cat(outs) if outs else routed
            out = all_to_all_single_autograd(done, send_splits, recv_splits, self.group)
        unsorted = torch.empty_like(out)
        unsorted[order] = out
        return (unsorted * weight.unsqueeze(-1)).reshape(b, s, d)

    @staticmethod
    def _experts(sorted_tokens, counts, w):
        return torch.cat([c @ w[i].T for i, c in enumerate(sorted_tokens.split(counts))])


class Model(nn.Module):
    """An input projection, the MoE block with a residual, an output projection."""

    def __init__(self, dim: int = 32, experts: int = 8, ep: int = 2):
        super().__init__()
        self.inp = nn.Linear(dim, dim)
        self.moe = AllToAllMoE(dim, experts, ep)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):
        h = self.inp(x)
        return self.out(h + self.moe(h))


def mark(model: Model) -> Model:
    """The block's contract on a (dp_shard, ep) mesh: tokens batch-sharded on both dims in and
    out; expert weights split over ep (each rank's own experts) and left to the planner on
    dp_shard; the gate replicated (not listed)."""
    manual(model.moe,
           in_placements=[{"dp_shard": Shard(0), "ep": Shard(0)}],
           out_placements=[{"dp_shard": Shard(0), "ep": Shard(0)}],
           param_placements={"w": {"dp_shard": None, "ep": Shard(0)}})
    return model


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from titan_autopar import auto_parallelize
    from titan_autopar.apply.init import local_slice

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "ep"))
    with torch.device("meta"):
        model = mark(Model())
    x = torch.randn(8, 4, 32, generator=torch.Generator().manual_seed(0))
    model = auto_parallelize(model, mesh, (x.to("meta"),), progress=lambda s: None)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    for m in model.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    model.moe.group = mesh["ep"].get_group()
    out = model(local_slice(x, mesh, model.autopar.input_placements[0]))
    out.sum().backward()
    if dist.get_rank() == 0:
        print(model.autopar.plan.explain().splitlines()[0])
        print(model.autopar.summary())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
