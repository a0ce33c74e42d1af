"""A model, its parameters made DTensors, its forward replaced by the plan's program.

`parallelize_module(model, plan, mesh, jg)` changes `model` in place and returns it:
- every parameter becomes an `nn.Parameter` holding a DTensor with the plan's placements (one
  object under every name of a tied weight, as on a single device; on
  meta if the model was on meta: `to_empty` then `init_weights` materialise it, and
  `init_weights` gives the single-device full tensors for the same seed, see `init.py`);
  buffers stay plain full tensors, as in TorchTitan's recipes, and are sliced per the plan;
- `model.forward` runs `ParallelProgram`: the forward graph under an autograd Function whose
  backward runs the backward graph; the gradients land on the DTensor parameters in their own
  placements, so AdamW, `clip_grad_norm_` and DCP see ordinary DTensor parameters;
- `model.autopar` is that program, to inspect: its graphs, saved values, collectives; and
  `model.autopar.compile()` runs its graphs through torch.compile (inductor).

Runtime convention: each input arrives as the local shard its input placement implies and the
output leaves as the local shard of its output placement; a floating-point input that requires
grad gets its gradient back as the local shard of its own placement (a pipeline stage sends it to
the stage before). A TorchTitan trainer with cp > 1 also passes `positions`, the sequence
positions of the tokens it gives this rank: they must be the contiguous chunk the plan's
placement of input 0 implies (its sequence shards are contiguous), else the call is refused.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.distributed.tensor import DTensor, Replicate, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from titan_autopar.apply.init import wrap_init_weights
from titan_autopar.apply.interpret import LocalJoint, local_shape
from titan_autopar.apply.partition import Split
from titan_autopar.apply.regions_run import bind_runners, build_runners
from titan_autopar.cost.regions import kept_regions

class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, program: "ParallelProgram", *flat):
        res = program.run_forward(*flat)
        ctx.program = program
        ctx.save_for_backward(*res[1:])
        return res[0]

    @staticmethod
    def backward(ctx, grad):
        program = ctx.program
        grads = program.run_backward(*ctx.saved_tensors, grad.contiguous())
        input_grads = [None] * program.n_inputs
        for k, g in zip(program.grad_inputs, grads[program.n_params:]):
            input_grads[k] = g
        return (None, *grads[: program.n_params], *([None] * program.n_buffers), *input_grads)


class ParallelProgram:
    """The per-rank forward, backward and inference graphs of one plan, and how to call them."""

    def __init__(self, model, plan, mesh, jg, local: LocalJoint, split: Split):
        self.plan, self.mesh, self.local, self.split = plan, mesh, local, split
        self.param_names = list(jg.param_names)
        self.buffer_names = list(jg.buffer_names)
        self.n_params, self.n_buffers = len(jg.param_names), len(jg.buffer_names)
        self.n_inputs = jg.num_inputs
        self.grad_inputs = list(jg.input_grad_nodes)  # inputs that get gradients, in order
        pl = local.placements
        self.param_placements = pl[: self.n_params]
        self.buffer_placements = pl[self.n_params : self.n_params + self.n_buffers]
        self.input_placements = pl[self.n_params + self.n_buffers : -1]
        self.output_placement = pl[-1]
        self.input_shapes = local.local_shapes[self.n_params + self.n_buffers : -1]
        # (first, count) of the sequence positions this rank's shard of input 0 holds (tokens
        # are (batch, seq)); None for a model without such an input
        self.positions = None
        if self.n_inputs:
            shape = tuple(jg.input_nodes[0].meta["val"].shape)
            if len(shape) >= 2:
                size, offset = compute_local_shape_and_global_offset(shape, mesh,
                                                                     self.input_placements[0])
                self.positions = (offset[1], size[1])
        # manual regions run their own code in this program's graphs; TorchTitan's MoE blocks
        # keep their autograd graph from forward to backward unless activations are recomputed
        keep = kept_regions(jg.manual_regions, plan.data.get("activation_checkpointing", "none"))
        self.runners = build_runners(model, jg.manual_regions, mesh, keep)
        bind_runners([split.forward, split.backward, split.inference], self.runners,
                     training=split.forward)
        # what runs: the graphs themselves, or their compiled forms (`compile`)
        self.run_forward, self.run_backward = split.forward, split.backward
        self.run_inference = split.inference
        self.compiled: str | None = None

    def compile(self, backend: str = "inductor") -> None:
        """torch.compile the forward, backward and inference graphs (inductor: C++ on CPU,
        Triton on GPU), each as one whole graph of fixed shapes; the functional collectives in
        them compile too. The plan's placements and values do not change, only how the local
        ops run. A program with manual regions is refused: a region runs its own eager,
        possibly data-dependent code inside the graphs."""
        if self.runners:
            raise ValueError("torch.compile of a plan with manual regions (" + ", ".join(
                sorted(self.runners)) + ") is not supported yet: set [compile] enable = false")
        opts = dict(backend=backend, dynamic=False, fullgraph=True)
        self.run_forward = torch.compile(self.split.forward, **opts)
        self.run_backward = torch.compile(self.split.backward, **opts)
        self.run_inference = torch.compile(self.split.inference, **opts)
        self.compiled = backend

    # ------------------------------------------------------------------ running
    def _buffer_local(self, b: torch.Tensor, placements) -> torch.Tensor:
        if isinstance(b, DTensor):
            return b.redistribute(self.mesh, placements).to_local()
        if all(isinstance(p, Replicate) for p in placements):
            return b
        d = DTensor.from_local(b, self.mesh, (Replicate(),) * self.mesh.ndim, run_check=False)
        return d.redistribute(self.mesh, placements).to_local()

    def check_positions(self, positions: torch.Tensor) -> None:
        """Refuse `positions` other than this rank's contiguous chunk of the sequence."""
        start, n = self.positions or (0, 0)
        want = torch.arange(start, start + n, dtype=positions.dtype, device=positions.device)
        if positions.shape[-1] != n or not torch.equal(positions.reshape(-1, n)[0], want):
            raise ValueError(
                f"positions {positions.reshape(-1, positions.shape[-1])[0, :4].tolist()}...: the "
                f"plan's sequence shard on this rank is positions {start}..{start + n - 1} "
                "(contiguous chunks). Under TorchTitan set [parallelism] "
                "context_parallel_load_balancer to None (auto = true does this itself)")

    def __call__(self, model: torch.nn.Module, *inputs: torch.Tensor,
                 positions: torch.Tensor | None = None) -> torch.Tensor:
        if positions is not None:
            self.check_positions(positions)
        if len(inputs) != self.n_inputs:
            raise TypeError(f"the planned model takes {self.n_inputs} inputs, got {len(inputs)}")
        for i, (x, shape) in enumerate(zip(inputs, self.input_shapes)):
            if tuple(x.shape) != tuple(shape):
                raise ValueError(
                    f"input {i} has local shape {tuple(x.shape)}; the program was built for the "
                    f"local shard {tuple(shape)} (placements {self.input_placements[i]} of the "
                    "planned global shape): feed that shard, or plan again for this shape"
                )
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        p_locals = [params[n].to_local() for n in self.param_names]
        b_locals = [self._buffer_local(buffers[n], pl)
                    for n, pl in zip(self.buffer_names, self.buffer_placements)]
        flat = [*p_locals, *b_locals, *inputs]
        if torch.is_grad_enabled() and any(t.requires_grad for t in (*p_locals, *inputs)):
            return _Step.apply(self, *flat)
        return self.run_inference(*flat)[0]

    # ------------------------------------------------------------------ inspecting
    def collectives(self) -> dict[str, int]:
        """Count of each functional collective in the forward and backward graphs."""
        out: Counter = Counter()
        for tag, gm in (("forward", self.split.forward), ("backward", self.split.backward)):
            for n in gm.graph.nodes:
                if n.op == "call_function" and "_c10d_functional" in str(n.target) \
                        and "wait_tensor" not in str(n.target):
                    out[f"{tag}: {str(n.target).split('.')[-2]}"] += 1
        return dict(sorted(out.items()))

    def summary(self) -> str:
        f, b = self.split.forward.graph, self.split.backward.graph
        lines = [
            f"forward graph: {len(f.nodes)} nodes; backward graph: {len(b.nodes)} nodes; "
            f"{len(self.split.saved)} values saved for backward, "
            f"{len(self.split.recomputed)} recomputed from parameters"
            + (" (gathered parameters kept for the backward)"
               if getattr(self.local, "kept_gathered", False) else ""),
            "collectives: " + (", ".join(f"{k} x{v}" for k, v in self.collectives().items()) or "none"),
        ]
        if self.plan.data.get("param_dtype"):
            lines.append(f"mixed precision: parameters cast to {self.plan.data['param_dtype']} for "
                         "compute; gradients and optimizer state in the parameters' dtype")
        if getattr(self.local, "deduped", 0):
            lines.append(f"computed once: {self.local.deduped} repeated parameter-only values "
                         "(a weight gathered for the forward and again for a backward op)")
        if self.local.buckets:
            lines.append("merged per block: {gathers_merged} parameter all-gathers, "
                         "{reductions_merged} gradient reduce-scatters".format(**self.local.buckets))
        for keep, what in ((True, "keeping their activations for backward"),
                           (False, "run again in backward")):
            names = sorted(n for n, r in self.runners.items() if r.keep == keep)
            if names:
                lines.append(f"manual regions {what}: {len(names)} (" + ", ".join(names[:3])
                             + (", ..." if len(names) > 3 else "") + ")")
        if self.local.local_ops:
            lines.append("run on local shards by our rules: " + ", ".join(self.local.local_ops))
        if self.local.mismatches:
            lines.append(f"{len(self.local.mismatches)} values moved to the planned placement "
                         f"after DTensor chose another: {', '.join(self.local.mismatches[:5])}")
        return "\n".join(lines)


