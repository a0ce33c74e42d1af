"""The plan's joint graph, run on DTensors, recorded as one rank's program of local ops.

`trace_local_joint(jg, plan, mesh)` walks the joint forward+backward graph node by node with
DTensors standing for every value. Before each op it redistributes each tensor input to the
placement the plan chose for it; the op then runs through DTensor's own dispatch (which turns
global shape arguments into local ones) or, for ops that only our rules cover (CPU flash
attention, manual regions), directly on the local shards. make_fx records what actually runs on
this rank: local aten ops and functional collectives (`_c10d_functional.*`), nothing else. The
recorded graph takes local shards of (parameters, buffers, inputs, tangent) and returns local
shards of (output, *parameter gradients, *input gradients), each gradient in its parameter's (or
floating-point input's) placement.

Where DTensor lands an op's output on another placement than the plan's (its strategy list
lacked the planned one), the value is moved to the planned placement and the node is counted in
`LocalJoint.mismatches`: the program stays correct, the plan's prediction for it does not.

Every local node recorded while a repeated block's forward ran carries that block's name in
`meta["autopar_block"]`: activation checkpointing (`apply/partition.py`) recomputes by block.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor, Partial, Replicate
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.fx.experimental.proxy_tensor import get_proxy_mode, make_fx
from torch.utils import _pytree as pytree

from titan_autopar.graph.manual_ops import FORWARD as REGION_FORWARD
from titan_autopar.graph.manual_ops import OPS as REGION_OPS
from titan_autopar.graph.manual_ops import flat_sizes
from titan_autopar.graph.recompute import blocks_by_position
from titan_autopar.graph.trace import JointGraph
from titan_autopar.plan import Plan, StalePlanError, parse_placement
from titan_autopar.apply.layout import laid_out_like, same_layout
from titan_autopar.apply.ring_attention import ring_backward, ring_forward
from titan_autopar.strategy.rules import is_causal, own_rules, sequence_dims


@dataclass
class LocalJoint:
    """One rank's training step as a graph of local ops, and what its placeholders hold."""

    gm: fx.GraphModule
    placements: list[tuple]  # per placeholder: params, buffers, inputs, tangent
    local_shapes: list[tuple[int, ...]]
    mismatches: list[str] = field(default_factory=list)
    local_ops: list[str] = field(default_factory=list)
    buckets: dict[str, int] = field(default_factory=dict)  # collectives merged per block


def _pl(strs) -> tuple:
    return tuple(parse_placement(s) for s in strs)


def local_shape(shape, mesh, placements) -> tuple[int, ...]:
    return tuple(compute_local_shape_and_global_offset(tuple(shape), mesh, placements)[0])


def _is_tensor_node(a) -> bool:
    return isinstance(a, fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)


def _placeholder_placements(jg: JointGraph, plan: Plan) -> list[tuple]:
    nodes = plan.data["nodes"]
    out = []
    for n in jg.gm.graph.nodes:
        if n.op != "placeholder":
            continue
        entry = nodes.get(n.name)
        if entry is None:
            raise StalePlanError(f"the plan has no placement for graph input {n.name}: the model's "
                                 "graph differs from the one planned; plan again")
        out.append(_pl(entry["out"][0]))
    return out


BLOCK_TAG = "autopar_block"  # meta key: the repeated block whose forward recorded this node


def _last_recorded() -> fx.Node:
    return next(reversed(get_proxy_mode().tracer.graph.nodes))


def _tag_since(last: fx.Node, block: str) -> None:
    """Tag the nodes recorded after `last` as part of `block`'s forward."""
    n = last.next
    while n.op != "root":
        n.meta[BLOCK_TAG] = block
        n = n.next


