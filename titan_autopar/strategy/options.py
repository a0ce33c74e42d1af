"""Candidate placements of every node, on one mesh dimension at a time.

Owns `OptionBuilder`: for each graph node it lists the *single-dim strategies* -- the valid
(output placements, input placements) combinations on one mesh dimension -- taken from DTensor's
sharding propagation (its single-dim strategy functions, else its N-D strategy functions probed
on a 1-D sub-mesh), else from `strategy/rules.py`, else the replicate-only fallback (and the op is
recorded as having fallen back). The N-D strategy of a node is one single-dim strategy per mesh
dimension; `solve/` checks each combination for even sharding.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, TupleStrategy
from torch.distributed.tensor.placement_types import Placement
from torch.utils import _pytree as pytree

from titan_autopar.graph.manual_ops import OPS as REGION_OPS
from titan_autopar.graph.manual_ops import region_name
from titan_autopar.strategy.manual import region_options
from titan_autopar.strategy.rules import own_rules

R = Replicate()


@dataclass(frozen=True)
class Option:
    """One single-dim strategy: a placement per tensor output and per tensor input."""

    out: tuple[Placement | None, ...]
    ins: tuple[Placement, ...]


def tensor_inputs(node: fx.Node) -> list[tuple[fx.Node, int]]:
    """The node's tensor inputs in DTensor's order, each as (producer, output index).

    A `getitem` on a multi-output op is looked through: its consumers read the producer's
    output at that index directly.
    """
    flat = pytree.tree_leaves((node.args, node.kwargs))
    return [resolve(a) for a in flat if isinstance(a, fx.Node) and _is_tensor(a)]


def resolve(a: fx.Node) -> tuple[fx.Node, int]:
    if a.op == "call_function" and a.target is operator.getitem:
        src = a.args[0]
        if isinstance(src, fx.Node) and isinstance(src.meta.get("val"), (tuple, list)):
            return src, int(a.args[1])
    return a, 0


def _is_tensor(a: fx.Node) -> bool:
    return isinstance(a.meta.get("val"), torch.Tensor)


def output_metas(node: fx.Node) -> list[torch.Tensor | None]:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)):
        return [v if isinstance(v, torch.Tensor) else None for v in val]
    return []


def _norm(p) -> Placement | None:
    """Keep Replicate, Shard and sum-like Partial; anything else is dropped (returns False)."""
    if p is None or isinstance(p, Replicate):
        return p
    if type(p) is Shard:
        return Shard(p.dim)
    if hasattr(p, "dim") and type(p).__name__ == "_ShardingPlaceholder":
        return Shard(p.dim)
    if isinstance(p, Partial):
        return p if getattr(p, "reduce_op", "sum") == "sum" else False
    return False


def _useful(p, t: torch.Tensor | None) -> bool:
    if isinstance(p, Shard):
        return t is not None and p.dim < t.ndim and t.shape[p.dim] > 1
    return True


class OptionBuilder:
    """Lists each node's single-dim strategies; caches by op and shapes for its own lifetime."""

    def __init__(self, probe_mesh: DeviceMesh, manual: dict | None = None):
        self.probe_mesh = probe_mesh
        self.manual = manual or {}  # region name -> graph.manual.Resolved
        self.prop = DTensor._op_dispatcher.sharding_propagator
        self.rules = own_rules()
        self.cache: dict[tuple, tuple[list[Option], bool]] = {}
        self.fallbacks: dict[str, int] = {}

    # ---------------------------------------------------------------- placeholders
    @staticmethod
    def tensor_options(t: torch.Tensor, *, with_grad: bool = False) -> list[Option]:
        """Options of a placeholder: Replicate or Shard(d). A parameter also takes its gradient
        as an input that must arrive with the parameter's own placement."""
        ps: list[Placement] = [R] + [Shard(d) for d in range(t.ndim) if t.shape[d] > 1]
        return [Option((p,), (p,) if with_grad else ()) for p in ps]

    # ---------------------------------------------------------------- ops
    def dim_options(self, node: fx.Node) -> list[list[int]] | None:
        """For a manual region's op, the options each mesh dim may take; None for other ops."""
        if node.target not in REGION_OPS:
            return None
        return region_options(node, self.manual[region_name(node)])[1]

    def options(self, node: fx.Node) -> tuple[list[Option], bool]:
        """(options, fell_back) for a call_function node."""
        if node.target in REGION_OPS:
            pairs = region_options(node, self.manual[region_name(node)])[0]
            return [Option(out, ins) for out, ins in pairs], False
        ins = tensor_inputs(node)
        in_vals = [_val(p, i) for p, i in ins]
        outs = output_metas(node)
        key = (
            node.target,
            tuple((tuple(v.shape), v.dtype) if v is not None else None for v in in_vals),
            tuple((tuple(v.shape), v.dtype) if v is not None else None for v in outs),
            _static_args(node),
        )
        hit = self.cache.get(key)
        if hit is None:
            hit = self._compute(node, in_vals, outs)
            self.cache[key] = hit
        if hit[1]:
            name = str(node.target)
            self.fallbacks[name] = self.fallbacks.get(name, 0) + 1
        return hit

    def _compute(self, node, in_vals, outs) -> tuple[list[Option], bool]:
        n_out, n_in = len(outs), len(in_vals)
        replicate = Option(tuple(R if o is not None else None for o in outs), (R,) * n_in)
        raw: list[list] | None = None
        op = node.target
        try:
            if op in self.rules:
                raw = self.rules[op](node, n_out, n_in)
            elif op in self.prop.op_single_dim_strategy_funcs:
                raw = self._single_dim(node, op)
            elif op in self.prop.op_strategy_funcs:
                raw = self._probe(node, op, in_vals)
        except Exception:
            raw = None
        if raw is None:
            return [replicate], True
        opts = [replicate]
        seen = {replicate}
        for row in raw:
            if len(row) != n_out + n_in:
                continue
            placed = [_norm(p) for p in row]
            if any(p is False for p in placed):
                continue
            o, i = tuple(placed[:n_out]), tuple(placed[n_out:])
            if any(x is None for x in i):
                continue
            o = tuple(None if outs[k] is None else o[k] for k in range(n_out))
            if any(outs[k] is not None and o[k] is None for k in range(n_out)):
                continue
            if not all(_useful(p, t) for p, t in zip(o, outs)):
                continue
            if not all(_useful(p, t) for p, t in zip(i, in_vals)):
                continue
            opt = Option(o, i)
            if opt not in seen:
                seen.add(opt)
                opts.append(opt)
        return opts, False

    def _single_dim(self, node: fx.Node, op) -> list[list]:
        def to_meta(a):
            if isinstance(a, fx.Node):
                v = a.meta.get("val")
                if isinstance(v, torch.Tensor):
                    return TensorMeta(v.shape, v.stride(), v.dtype)
                return v
            return a

        args = fx.node.map_aggregate(node.args, to_meta)
        kwargs = fx.node.map_aggregate(node.kwargs, to_meta)
        return [list(r) for r in self.prop.op_single_dim_strategy_funcs[op].func(op, args, kwargs)]

    def _probe(self, node: fx.Node, op, in_vals) -> list[list]:
        """Ask an N-D strategy function on a 1-D mesh, offering every input placement."""
        mesh = self.probe_mesh

        def cands(v: torch.Tensor) -> list[Placement]:
            return [R] + [Shard(d) for d in range(v.ndim)] + [Partial()]

        def strat(v, only=None):
            meta = TensorMeta(v.shape, v.stride(), v.dtype)
            ps = cands(v) if only is None else [only]
            return OpStrategy([OpSpec(DTensorSpec(mesh, (p,), meta)) for p in ps])

        def build(first_only=None):
            first = [True]

            def conv(a):
                if isinstance(a, fx.Node):
                    v = a.meta.get("val")
                    if isinstance(v, torch.Tensor):
                        only = first_only if first[0] else None
                        first[0] = False
                        return strat(v, only)
                    return v
                return a

            def tuples(a):  # a list of tensors (cat, stack) is one TupleStrategy argument
                if isinstance(a, (list, tuple)) and a and all(isinstance(x, OpStrategy) for x in a):
                    return TupleStrategy(list(a))
                return a

            args = tuple(tuples(a) for a in fx.node.map_aggregate(node.args, conv))
            kwargs = fx.node.map_aggregate(node.kwargs, conv)
            return OpSchema(op, args, kwargs)

        def rows(schema) -> list[list]:
            st = self.prop.op_strategy_funcs[op](schema)
            out = []
            for spec in st.strategies:
                os_ = spec.output_specs
                o = [s.placements[0] if s is not None else None for s in os_] if isinstance(
                    os_, (tuple, list)
                ) else [os_.placements[0]]
                if spec.input_specs is None:
                    i = [o[0]] * len(in_vals)
                else:
                    i = [s.placements[0] for s in spec.input_specs]
                out.append(o + i)
            return out

        try:
            return rows(build())
        except Exception:
            if not in_vals:
                raise
            acc: list[list] = []
            for p in cands(in_vals[0]):
                try:
                    acc.extend(rows(build(p)))
                except Exception:
                    continue
            return acc


def _val(p: fx.Node, i: int):
    v = p.meta.get("val")
    if isinstance(v, (tuple, list)):
        return v[i]
    return v


def _static_args(node: fx.Node) -> str:
    def conv(a):
        if isinstance(a, fx.Node):
            return "T"
        return a

    return repr(fx.node.map_aggregate((node.args, node.kwargs), conv))
