"""Manual regions inside a built program: the region's own code, run eagerly on local tensors.

The planner sees each region as a `manual_forward` and a `manual_backward` op
(`graph/manual_ops.py`). In a rank's program those nodes call a `RegionRunner`:
- forward: the module's own `forward` on the local inputs, with its parameters swapped for the
  local tensors the program gathered as the region declared (`functional_call`). Each output is
  checked against the local shape its declared out_placements imply, so a declaration that
  disagrees with the code is named at the first step, not found as wrong numbers later;
- backward: `torch.autograd.grad` through the region's own autograd graph (its collectives,
  being autograd-aware, run their reverse). A TorchTitan MoE block (a built-in style) in a
  program without activation checkpointing keeps that graph from its forward in the training
  step (`cost/regions.py` `kept_regions`), as the module would under TorchTitan's recipes: its
  forward runs once per step. Any other region, and every region under activation checkpointing, keeps nothing:
  its backward runs the forward again with autograd on (as activation checkpointing does); a
  buffer the region updates as it runs (a MoE block's token counts) sees that once per step,
  the recomputation running on copies of them. A backward whose inputs are not those of a kept
  forward (another caller's) recomputes too, so pairing never depends on call order.

Style "torchtitan_ep": the block's routed experts get TorchTitan's own `ExpertParallel` token
dispatch and combine (all-to-alls on the `ep` mesh dim) as hooks on `experts`, and their weights
reach TorchTitan's code as DTensors on that 1-D `ep` mesh (Shard(0)), the form its grouped
experts expect; the local tensors under them are the program's, so gradients flow back to the
program's parameters.
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch.distributed.tensor import DTensor, Shard

from titan_autopar.graph.manual import EXPERT_WEIGHTS, ManualRegionError, Resolved
from titan_autopar.graph.manual_ops import BACKWARD, FORWARD, split_sizes


class RegionRunner:
    def __init__(self, module: torch.nn.Module, resolved: Resolved, mesh, keep: bool = False):
        self.module, self.r = module, resolved
        self.names = [n for n, _ in module.named_parameters()]
        self.calls = 0  # forwards run, recomputations included
        self.keep = keep
        # kept forwards awaiting their backward: the region's inputs' storages -> (leaf inputs,
        # leaf parameters, outputs with their autograd graph)
        self.kept: dict[tuple, tuple] = {}
        self.misses = 0  # backwards that found kept forwards but not their own (0 by design)
        self.wrap = {}
        if resolved.style == "torchtitan_ep":
            self._expert_parallel(mesh[mesh.mesh_dim_names[resolved.ep_dim]])

    def _expert_parallel(self, ep_mesh) -> None:
        from torchtitan.distributed.expert_parallel import ExpertParallel

        style = ExpertParallel()
        experts = self.module.experts
        if not getattr(experts, "_titan_autopar_ep", False):
            experts.register_forward_pre_hook(
                lambda mod, inputs: style._token_dispatch(mod, inputs, ep_mesh))
            experts.register_forward_hook(
                lambda mod, inputs, out: style._token_combine(mod, out, ep_mesh))
            experts._titan_autopar_ep = True
        for n in EXPERT_WEIGHTS:
            self.wrap[n] = lambda t, m=ep_mesh: DTensor.from_local(t, m, (Shard(0),),
                                                                   run_check=False)

    def _call(self, inputs, params, buffers=None) -> list[torch.Tensor]:
        state = {n: self.wrap[n](p) if n in self.wrap else p for n, p in zip(self.names, params)}
        out = torch.func.functional_call(self.module, {**state, **(buffers or {})}, tuple(inputs))
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def _check(self, outs, out_sizes, out_ranks) -> None:
        want = split_sizes(out_sizes, out_ranks)
        got = [tuple(o.shape) for o in outs]
        if len(got) != len(want) or any(g != w for g, w in zip(got, want)):
            raise ManualRegionError(
                f"manual region {self.r.name!r} returned local outputs of shapes {got}, but its "
                f"declared out_placements {[self._pl(t) for t in self.r.outs]} imply {want} on "
                "this rank: make the declaration match what the code returns")

    @staticmethod
    def _pl(t) -> str:
        return "(" + ", ".join("planner's choice" if p is None else type(p).__name__ +
                               (f"({p.dim})" if isinstance(p, Shard) else "()") for p in t) + ")"

    @staticmethod
    def _key(inputs) -> tuple:
        return tuple((x.data_ptr(), tuple(x.shape)) for x in inputs)

    @staticmethod
    def _leaves(inputs, params) -> tuple[list, list]:
        return ([x.detach().requires_grad_(x.is_floating_point()) for x in inputs],
                [p.detach().requires_grad_(True) for p in params])

    def forward(self, inputs, params, out_sizes, out_ranks,
                training: bool = False) -> list[torch.Tensor]:
        if self.keep and training:  # the training step's forward: keep the graph for backward
            xs, ps = self._leaves(inputs, params)
            with torch.enable_grad():
                outs = self._call(xs, ps)
            self.kept[self._key(inputs)] = (xs, ps, outs)
        else:
            xs = inputs
            with torch.no_grad():
                outs = self._call(inputs, params)
        self._check(outs, out_sizes, out_ranks)
        self.calls += 1
        # a fresh tensor: an output that aliases an input must not change when the program
        # reuses the input's storage
        return [o.detach().clone() if any(o is x for x in xs) else o.detach() for o in outs]

    def backward(self, grad_outs, inputs, params) -> list[torch.Tensor]:
        kept = self.kept.pop(self._key(inputs), None)
        if kept is not None:
            xs, ps, outs = kept
        else:  # nothing kept: run the forward again, on copies of the buffers it updates
            if self.kept:  # kept forwards this backward does not match will not be matched
                self.kept.clear()
                self.misses += 1
            buffers = {n: b.clone() for n, b in self.module.named_buffers()}
            xs, ps = self._leaves(inputs, params)
            with torch.enable_grad():
                outs = self._call(xs, ps, buffers)
            self.calls += 1
        wanted = [t for t in (*xs, *ps) if t.requires_grad]
        pairs = [(o, g) for o, g in zip(outs, grad_outs) if o.requires_grad]
        grads = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                    allow_unused=True) if pairs else [None] * len(wanted)
        it = iter(grads)
        out = []
        for t in (*xs, *ps):
            g = next(it) if t.requires_grad else None
            out.append(torch.zeros_like(t) if g is None else g)
        return out


def build_runners(model: torch.nn.Module, resolved: dict[str, Resolved], mesh,
                  keep: set[str] = frozenset()) -> dict:
    return {name: RegionRunner(model.get_submodule(name), r, mesh, keep=name in keep)
            for name, r in resolved.items()}


def bind_runners(graphs: list[fx.GraphModule], runners: dict[str, RegionRunner],
                 training: fx.GraphModule | None = None) -> None:
    """Point each graph's manual_forward / manual_backward nodes at this program's runners;
    the region forwards of `training` (the training step's forward graph) may keep their
    autograd graph for the backward graph."""

    def manual_region_forward(inputs, params, name, out_sizes, out_ranks):
        return runners[name].forward(inputs, params, out_sizes, out_ranks)

    def manual_region_forward_training(inputs, params, name, out_sizes, out_ranks):
        return runners[name].forward(inputs, params, out_sizes, out_ranks, training=True)

    def manual_region_backward(grad_outs, inputs, params, name):
        return runners[name].backward(grad_outs, inputs, params)

    for gm in graphs:
        changed = False
        fwd = manual_region_forward_training if gm is training else manual_region_forward
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target is FORWARD:
                n.target, changed = fwd, True
            elif n.op == "call_function" and n.target is BACKWARD:
                n.target, changed = manual_region_backward, True
        if changed:
            gm.recompile()