class _Runner:
    def __init__(self, jg: JointGraph, plan: Plan, mesh):
        self.jg, self.mesh = jg, mesh
        self.nodes = plan.data["nodes"]
        self.local_rules = set(own_rules())
        self.mismatches: list[str] = []
        self.local_ops: set[str] = set()
        self.replicate = (Replicate(),) * mesh.ndim
        self.block_of = {n: b for n, b in blocks_by_position(jg.gm, jg.blocks).items()
                         if n.op == "call_function"}
        # each region's local output shapes, from its declared placements (worked out here:
        # inside the recording, the mesh's coordinate arithmetic would be recorded too)
        self.region_sizes = {}
        for n in jg.gm.graph.nodes:
            if n.op == "call_function" and n.target is REGION_FORWARD:
                outs = [_pl(s) for s in self.nodes[n.name]["out"]]
                self.region_sizes[n.name] = flat_sizes(
                    [local_shape(v.shape, mesh, pl) for v, pl in zip(n.meta["val"], outs)])
        # the placeholder whose placement each gradient takes: its parameter's, or its input's
        first_input = len(jg.param_names) + len(jg.buffer_names)
        self.grad_slots = [*range(len(jg.param_names)),
                           *(first_input + k for k in jg.input_grad_nodes)]

    def to_dtensor(self, t: torch.Tensor, placements) -> DTensor:
        """A plain global tensor (a constant or a factory's result) as a DTensor."""
        d = DTensor.from_local(t, self.mesh, self.replicate, run_check=False)
        return self.redistribute(d, tuple(placements)) if tuple(placements) != self.replicate else d

    def fix(self, value, want, name: str | None = None):
        """`value` as a DTensor placed `want`; `name` counts a move the plan did not price."""
        if isinstance(value, DTensor):
            if tuple(value.placements) != tuple(want):
                if name:
                    self.mismatches.append(name)
                value = self.redistribute(value, tuple(want))
            return value
        if isinstance(value, torch.Tensor):
            return self.to_dtensor(value, want)
        return value

    def keep_layout(self, value: DTensor, meta: torch.Tensor) -> DTensor:
        """`value` with its local tensor in the memory order the single-device value had
        (`apply/layout.py`)."""
        local = value.to_local()
        if same_layout(local, meta):
            return value
        return DTensor.from_local(laid_out_like(local, meta), self.mesh, value.placements,
                                  run_check=False, shape=value.shape, stride=meta.stride())

    def redistribute(self, value: DTensor, want: tuple) -> DTensor:
        """DTensor's redistribute, plus what it refuses and the plan may choose: a value made
        Partial (sum) on a dim where it is not -- it is kept whole on that dim's first rank and
        zero on the others (the cost model prices this the same way)."""
        made = [m for m, (have, w) in enumerate(zip(value.placements, want))
                if isinstance(w, Partial) and not isinstance(have, Partial)]
        if not made:
            return value.redistribute(self.mesh, want)
        if any(w.reduce_op != "sum" for w in (want[m] for m in made)):
            raise NotImplementedError(f"the plan makes a value {want}; only sum partials are made")
        step = tuple(Replicate() if m in made else w for m, w in enumerate(want))
        value = value.redistribute(self.mesh, step) if tuple(value.placements) != step else value
        # the same op on every rank (a rank-dependent graph would order collectives differently
        # after partitioning): multiply by 1 on the dims' first ranks, by 0 elsewhere
        first = all(self.mesh.get_local_rank(m) == 0 for m in made)
        local = value.to_local().mul(1.0 if first else 0.0)
        return DTensor.from_local(local, self.mesh, want, run_check=False, shape=value.shape,
                                  stride=value.stride())

    def run_node(self, n: fx.Node, env: dict):
        entry = self.nodes.get(n.name)
        if entry is None:
            raise StalePlanError(f"the plan has no placement for node {n.name} ({n.target}): the "
                                 "model's graph differs from the one planned; plan again")
        flat, spec = pytree.tree_flatten((n.args, n.kwargs))
        ins = [_pl(s) for s in entry.get("in", [])]
        k = 0
        vals = []
        for a in flat:
            if isinstance(a, fx.Node):
                v = env[a]
                if _is_tensor_node(a):
                    if k < len(ins):
                        moved = isinstance(v, DTensor) and tuple(v.placements) != tuple(ins[k])
                        v = self.fix(v, ins[k])
                        if moved:  # a collective's result is contiguous: the op may need more
                            v = self.keep_layout(v, a.meta["val"])
                    k += 1
                vals.append(v)
            else:
                vals.append(a)
        outs = [_pl(s) if s and s[0] != "-" else None for s in entry["out"]]
        if n.target in self.local_rules or n.target in REGION_OPS:
            ring = sequence_dims(n, ins[0]) if ins else []
            if ring:
                return self.run_local(n, vals, spec, outs, ring_dim=ring[0])
            return self.run_local(n, vals, spec, outs)
        args, kwargs = pytree.tree_unflatten(vals, spec)
        try:
            res = n.target(*args, **kwargs)
        except NotImplementedError:  # DTensor has no rule: the plan replicated it (a fallback)
            return self.run_local(n, vals, spec, outs)
        return self.check(n, res, outs)

    def check(self, n: fx.Node, res, outs):
        if isinstance(res, (tuple, list)):
            return type(res)(self.fix(r, outs[j], n.name) if outs[j] is not None else r
                             for j, r in enumerate(res))
        return self.fix(res, outs[0], n.name)

    def run_local(self, n: fx.Node, vals, spec, outs, ring_dim: int | None = None):
        self.local_ops.add(str(n.target))
        local = [v.to_local() if isinstance(v, DTensor) else v for v in vals]
        args, kwargs = pytree.tree_unflatten(local, spec)
        metas = n.meta["val"]
        if n.target is REGION_FORWARD:  # the local shards its declared placements imply
            args = (*args[:3], *self.region_sizes[n.name])
        if ring_dim is not None:  # attention on sequence shards: ring attention on that dim,
            # its results in the memory order the kernel gives its own (the model may view them)
            res = [laid_out_like(r, m) for r, m in zip(self.run_ring(n, args, kwargs, ring_dim),
                                                         metas)]
        else:
            res = n.target(*args, **kwargs)

        def wrap(r, meta, pl):
            if pl is None or not isinstance(r, torch.Tensor):
                return r
            return DTensor.from_local(r, self.mesh, pl, run_check=False, shape=meta.shape,
                                      stride=meta.stride())

        if isinstance(res, (tuple, list)):
            return type(res)(wrap(r, metas[j], outs[j] if j < len(outs) else None)
                             for j, r in enumerate(res))
        return wrap(res, metas, outs[0])

    def run_ring(self, n: fx.Node, args, kwargs, dim: int):
        """An attention op whose sequence the plan shards on mesh dim `dim`, on local shards."""
        ring = (kwargs.get("scale"), is_causal(n), self.mesh.get_group(dim),
                self.mesh.get_local_rank(dim), self.mesh.size(dim))
        backward = "backward" in str(n.target)
        dropout = 6 if backward else 3
        if kwargs.get("attn_mask") is not None or (args[dropout] if len(args) > dropout else 0.0):
            raise NotImplementedError(f"{n.name}: ring attention runs without a mask or dropout")
        if backward:
            return ring_backward(*args[:6], *ring)
        return ring_forward(*args[:3], *ring)

    def __call__(self, placements, *locals_):
        gm = self.jg.gm
        env: dict[fx.Node, object] = {}
        it = iter(zip(locals_, placements))
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                loc, pl = next(it)
                meta = n.meta["val"]
                env[n] = DTensor.from_local(loc, self.mesh, pl, run_check=False,
                                            shape=meta.shape, stride=meta.stride())
            elif n.op == "get_attr":
                env[n] = getattr(gm, n.target)
            elif n.op == "call_function" and n.target is operator.getitem:
                env[n] = env[n.args[0]][n.args[1]]
            elif n.op == "call_function":
                block = self.block_of.get(n)
                last = _last_recorded() if block else None
                env[n] = self.run_node(n, env)
                if block:
                    _tag_since(last, block)
            elif n.op == "output":
                flat = pytree.tree_leaves(n.args[0])
                out = self.fix(env[flat[0]], placements[-1])
                grads = [self.fix(env[g], placements[i]) for i, g in zip(self.grad_slots, flat[1:])]
                return [out.to_local()] + [g.to_local() for g in grads]
        raise RuntimeError("the joint graph has no output node")


