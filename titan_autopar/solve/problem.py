"""The planning problem: decision units, their options, the edges between them, and exact prices.

Owns `Problem`, built from the traced graph, its shared blocks and the option lists. A *unit* is a
representative node (one per class of identical nodes across repeated blocks); its `weight` is how
many graph nodes it stands for. An *edge* is a (producer output -> consumer input) pair between
units, with the number of graph edges it stands for. A full assignment gives each unit one option
per mesh dim; `unit_price`, `edge_price` and `evaluate` price it exactly, and the per-dim integer
programs in `solve/ilp.py` use the same functions, so what the solver optimises is what the plan
predicts.

Ties that are not ordinary data flow are edges too: a parameter's gradient flows into the
parameter's unit (which requires it in the parameter's own placement: the gradient reduction;
a floating-point input's gradient flows into the input's unit the same way),
and the model output flows into the tangent's unit (the output's gradient has the output's
placement).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from titan_autopar.cost.comm import Topology, redistribute_time
from titan_autopar.cost.compute import VIEW_OPS, compute_time
from titan_autopar.cost.hardware import Hardware
from titan_autopar.cost.memory import Precision, backward_nodes, base_of, saved_activations
from titan_autopar.cost.regions import kept_regions, region_seconds, region_work
from titan_autopar.cost.ring import (ring_dims, ring_imbalance, ring_relayout_seconds,
                                     ring_transfer_seconds)
from titan_autopar.graph.recompute import blocks_by_position, recomputable
from titan_autopar.graph.blocks import Blocks, bucket_groups
from titan_autopar.graph.manual_ops import BACKWARD as REGION_BACKWARD
from titan_autopar.graph.manual_ops import OPS as REGION_OPS
from titan_autopar.graph.manual_ops import region_name
from titan_autopar.graph.trace import JointGraph
from titan_autopar.solve.recipes import CONTEXT
from titan_autopar.strategy.rules import SEQUENCE
from titan_autopar.strategy.options import (
    Option,
    OptionBuilder,
    output_metas,
    resolve,
    tensor_inputs,
)

# dtype casts: a mixed-precision parameter's cast and its gradient's cast back
CAST_OPS = {torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default}

MEMORY_KINDS = ("parameters", "gradients", "optimizer", "activations")


@dataclass
class Unit:
    node: fx.Node
    kind: str  # param | buffer | input | tangent | op
    options: list[Option]
    weight: int
    outs: list[torch.Tensor | None]
    ins: list[torch.Tensor]
    block: str = ""
    saved: tuple[int, ...] = ()
    pin: tuple[Placement | None, ...] | None = None  # required placement of output 0, per dim
    param_name: str | None = None
    recomputed: bool = False  # activation checkpointing runs its forward again in backward
    region: str | None = None  # the manual region this op stands for
    dim_options: list[list[int]] | None = None  # a region op's allowed options per mesh dim
    region_pin: tuple[Placement | None, ...] | None = None  # a region parameter's declaration


@dataclass
class Edge:
    src: int
    out: int
    dst: int
    arg: int
    weight: int
    param_side: bool  # a parameter all-gather or a gradient reduction: may overlap compute
    gradient: bool = False  # param-side, carrying a gradient toward its parameter
    # of `weight`, the runs that are the backward's second gather of a parameter (FSDP's
    # reshard after forward); none when the plan keeps gathered parameters for the backward
    again: int = 0


@dataclass
class Price:
    compute: float = 0.0
    comm: float = 0.0  # exposed communication (after overlap)
    comm_total: float = 0.0
    comm_param: float = 0.0  # parameter all-gathers and gradient reductions, before overlap
    # a recipe's runtime beyond compute and communication (FSDP2's, per group: `fsdp_groups`)
    framework: float = 0.0
    # the training loop's own collectives, outside the model (`cost/loop.py`): the same for every
    # plan of one job
    loop: float = 0.0
    memory: dict[str, float] = field(default_factory=lambda: {k: 0.0 for k in MEMORY_KINDS})

    @property
    def step_time(self) -> float:
        return self.compute + self.comm + self.framework + self.loop

    @property
    def peak_memory(self) -> float:
        return sum(self.memory.values())


def itemsize(t: torch.Tensor, prec: Precision) -> int:
    if prec.exact_floats:
        return t.element_size() // 2 if t.dtype.is_complex else t.element_size()
    return prec.activation if t.dtype.is_floating_point or t.dtype.is_complex else t.element_size()


def real_numel(t: torch.Tensor) -> int:
    """Elements counted in real scalars: a complex element is two (its bytes at `itemsize`)."""
    return t.numel() * (2 if t.dtype.is_complex else 1)


def local_numel(t: torch.Tensor, placements: tuple, sizes: tuple[int, ...]) -> int | None:
    """Elements of one rank's shard, or None if some dim does not split evenly."""
    shape = list(t.shape)
    for p, k in zip(placements, sizes):
        if isinstance(p, Shard) and k > 1:
            d = p.dim
            if d >= len(shape) or shape[d] % k:
                return None
            shape[d] //= k
    n = 1
    for s in shape:
        n *= s
    return n * (2 if t.dtype.is_complex else 1)