def _distribute(p: torch.nn.Parameter, mesh, placements) -> torch.nn.Parameter:
    if p.is_meta:
        local = torch.empty(local_shape(p.shape, mesh, placements), dtype=p.dtype, device="meta")
        d = DTensor.from_local(local, mesh, placements, run_check=False, shape=p.shape,
                               stride=p.stride())
    else:
        d = distribute_tensor(p.detach(), mesh, placements)
    return torch.nn.Parameter(d, requires_grad=p.requires_grad)


def tied_names(model: torch.nn.Module) -> dict[str, list[str]]:
    """Each parameter's name (as `named_parameters()` gives it) -> every name it is reachable
    by: more than one where weights are tied (e.g. `output.weight is tok_embeddings.weight`)."""
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return {name: by_id[id(p)] for name, p in model.named_parameters()}


def parallelize_module(model, plan, mesh, jg, local: LocalJoint, split: Split):
    program = ParallelProgram(model, plan, mesh, jg, local, split)
    aliases = tied_names(model)
    for name, placements in zip(program.param_names, program.param_placements):
        new = None
        for alias in aliases.get(name, [name]):  # a tie stays one Parameter, as on one device
            owner_name, _, leaf = alias.rpartition(".")
            owner = model.get_submodule(owner_name) if owner_name else model
            if new is None:
                new = _distribute(getattr(owner, leaf), mesh, placements)
            owner.register_parameter(leaf, new)
    model.autopar = program  # a plain attribute: no state_dict entries
    model.forward = lambda *inputs, positions=None: program(model, *inputs, positions=positions)
    wrap_init_weights(model)
    return model