@contextlib.contextmanager
def _quiet_dtensor():
    """DTensor warns, once per redistribution it records, about choices the plan already made
    (sequential collectives on N-D meshes, all-to-all emulated on CPU); the plan lists them."""
    loggers = [logging.getLogger(n) for n in ("torch.distributed.tensor._redistribute",
                                              "torch.distributed._functional_collectives")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, lv in zip(loggers, levels):
            lg.setLevel(lv)


def trace_local_joint(jg: JointGraph, plan: Plan, mesh) -> LocalJoint:
    """Record this rank's program for `plan` (see the module docstring)."""
    placements = _placeholder_placements(jg, plan)
    metas = [n.meta["val"] for n in jg.gm.graph.nodes if n.op == "placeholder"]
    shapes = [local_shape(m.shape, mesh, pl) for m, pl in zip(metas, placements)]
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        locals_ = [torch.empty(s, dtype=m.dtype) for s, m in zip(shapes, metas)]
    runner = _Runner(jg, plan, mesh)
    with _quiet_dtensor():
        gm = make_fx(lambda *xs: runner(placements, *xs), tracing_mode="fake",
                     _allow_non_fake_inputs=True)(*locals_)
    return LocalJoint(gm, placements, shapes, sorted(set(runner.mismatches)),
                      sorted(runner.local_ops))