class Problem:
    def __init__(
        self,
        jg: JointGraph,
        blocks: Blocks,
        builder: OptionBuilder,
        mesh_shape: tuple[int, ...],
        hw: Hardware,
        prec: Precision,
        recompute: str = "none",
        names: tuple[str, ...] = (),
        ring_only: bool = False,
    ):
        self.jg, self.blocks, self.hw, self.prec = jg, blocks, hw, prec
        self.sizes = tuple(mesh_shape)
        # ring attention (a sequence-sharded attention op) is offered on context-parallel dims
        self.context = [n in CONTEXT for n in names] or [False] * len(self.sizes)
        self.ring_only = ring_only  # and, if set, the only attention a context dim may take
        self.topo = Topology(self.sizes, hw)
        self.units: list[Unit] = []
        self.index: dict[fx.Node, int] = {}
        self.edges: list[Edge] = []
        self._unit_cache: dict[tuple, tuple[float, dict] | None] = {}
        self._edge_cache: dict[tuple, float] = {}
        self._placements: dict[tuple, tuple] = {}  # (unit, choice, output or ~input) -> N-D
        # N-D placements numbered: the programs key their rows by these small ints, which hash
        # in C, where a tuple of Placement objects hashes each element in Python
        self._pid: dict[tuple, int] = {}
        self._pids: dict[tuple, int] = {}  # (unit, choice, output or ~input) -> number
        self.placements: list[tuple] = []  # number -> N-D placement
        self._edge_ids: dict[tuple, float] = {}
        # seconds of one redistribution, by what it depends on: many edges carry equal tensors
        self._move_cache: dict[tuple, float] = {}
        self._bucket_sizes: dict[str, int] | None = None
        self._group_of: dict[int, str | None] = {}
        self._region_comm: dict[tuple, float] = {}
        self.recompute = recompute
        # MoE regions whose autograd graph the program keeps (priced without recomputation)
        self.kept_regions = kept_regions(self.jg.manual_regions, recompute)
        # gathered parameters freed after the forward and gathered again for the backward (FSDP's
        # reshard_after_forward, TorchTitan's default); `keep_gathered` prices keeping them
        self.reshard = True
        self._build(builder)

    # ------------------------------------------------------------------ building
    def _build(self, builder: OptionBuilder) -> None:
        jg, reg = self.jg, self.blocks
        gm = jg.gm
        param_of = {n: name for name, n in jg.param_nodes.items()}
        inputs = set(jg.input_nodes)
        diff_inputs = {jg.input_nodes[i] for i in jg.input_grad_nodes}
        bwd = backward_nodes(gm, jg.tangent_node)
        saved: dict[fx.Node, set[int]] = {}
        # what runs after the model output (the backward, including its parts that do not read
        # the output's gradient, e.g. x**2 of a norm's derivative) reads saved or recomputed
        # values; such a part is computed there from what the forward kept, not kept itself
        # (`apply/partition.py` runs it in the backward)
        nodes = list(gm.graph.nodes)
        later = bwd | set(nodes[nodes.index(jg.output_value) + 1:])
        again = recomputable(blocks_by_position(gm, jg.blocks), later, self.recompute)
        keep = set(saved_activations(gm, later))
        for n in again:  # what the recomputation starts from is kept instead
            keep.update(base_of(a) for a in n.all_input_nodes
                        if a.op == "call_function" and a not in bwd)
        # param-side values: parameters and their views and mixed-precision casts; gradients and
        # the views and casts feeding them. A block's bf16 weight is gathered as FSDP2 gathers
        # it -- after the cast, merged per block and hidden behind compute (`apply/bucket.py`)
        follow = VIEW_OPS | CAST_OPS
        param_derived: set[fx.Node] = set(param_of)
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target in follow and n.args and n.args[0] in param_derived:
                param_derived.add(n)
        # a forward view or cast of a parameter that the backward reads is computed again there
        # from the shard (`apply/partition.py`, recompute_parameters, as FSDP2 gathers again for
        # the backward), so the collective that feeds it runs twice a step
        regathered: set[fx.Node] = set()
        for n in reversed(nodes):
            if n in param_derived and n not in later and n.op == "call_function" and any(
                    u in later or u in regathered for u in n.users):
                regathered.add(n)
        for s in keep:
            p, i = resolve(s)
            if p not in again:
                saved.setdefault(p, set()).add(i)

        def add(node: fx.Node, kind: str, options, outs, ins, **kw) -> None:
            self.index[node] = len(self.units)
            self.units.append(
                Unit(node, kind, options, reg.count.get(node, 1), outs, ins,
                     block=reg.block_of.get(node, ""), **kw)
            )

        for n in gm.graph.nodes:
            if reg.rep[n] is not n:
                continue
            val = n.meta.get("val")
            if n.op == "placeholder":
                if n in param_of:
                    add(n, "param", builder.tensor_options(val, with_grad=True), [val], [val],
                        param_name=param_of[n], region_pin=self._declared(param_of[n]))
                elif n is jg.tangent_node:
                    add(n, "tangent", builder.tensor_options(val, with_grad=True), [val], [val])
                elif n in inputs:  # a differentiated input takes its gradient in its placement
                    g = n in diff_inputs
                    add(n, "input", builder.tensor_options(val, with_grad=g), [val], [val] if g else [])
                else:
                    add(n, "buffer", builder.tensor_options(val), [val], [])
            elif n.op == "call_function" and n.target is not operator.getitem:
                if isinstance(val, torch.Tensor) or (
                    isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val)
                ):
                    opts, _ = builder.options(n)
                    ins = [_v(p, i) for p, i in tensor_inputs(n)]
                    add(n, "op", opts, output_metas(n), ins, saved=tuple(sorted(saved.get(n, ()))),
                        recomputed=n in again, dim_options=builder.dim_options(n),
                        region=region_name(n) if n.target in REGION_OPS else None)

        grad_side: set[fx.Node] = set()
        for g in jg.grad_nodes.values():
            while isinstance(g, fx.Node) and g.op == "call_function" and g.target in follow:
                grad_side.add(g)
                g = g.args[0]

        counts: dict[tuple, int] = {}
        again: dict[tuple, int] = {}
        flags: dict[tuple, tuple[bool, bool]] = {}

        def link(p: fx.Node, i: int, c_unit: int, k: int, param_side: bool,
                 gradient: bool = False, c: fx.Node | None = None) -> None:
            pu = self.index.get(reg.rep[p])
            if pu is None or pu == c_unit:
                return
            key = (pu, i, c_unit, k)
            twice = param_side and not gradient and c in regathered
            counts[key] = counts.get(key, 0) + (2 if twice else 1)
            again[key] = again.get(key, 0) + twice
            flags[key] = (param_side, gradient and param_side)

        for n in gm.graph.nodes:
            if n.op != "call_function" or n.target is operator.getitem:
                continue
            cu = self.index.get(reg.rep[n])
            if cu is None:
                continue
            for k, (p, i) in enumerate(tensor_inputs(n)):
                link(p, i, cu, k, p in param_derived or n in grad_side,
                     gradient=n in grad_side and p not in param_derived, c=n)
        for name, g in jg.grad_nodes.items():
            if isinstance(g, fx.Node):
                p, i = resolve(g)
                link(p, i, self.index[reg.rep[jg.param_nodes[name]]], 0, True, gradient=True)
        for k, g in jg.input_grad_nodes.items():
            p, i = resolve(g)
            link(p, i, self.index[reg.rep[jg.input_nodes[k]]], 0, False)
        p, i = resolve(jg.output_value)
        link(p, i, self.index[jg.tangent_node], 0, False)
        for key, w in counts.items():
            self.edges.append(Edge(*key, weight=w, param_side=flags[key][0],
                                   gradient=flags[key][1], again=again[key]))
        self.in_edges: list[list[int]] = [[] for _ in self.units]
        self.out_edges: list[list[int]] = [[] for _ in self.units]
        for ei, e in enumerate(self.edges):
            self.in_edges[e.dst].append(ei)
            self.out_edges[e.src].append(ei)

    def _declared(self, param: str) -> tuple | None:
        """A manual region's declaration for one of its parameters (None where it leaves a dim
        to the planner), or None for a parameter outside every region."""
        for q, r in self.jg.manual_regions.items():
            if param.startswith(q + "."):
                return r.params.get(param[len(q) + 1:])
        return None

    # ------------------------------------------------------------------ placements
    def placement(self, u: int, choice: tuple[int, ...], out: int = 0) -> tuple:
        key = (u, choice, out)
        hit = self._placements.get(key)
        if hit is None:
            opts = self.units[u].options
            hit = self._placements[key] = tuple(opts[c].out[out] for c in choice)
        return hit

    def in_placement(self, u: int, choice: tuple[int, ...], arg: int) -> tuple:
        key = (u, choice, ~arg)  # inputs apart from outputs
        hit = self._placements.get(key)
        if hit is None:
            opts = self.units[u].options
            hit = self._placements[key] = tuple(opts[c].ins[arg] for c in choice)
        return hit

    def placement_id(self, u: int, choice: tuple[int, ...], out: int = 0) -> int:
        """The number of `placement(u, choice, out)` (`self.placements` lists them)."""
        key = (u, choice, out)
        hit = self._pids.get(key)
        if hit is None:
            hit = self._pids[key] = self._number(self.placement(u, choice, out))
        return hit

    def in_placement_id(self, u: int, choice: tuple[int, ...], arg: int) -> int:
        """The number of `in_placement(u, choice, arg)`."""
        key = (u, choice, ~arg)
        hit = self._pids.get(key)
        if hit is None:
            hit = self._pids[key] = self._number(self.in_placement(u, choice, arg))
        return hit

    def _number(self, placement: tuple) -> int:
        n = self._pid.get(placement)
        if n is None:
            n = self._pid[placement] = len(self.placements)
            self.placements.append(placement)
        return n

    def allowed(self, u: int, m: int) -> list[int]:
        """Option indices unit `u` may take on mesh dim `m`: a region op's declared one; else the
        placement a region declares for its parameter, or a pin, where there is one."""
        unit = self.units[u]
        if unit.dim_options is not None:
            return list(unit.dim_options[m])
        want = None
        if unit.region_pin is not None and unit.region_pin[m] is not None:
            want = unit.region_pin[m]
        elif unit.pin is not None:
            want = unit.pin[m]
        if want is None:
            if ring_dims(unit.node, unit.options) and (self.ring_only or not self.context[m]):
                ring = self.context[m]  # a context dim under ring_only: the ring alone
                return [s for s, o in enumerate(unit.options) if bool(ring_dims(unit.node, [o])) == ring]
            return list(range(len(unit.options)))
        return [s for s, o in enumerate(unit.options) if o.out[0] == want]

    # ------------------------------------------------------------------ prices
    def unit_price(self, u: int, choice: tuple[int, ...]) -> tuple[float, dict[str, float]] | None:
        """(compute seconds, memory bytes by kind) of unit `u` under `choice`, weighted by
        its multiplicity; None when some tensor would not split evenly."""
        key = (u, choice)
        if key in self._unit_cache:
            return self._unit_cache[key]
        unit, sizes, prec = self.units[u], self.sizes, self.prec
        opts = [unit.options[c] for c in choice]
        res = None
        traffic = 0.0
        ok = True
        out_local = []
        for j, t in enumerate(unit.outs):
            if t is None:
                out_local.append(0)
                continue
            n = local_numel(t, tuple(o.out[j] for o in opts), sizes)
            if n is None:
                ok = False
                break
            out_local.append(n)
            traffic += n * itemsize(t, prec)
        if ok:
            for k, t in enumerate(unit.ins):
                n = local_numel(t, tuple(o.ins[k] for o in opts), sizes)
                if n is None:
                    ok = False
                    break
                traffic += n * itemsize(t, prec)
        if ok:
            w = unit.weight
            mem = {k: 0.0 for k in MEMORY_KINDS}
            compute = 0.0
            if unit.kind == "param":
                n = out_local[0]
                mem["parameters"] = w * n * prec.parameter
                mem["gradients"] = w * n * prec.gradient
                mem["optimizer"] = w * n * prec.optimizer
                # each rank steps its own shard; every tensor pays its dispatch
                compute = w * (n * self.hw.optimizer_seconds + self.hw.optimizer_time_per_tensor)
            elif unit.kind == "buffer":
                mem["parameters"] = w * out_local[0] * unit.outs[0].element_size()
            elif unit.kind == "op" and unit.region is not None:
                compute, comm, held = self._region_seconds(unit, opts)
                compute, self._region_comm[key] = w * (compute + comm), w * comm
                if unit.recomputed:
                    compute *= 2
                    self._region_comm[key] *= 2
                mem["activations"] += w * held  # what a kept region holds inside it
                for j in unit.saved:
                    mem["activations"] += w * out_local[j] * itemsize(unit.outs[j], prec)
            elif unit.kind == "op":
                split = 1
                for o, k in zip(opts, sizes):
                    if any(p is not None and not isinstance(p, Replicate) for p in (*o.out, *o.ins)):
                        split *= k
                first = next((t for t in (*unit.outs, *unit.ins) if t is not None), None)
                size = itemsize(first, prec) if first is not None else prec.activation
                compute = w * compute_time(unit.node, split, traffic, self.hw, size)
                ring = ring_dims(unit.node, opts)
                if len(ring) > 1:  # one ring per op
                    ok = False
                elif ring:
                    compute, own = self._ring(unit, opts, ring[0], compute, size, traffic)
                    self._region_comm[key] = own * (2 if unit.recomputed else 1)
                    compute += own
                if unit.recomputed:  # once in the forward, once more in the backward
                    compute *= 2
                for j in unit.saved:
                    mem["activations"] += w * out_local[j] * itemsize(unit.outs[j], prec)
            if unit.node is self.jg.tangent_node and ok:  # the trainer's loss on the output
                compute += w * out_local[0] * self.hw.loss_time_per_element
            res = (compute, mem) if ok else None
        self._unit_cache[key] = res
        return res

    def _region_seconds(self, unit: Unit, opts) -> tuple[float, float, float]:
        """(compute, own collectives) seconds of one call of a region's op on one rank, and the
        bytes a kept region's forward holds inside it until its backward (`cost/regions.py`)."""
        r = self.jg.manual_regions[unit.region]
        backward = unit.node.target is REGION_BACKWARD
        k = len(r.outs) if backward else 0  # the region's first input among the op's inputs
        x = unit.ins[k]
        n = local_numel(x, tuple(o.ins[k] for o in opts), self.sizes) or 0
        tokens = n / (x.shape[-1] * (2 if x.dtype.is_complex else 1)) if x.ndim else n
        work, kept, size = region_work(r), unit.region in self.kept_regions, itemsize(x, self.prec)
        held = tokens * work.kept_elements_per_token * size if kept and not backward else 0.0
        return (*region_seconds(work, backward, tokens, self.hw, self.topo, size, kept), held)

    def _ring(self, unit: Unit, opts, dim: int, compute: float, size: int,
              op_bytes: float) -> tuple[float, float]:
        """(compute, exposed transfer seconds) of an attention op run as ring attention on
        `dim` (`cost/ring.py`): the ring's imbalance on the compute, its re-layout, and the
        part of the key/value rotations its compute does not hide."""
        k = 2 if "backward" in str(unit.node.target) else 1  # keys, values follow q
        n = self.sizes[dim]
        local_len = unit.ins[k].shape[SEQUENCE] // n  # `dim` is the only one sharding it
        compute *= ring_imbalance(unit.node, n, local_len)
        kv = sum((local_numel(unit.ins[j], tuple(o.ins[j] for o in opts), self.sizes) or 0)
                 * itemsize(unit.ins[j], self.prec) for j in (k, k + 1))
        w = unit.weight
        moved = w * ring_transfer_seconds(unit.node, self.topo, dim, kv, size)
        relayout = w * ring_relayout_seconds(unit.node, self.topo, dim, local_len, op_bytes)
        return compute, relayout + max(0.0, moved - compute)

    def hiding_compute(self, u: int, choice: tuple[int, ...], seconds: float) -> float:
        """The part of unit `u`'s `seconds` that parameter collectives can hide behind: none of
        a parameter's optimizer step (it runs after the backward) nor of a region's own comm."""
        if self.units[u].kind == "param":
            return 0.0
        return seconds - self.region_comm(u, choice)

    def region_comm(self, u: int, choice: tuple[int, ...]) -> float:
        """Seconds of an op's own collectives under `choice` (in `unit_price`'s time): a
        manual region's, or the exposed part of a ring attention's rotations."""
        if self.unit_price(u, choice) is None:
            return 0.0
        return self._region_comm.get((u, choice), 0.0)

    def runs(self, e: Edge) -> int:
        """How many times a step runs edge `e`'s redistribution."""
        return e.weight - (0 if self.reshard else e.again)

    def keep_gathered(self, keep: bool) -> None:
        """Price keeping each gathered parameter from the forward to the backward (no second
        gather; `held_gathered` bytes more) instead of FSDP's reshard after forward."""
        if keep == self.reshard:
            self.reshard = not keep
            self._edge_cache.clear()
            self._edge_ids.clear()

    def held_gathered(self, assign: list[tuple[int, ...]]) -> float:
        """Bytes per rank of the gathered parameters a plan that keeps them holds from the forward
        to the backward: each tensor the backward would gather again, once, in the placement
        its readers take it in."""
        held: dict[tuple, float] = {}
        for e in self.edges:
            if not e.again:
                continue
            t = self.units[e.src].outs[e.out]
            dst = self.in_placement(e.dst, assign[e.dst], e.arg)
            if self.placement(e.src, assign[e.src], e.out) == dst:
                continue  # nothing gathered: the backward reads the shard itself
            n = local_numel(t, dst, self.sizes)
            b = e.again * (n if n is not None else real_numel(t)) * itemsize(t, self.prec)
            key = (e.src, e.out, dst)
            held[key] = max(held.get(key, 0.0), b)
        return sum(held.values())

    def edge_price(self, ei: int, src: tuple, dst: tuple) -> float:
        key = (ei, src, dst)
        hit = self._edge_cache.get(key)
        if hit is None:
            e = self.edges[ei]
            t = self.units[e.src].outs[e.out]
            move = (real_numel(t), itemsize(t, self.prec), src, dst, self.bucket(e), e.gradient)
            seconds = self._move_cache.get(move)
            if seconds is None:
                seconds = self._move_cache[move] = redistribute_time(self.topo, *move)
            hit = self.runs(e) * seconds
            self._edge_cache[key] = hit
        return hit

    def edge_price_of(self, ei: int, a: int, b: int) -> float:
        """`edge_price` between numbered placements."""
        key = (ei, a, b)
        hit = self._edge_ids.get(key)
        if hit is None:
            hit = self._edge_ids[key] = self.edge_price(ei, self.placements[a], self.placements[b])
        return hit

    def bucket(self, e: Edge) -> int:
        """How many parameters move with `e`'s tensor in one merged collective: those of its
        merge group (`apply/bucket.py bucket_groups`: its block, or the parameters before or
        after the blocks), for a parameter-side edge; 1 otherwise."""
        if not e.param_side:
            return 1
        if self._bucket_sizes is None:
            blocks = [b.name for b in self.jg.blocks]
            group = bucket_groups(list(self.jg.param_names), blocks)
            self._group_of = {u: group.get(self.units[u].param_name)
                              for u in range(len(self.units)) if self.units[u].kind == "param"}
            self._bucket_sizes = {}
            for u, g in self._group_of.items():  # a block's representative parameters, once
                k = self.units[u].block or g
                self._bucket_sizes[k] = self._bucket_sizes.get(k, 0) + 1
        g = self.edge_group(e)
        if not g:  # outside the blocks: the group of the parameter at either end, if one is
            g = self._group_of.get(e.src) or self._group_of.get(e.dst) or "(before the blocks)"
        return max(1, self._bucket_sizes.get(g, 1))

    def fsdp_groups(self) -> int:
        """The groups TorchTitan's recipes give FSDP2: one per block with parameters (every
        member of a class of repeated blocks), one for the root's own parameters."""
        weight = {u.block: (u.weight if u.block else 1) for u in self.units if u.kind == "param"}
        return sum(weight.values())

    def matrices(self) -> int:
        """The model's parameters of two or more dims, each repeat counted: what TorchTitan's TP
        plans make tensor-parallel modules (DTensor parameters) when tp > 1."""
        return sum(u.weight for u in self.units
                   if u.kind == "param" and u.outs[0].dim() >= 2)

    def edge_group(self, e: Edge) -> str:
        """Overlap group of a parameter-side edge: the block its compute runs in."""
        src, dst = self.units[e.src], self.units[e.dst]
        return dst.block if src.kind == "param" or dst.kind != "param" else src.block

    def evaluate(self, assign: list[tuple[int, ...]]) -> Price:
        price = Price()
        group_compute: dict[str, float] = {}
        group_param: dict[str, float] = {}
        for u, choice in enumerate(assign):
            up = self.unit_price(u, choice)
            if up is None:
                raise ValueError(f"assignment splits {self.units[u].node.name} unevenly")
            own = self.region_comm(u, choice)  # a region's own collectives: exposed
            price.compute += up[0] - own
            price.comm += own
            price.comm_total += own
            g = self.units[u].block
            group_compute[g] = group_compute.get(g, 0.0) + self.hiding_compute(u, choice, up[0])
            for k, v in up[1].items():
                price.memory[k] += v
        for ei, e in enumerate(self.edges):
            c = self.edge_price(ei, self.placement(e.src, assign[e.src], e.out),
                                self.in_placement(e.dst, assign[e.dst], e.arg))
            price.comm_total += c
            if e.param_side:
                g = self.edge_group(e)
                group_param[g] = group_param.get(g, 0.0) + c
                price.comm_param += c
            else:
                price.comm += c
        a = self.hw.overlap_efficiency
        for g, c in group_param.items():
            price.comm += max(0.0, c - a * group_compute.get(g, 0.0))
        if not self.reshard:  # the gathered copies, alive from the forward to the backward
            price.memory["parameters"] += self.held_gathered(assign)
        return price


def _v(p: fx.Node, i: int):
    v = p.meta.get("val")
    return v[i] if isinstance(v, (tuple, list)) else v


