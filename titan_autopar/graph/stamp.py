"""The joint graph of a model whose blocks are alike, traced on four of them.

Owns `trace_step`, how the planner and `apply_plan` get a model's joint forward+backward graph.
Tracing costs about a millisecond per node on fake tensors, and a transformer's graph is its
blocks repeated: Llama3-8B's 6,573 nodes are 32 copies of one layer's ~200 and ~200 more. So a
model with one container of N >= MIN_BLOCKS alike blocks (TorchTitan's `layers`) is traced with
its first TRACED blocks only (the same modules, in a shallow copy of the model), and the graph
for N blocks is stamped from that one: every run of nodes that belongs to one block -- its
parameters' placeholders, their mixed-precision casts, its forward, its backward, its gradients'
casts back -- comes once per block in the traced graph, in block order or in reverse; the first
and last blocks' runs are kept as traced (they meet the embedding and the final norm), and the
middle blocks are copies of block 1's, each reading its neighbours where block 1 read blocks 0
and 2. Nodes get the names tracing would have given them (FX numbers each op's name in creation
order, and the stamped graph is created in the traced order), so a stamped plan is the plan of
the whole trace, node for node.

It is used only where it is exact, and the whole model is traced otherwise
(`JointGraph.traced_blocks` says which):
  - one container holds every repeated block, with N >= MIN_BLOCKS children of one class and
    equal parameter and buffer names, shapes and dtypes, and the same manual-region
    declarations relative to each block (`_container`);
  - the model's forward, run once on meta tensors with every block's ops recorded (op, its
    non-tensor arguments, and where each tensor argument came from, relative to the block), is
    the same for every block after the first, and before and after the blocks the same as the
    four-block copy's (`forward_record`): a block that behaves by its position (every fourth
    without rotary embeddings, say) or a model that reads its depth in forward is traced whole;
  - the four-block graph splits into such runs, every block reference in them reaches a
    neighbour at most, and stamping it for four blocks gives back the traced graph node for node,
    names, ops, arguments and shapes (`_Stamp.check`).
`tests/test_stamp.py` holds stamped graphs to whole traces of the shipped models.
"""

from __future__ import annotations

import copy
import operator
import re
import time
from collections import defaultdict

import torch
import torch.fx as fx
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module
from torch.utils._python_dispatch import TorchDispatchMode

from titan_autopar.graph.attention import flex_as_ops, flex_kwargs
from titan_autopar.graph.manual import ManualRegionError
from titan_autopar.graph.manual_ops import regions_as_ops
from titan_autopar.graph.trace import (BlockTrace, JointGraph, _block_containers, _cast,
                                       differentiable_inputs, joint_graph_of, trace_joint)

MIN_BLOCKS = 5  # fewer blocks are traced whole: four would be traced anyway
TRACED = 4  # blocks traced: the first, two alike in the middle, the last


class Unstampable(Exception):
    """Why a graph cannot be stamped (the model is then traced whole)."""


def trace_step(model: torch.nn.Module, sample_inputs: tuple[torch.Tensor, ...],
               param_dtype: torch.dtype | None = None, manual: dict | None = None) -> JointGraph:
    """`trace_joint`'s graph, stamped from TRACED blocks where that is exact (module docstring),
    else traced whole. `jg.traced_blocks` is how many blocks were traced (None: the whole model),
    and `jg.stamp_note` why it was not stamped, when it was not."""
    t0 = time.perf_counter()
    manual = manual or {}
    try:
        path, keys = _container(model, manual)
        small, small_manual = _truncated(model, path, keys, manual)
        inputs = tuple(sample_inputs)
        whole = forward_record(model, inputs, param_dtype, manual, path, keys)
        few = forward_record(small, inputs, param_dtype, small_manual, path, keys[:TRACED])
        _same_forward(whole, few)
    except Unstampable as e:
        jg = trace_joint(model, sample_inputs, param_dtype, manual)
        jg.stamp_note = str(e)
        return jg
    jg4 = trace_joint(small, sample_inputs, param_dtype, small_manual)
    try:
        stamp = _Stamp(jg4, path, keys[:TRACED])
        stamp.check()
        gm, blocks = stamp.emit(len(keys), keys)
    except Unstampable as e:
        jg = trace_joint(model, sample_inputs, param_dtype, manual)
        jg.stamp_note = str(e)
        return jg
    pnames = [n for n, _ in model.named_parameters()]
    bnames = [n for n, _ in model.named_buffers()]
    jg = JointGraph(gm=gm, param_names=pnames, buffer_names=bnames,
                    num_inputs=jg4.num_inputs, blocks=blocks, manual_regions=dict(manual),
                    output_shape=jg4.output_shape, seconds=0.0)
    jg.traced_blocks = TRACED
    jg.traced_nodes = len(jg4.gm.graph.nodes)
    return joint_graph_of(jg, differentiable_inputs(sample_inputs), t0)


# ------------------------------------------------------------------ which models, and the copy
def _container(model: torch.nn.Module, manual: dict) -> tuple[str, list[str]]:
    """(qualified name of the container of alike blocks, its children's keys)."""
    children = _block_containers(model)
    parents = {name.rsplit(".", 1)[0] if "." in name else "" for name, _ in children}
    if len(parents) != 1:
        raise Unstampable(f"{len(parents)} containers of blocks")
    (path,) = parents
    if not path:
        raise Unstampable("the model itself is the container")
    keys = [name.rsplit(".", 1)[1] for name, _ in children]
    if len(keys) < MIN_BLOCKS:
        raise Unstampable(f"{len(keys)} blocks")
    mods = [m for _, m in children]

    def sig(m):
        return (type(m), [(n, tuple(p.shape), p.dtype, p.requires_grad)
                          for n, p in m.named_parameters()],
                [(n, tuple(b.shape), b.dtype) for n, b in m.named_buffers()])

    first = sig(mods[0])
    if any(sig(m) != first for m in mods[1:]):
        raise Unstampable("blocks differ in class, parameters or buffers")
    per_block = []
    for k in keys:
        prefix = f"{path}.{k}."
        per_block.append(sorted((q[len(prefix):], repr(r.to_json())) for q, r in manual.items()
                                if q.startswith(prefix)))
    if any(p != per_block[0] for p in per_block[1:]):
        raise Unstampable("blocks declare different manual regions")
    outside = [q for q in manual if not any(q.startswith(f"{path}.{k}.") for k in keys)]
    if any(q == path or path.startswith(q + ".") for q in outside):
        raise Unstampable("a manual region holds the blocks")
    return path, keys


def _truncated(model: torch.nn.Module, path: str, keys: list[str], manual: dict):
    """A shallow copy of `model` whose container holds its first TRACED blocks (the same module
    objects), and the manual regions that copy has."""
    names = path.split(".")
    root = copy.copy(model)
    root._modules = dict(model._modules)
    parent = root
    for n in names[:-1]:
        child = copy.copy(parent._modules[n])
        child._modules = dict(child._modules)
        parent._modules[n] = child
        parent = child
    container = parent._modules[names[-1]]
    few = copy.copy(container)
    few._modules = {k: container._modules[k] for k in keys[:TRACED]}
    parent._modules[names[-1]] = few
    dropped = tuple(f"{path}.{k}." for k in keys[TRACED:])
    return root, {q: r for q, r in manual.items() if not q.startswith(dropped)}


# ------------------------------------------------------------------ the forward, recorded
class _Recorder(TorchDispatchMode):
    """Every op the forward runs: (block or -1, op, argument descriptors, output metadata), a
    tensor argument described by where it came from relative to the block running the op."""

    def __init__(self, names: dict[int, tuple]):
        super().__init__()
        self.names = names  # id(tensor) -> ("param" | "buffer" | "input", relative name)
        self.made: dict[int, tuple[int, int, int]] = {}  # id -> (block, op index, output)
        self.keep: list = []  # produced tensors, alive so that ids are not reused
        self.block = -1
        self.ops: list[tuple] = []
        self.counts: dict[int, int] = defaultdict(int)  # ops recorded per block (-1: outside)

    def describe(self, a):
        if isinstance(a, torch.Tensor):
            i = id(a)
            if i in self.made:
                b, j, k = self.made[i]
                if b < 0:
                    return ("global", j, k)
                if self.block < 0:
                    return ("block", b, j, k)  # resolved against the first/last block later
                return ("from", self.block - b, j, k)
            if i in self.names:
                return self.names[i]
            return ("tensor", tuple(a.shape), str(a.dtype))
        if isinstance(a, (list, tuple)):
            return tuple(self.describe(x) for x in a)
        if isinstance(a, dict):
            return tuple(sorted((k, self.describe(v)) for k, v in a.items()))
        return repr(a)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        index = self.counts[self.block]
        self.counts[self.block] += 1
        desc = (self.describe(args), self.describe(kwargs))
        flat = out if isinstance(out, (tuple, list)) else (out,)
        meta = []
        for k, o in enumerate(flat):
            if isinstance(o, torch.Tensor):
                if id(o) not in self.made and id(o) not in self.names:
                    self.made[id(o)] = (self.block, index, k)
                    self.keep.append(o)
                meta.append((tuple(o.shape), o.dtype, tuple(o.stride())))
            else:
                meta.append(repr(o))
        self.ops.append((self.block, str(func), desc, tuple(meta)))
        return out


def forward_record(model: torch.nn.Module, inputs, param_dtype, manual: dict, path: str,
                   keys: list[str]) -> dict:
    """The model's forward on meta tensors, recorded op by op: {"before": global ops before the
    first block, "blocks": one record per block, "after": global ops after the last}."""
    rel = {}
    for i, k in enumerate(keys):
        rel[f"{path}.{k}."] = i
    names: dict[int, tuple] = {}
    state = {}

    def relative(kind: str, n: str) -> tuple:
        for p, i in rel.items():
            if n.startswith(p):
                return (kind, n[len(p):])
        return (kind, "/" + n)

    for n, p in model.named_parameters():
        state[n] = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype, device="meta")
    state = _cast(state, param_dtype)
    for n, t in state.items():
        names[id(t)] = relative("param", n)
    for n, b in model.named_buffers():
        state[n] = torch.empty_strided(b.shape, b.stride(), dtype=b.dtype, device="meta")
        names[id(state[n])] = relative("buffer", n)
    meta_inputs = tuple(torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
                        for x in inputs)
    for i, x in enumerate(meta_inputs):
        names[id(x)] = ("input", str(i))
    rec = _Recorder(names)
    modules = dict(model.named_modules())
    handles = []

    def enter(i):
        def hook(mod, args):
            rec.block = i
        return hook

    def leave(mod, args, out):
        rec.block = -1

    try:
        for i, k in enumerate(keys):
            m = modules[f"{path}.{k}"]
            handles.append(m.register_forward_pre_hook(enter(i)))
            handles.append(m.register_forward_hook(leave))
        kwargs = flex_kwargs(model)
        with regions_as_ops(model, manual), flex_as_ops(model), torch.no_grad(), rec:
            torch.func.functional_call(model, state, meta_inputs, kwargs)
    except (Unstampable, ManualRegionError):  # a region its tensors cannot take: says which
        raise
    except Exception as e:  # data-dependent code, or an op meta tensors cannot run
        raise Unstampable(f"its forward does not run on meta tensors ({type(e).__name__})")
    finally:
        for h in handles:
            h.remove()
    blocks: list[list] = [[] for _ in keys]
    before, after = [], []
    seen_block = False
    for b, *op in rec.ops:
        if b >= 0:
            seen_block = True
            blocks[b].append(tuple(op))
        else:
            (after if seen_block else before).append(tuple(op))
    return {"before": before, "blocks": blocks, "after": after, "n": len(keys)}


def _ends(ops: list, n: int) -> list:
    """`ops` with a block named by its position ("block", b, ...) named from the end for the
    last block: what is the same for any number of blocks."""
    def fix(d):
        if isinstance(d, tuple) and d and d[0] == "block":
            return ("block", "first" if d[1] == 0 else ("last" if d[1] == n - 1 else d[1]),
                    *d[2:])
        if isinstance(d, tuple):
            return tuple(fix(x) for x in d)
        return d
    return [fix(op) for op in ops]


def _same_forward(whole: dict, few: dict) -> None:
    """Raise Unstampable unless the whole model's forward is what stamping assumes: each block
    after the first as the copy's block 1, the first as its block 0, and the same ops before
    and after the blocks."""
    wb, fb = whole["blocks"], few["blocks"]
    if not all(wb) or not all(fb):
        raise Unstampable("a block ran no op")
    if _ends(whole["before"], whole["n"]) != _ends(few["before"], few["n"]):
        raise Unstampable("the ops before the blocks depend on the number of blocks")
    if _ends(whole["after"], whole["n"]) != _ends(few["after"], few["n"]):
        raise Unstampable("the ops after the blocks depend on the number of blocks")
    if wb[0] != fb[0]:
        raise Unstampable("the first block runs differently in the whole model")
    for i, ops in enumerate(wb[1:], 1):
        if ops != fb[1]:
            raise Unstampable(f"block {i} runs other ops than block 1")


# ------------------------------------------------------------------ the graph, stamped
class _Stamp:
    """The four-block graph as runs of nodes, each a block's or global, and the emitter that
    repeats the block runs for any number of blocks."""

    def __init__(self, jg: JointGraph, path: str, keys: list[str]):
        self.jg, self.path, self.keys = jg, path, keys
        self.nodes = list(jg.gm.graph.nodes)
        if any(n.op == "get_attr" for n in self.nodes):
            raise Unstampable("the graph holds constants")
        self.out = self.nodes[-1]
        if self.out.op != "output":
            raise Unstampable("the graph does not end in its output")
        self.block_of_name = {f"{path}.{k}": i for i, k in enumerate(keys)}
        self._label()
        self._runs()

    # which block each node belongs to
    def _param_block(self, name: str) -> int | None:
        for q, i in self.block_of_name.items():
            if name.startswith(q + "."):
                return i
        return None

    def _label(self) -> None:
        jg, nodes = self.jg, self.nodes
        pos = {n: i for i, n in enumerate(nodes)}
        span: dict[int, tuple[int, str]] = {}
        for bt in jg.blocks:
            b = self.block_of_name.get(bt.name)
            if b is None:
                raise Unstampable(f"a block outside the container: {bt.name}")
            for kind, (s, e) in (("F", bt.fwd), ("B", bt.bwd)):
                for i in range(max(s, 0), max(e, 0)):
                    span[i] = (b, kind)
        placeholder_block = {}
        for name, node in {**jg.param_nodes, **jg.buffer_nodes}.items():
            placeholder_block[node] = self._param_block(name)
        # forward association: outside the spans, what derives from one block's parameters only
        fwd: dict[fx.Node, object] = {}
        for n in nodes[:-1]:
            if n.op == "placeholder":
                fwd[n] = placeholder_block.get(n)
            elif pos[n] in span:
                fwd[n] = "span"
            else:
                src = {fwd[a] for a in n.all_input_nodes}
                src.discard("const")
                fwd[n] = ("const" if not src else
                          src.pop() if len(src) == 1 and isinstance(next(iter(src)), int)
                          else None)
        # backward association: what feeds only one block's parameters' gradients
        grad_block: dict[int, int | None] = {}
        flat = torch.utils._pytree.tree_leaves(self.out.args[0])
        for j, name in enumerate(jg.param_names):
            grad_block[1 + j] = self._param_block(name)
        feeds: dict[fx.Node, set] = defaultdict(set)
        for i, v in enumerate(flat):
            if isinstance(v, fx.Node):
                feeds[v].add(grad_block.get(i))
        bwd: dict[fx.Node, object] = {}
        for n in reversed(nodes[:-1]):
            if n.op == "placeholder" or pos[n] in span:
                continue
            to = set(feeds.get(n, ()))
            for u in n.users:
                if u is self.out:
                    continue
                to.add(bwd.get(u, "span" if pos[u] in span else None))
            bwd[n] = to.pop() if len(to) == 1 and isinstance(next(iter(to)), int) else None
        # (block or None, kind): P a placeholder, F forward, B backward, and outside the spans
        # OF (from one block's parameters: their casts) or OB (into one block's gradients)
        self.label: dict[fx.Node, tuple[int | None, str]] = {}
        for n in nodes[:-1]:
            if n.op == "placeholder":
                self.label[n] = (placeholder_block.get(n), "P")
            elif pos[n] in span:
                self.label[n] = span[pos[n]]
            else:
                f = fwd[n] if isinstance(fwd[n], int) else None
                b = bwd.get(n)
                if f is not None and b is not None and f != b:
                    raise Unstampable(f"{n.name} belongs to two blocks")
                self.label[n] = (f, "OF") if f is not None else (b, "OB")

    # runs and bundles
    def _runs(self) -> None:
        """Split the nodes into runs, each a block's or global; the block runs come in bundles,
        one run per block in block order or in reverse. A run is one side of a block (its
        placeholders, its forward with its parameters' casts, or its backward with its
        gradients' casts), and its kinds may differ at its ends: the first block's backward
        span ends where its input's gradient is made, before its weights' last gradient op."""
        runs: list[tuple[int | None, list[fx.Node]]] = []
        side = {"P": "P", "F": "F", "OF": "F", "B": "B", "OB": "B"}
        last = None
        for n in self.nodes[:-1]:
            b, kind = self.label[n]
            key = (b, side[kind]) if b is not None else None
            if runs and key == last:
                runs[-1][1].append(n)
            else:
                runs.append((b, [n]))
            last = key
        self.segments: list = []  # ("G", nodes) or ("bundle", ascending, [run per block])
        self.where: dict[fx.Node, tuple] = {}  # block node -> (bundle, position, block)
        i = 0
        n_blocks = len(self.keys)
        while i < len(runs):
            b, ns = runs[i]
            if b is None:
                self.segments.append(("G", ns))
                i += 1
                continue
            group = runs[i:i + n_blocks]
            order = [g[0] for g in group]
            if len(group) < n_blocks or order not in (list(range(n_blocks)),
                                                      list(range(n_blocks))[::-1]):
                raise Unstampable(f"{ns[0].name}: the blocks' nodes are not one run per block "
                                  "in order")
            per_block = [None] * n_blocks
            for bb, ns_ in group:
                per_block[bb] = ns_
            ops = {tuple((n.op, n.op == "placeholder" or str(n.target)) for n in ns_)
                   for ns_ in per_block}
            if len(ops) != 1:
                raise Unstampable(f"{ns[0].name}: the blocks' runs differ")
            bundle = len(self.segments)
            for bb, ns_ in enumerate(per_block):
                for p, n in enumerate(ns_):
                    self.where[n] = (bundle, p, bb)
            self.segments.append(("bundle", order[0] == 0, per_block))
            i += n_blocks

    # emitting
    def emit(self, n_blocks: int, keys: list[str]) -> tuple[fx.GraphModule, list[BlockTrace]]:
        """The graph for `n_blocks` blocks named by `keys`, and its block spans."""
        last = len(self.keys) - 1
        graph = fx.Graph()
        made: dict[tuple, fx.Node] = {}  # ("g", name) or (bundle, position, block) -> node
        spans: dict[int, dict[str, list[int]]] = defaultdict(dict)
        count = 0

        def ref_of(a: fx.Node, tb: int | None, target: int | None):
            """The emitted node standing for `a`, read by a node of template block `tb` that is
            emitted as block `target` (None for both: a global node)."""
            if a not in self.where:
                return made[("g", a.name)]
            bundle, p, b = self.where[a]
            if target is None:  # a global node reads the first or the last block
                if b == 0:
                    want = 0
                elif b == last:
                    want = n_blocks - 1
                else:
                    raise Unstampable(f"{a.name} of a middle block is read outside the blocks")
            else:
                if abs(b - tb) > 1:
                    raise Unstampable("a block reads a block beyond its neighbours")
                want = target + (b - tb)
            return made[(bundle, p, want)]

        def mapped(x, tb, target):
            if isinstance(x, fx.Node):
                return ref_of(x, tb, target)
            if isinstance(x, str) and target is not None:
                return self._renamed(x, tb, target, keys)
            if isinstance(x, (list, tuple)):
                return type(x)(mapped(y, tb, target) for y in x)
            if isinstance(x, dict):
                return {k: mapped(v, tb, target) for k, v in x.items()}
            return x

        def add(n: fx.Node, tb, target):
            args = mapped(n.args, tb, target)
            kwargs = mapped(n.kwargs, tb, target)
            if n.op == "placeholder":
                new = graph.placeholder(_candidate(graph, n))
                new.target = new.name  # as tracing names it: the target is the name
            else:
                new = graph.create_node(n.op, n.target, args, kwargs, name=_candidate(graph, n))
            new.meta = dict(n.meta)
            return new

        try:
            for seg in self.segments:
                if seg[0] == "G":
                    for n in seg[1]:
                        made[("g", n.name)] = add(n, None, None)
                        count += 1
                    continue
                _, ascending, per_block = seg
                order = range(n_blocks) if ascending else range(n_blocks - 1, -1, -1)
                bundle = self.segments.index(seg)
                for target in order:
                    tb = 0 if target == 0 else (last if target == n_blocks - 1 else 1)
                    for p, n in enumerate(per_block[tb]):
                        made[(bundle, p, target)] = add(n, tb, target)
                        kind = self.label[n][1]
                        if kind in ("F", "B"):
                            span = spans[target].setdefault(kind, [count, count])
                            if span[1] != count:
                                raise Unstampable(f"block {target}'s {kind} span is split")
                            span[1] = count + 1
                        count += 1
            out_args = self._output_args(n_blocks, keys, ref_of)
        except KeyError as e:
            raise Unstampable(f"a node is read before it is made ({e})") from None
        graph.output(out_args)
        with _use_lazy_graph_module(True):
            gm = _make_graph_module(self.jg.gm, graph)
        sig = self.jg.blocks[0].signature if self.jg.blocks else ""
        blocks = []
        for i, k in enumerate(keys):
            bt = BlockTrace(f"{self.path}.{k}", sig)
            if "F" in spans[i]:
                bt.fwd = tuple(spans[i]["F"])
            if "B" in spans[i]:
                bt.bwd = tuple(spans[i]["B"])
            blocks.append(bt)
        return gm, blocks

    def _renamed(self, s: str, tb: int, target: int, keys: list[str]) -> str:
        """A string argument naming something inside template block `tb` (a manual region's
        qualified name), renamed into block `target`."""
        q = f"{self.path}.{self.keys[tb]}"
        if s == q or s.startswith(q + "."):
            return f"{self.path}.{keys[target]}" + s[len(q):]
        for other in self.keys:
            o = f"{self.path}.{other}"
            if s == o or s.startswith(o + "."):
                raise Unstampable("a block names another block")
        return s

    def _output_args(self, n_blocks: int, keys: list[str], ref_of):
        """The output: the model output, one gradient per parameter of the whole model in its
        order, then the inputs' gradients."""
        (args,) = self.out.args
        flat, spec = torch.utils._pytree.tree_flatten(args)
        names = self.jg.param_names
        if spec.num_leaves != len(flat) or not isinstance(args, (list, tuple)) or \
                len(flat) != len(args):
            raise Unstampable("the output is not a flat list")
        first = 1
        grads = flat[first:first + len(names)]
        rest = flat[first + len(names):]
        out = [self._global_or_block(flat[0], ref_of)]
        last = len(self.keys) - 1
        by_block: dict[int, list] = defaultdict(list)
        before, after = [], []
        for name, g in zip(names, grads):
            b = self._param_block(name)
            if b is None:
                (after if by_block else before).append(g)
            else:
                by_block[b].append(g)
        out += [self._global_or_block(g, ref_of) for g in before]
        for target in range(n_blocks):
            tb = 0 if target == 0 else (last if target == n_blocks - 1 else 1)
            for g in by_block[tb]:
                out.append(ref_of(g, tb, target) if isinstance(g, fx.Node) and g in self.where
                           else self._global_or_block(g, ref_of))
        out += [self._global_or_block(g, ref_of) for g in after]
        out += [self._global_or_block(g, ref_of) for g in rest]
        return type(args)(out)

    def _global_or_block(self, g, ref_of):
        return ref_of(g, None, None) if isinstance(g, fx.Node) else g

    def check(self) -> None:
        """Stamp the traced blocks again and compare with the traced graph, node for node."""
        gm, blocks = self.emit(len(self.keys), self.keys)
        mine = list(gm.graph.nodes)
        if len(mine) != len(self.nodes):
            raise Unstampable("stamping the traced blocks changes the node count")
        for a, b in zip(mine, self.nodes):
            if (a.name, a.op, a.target) != (b.name, b.op, b.target) or \
                    _names(a.args) != _names(b.args) or _names(a.kwargs) != _names(b.kwargs) or \
                    _shape(a.meta.get("val")) != _shape(b.meta.get("val")):
                raise Unstampable(f"stamping the traced blocks changes {b.name}")
        for x, y in zip(blocks, self.jg.blocks):
            if (x.name, x.fwd, x.bwd) != (y.name, y.fwd, y.bwd):
                raise Unstampable("stamping the traced blocks moves a block's span")


def _names(x):
    if isinstance(x, fx.Node):
        return ("node", x.name)
    if isinstance(x, (list, tuple)):
        return tuple(_names(y) for y in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _names(v)) for k, v in x.items()))
    return repr(x)


def _shape(v):
    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.dtype, tuple(v.stride()))
    if isinstance(v, (list, tuple)):
        return tuple(_shape(x) for x in v)
    return repr(v)


_NUMBERED = re.compile(r"^(.*)_(\d+)$")


def _candidate(graph: fx.Graph, n: fx.Node) -> str:
    """The name tracing asks FX for when it makes a node like `n` (FX numbers it): an op's
    name as make_fx gives it, a placeholder's own name with its number."""
    if n.op == "placeholder":
        return n.name
    target = n.target
    if isinstance(target, torch._ops.OpOverload):
        return graph._target_to_str(target.overloadpacket.__name__)
    if target is operator.getitem:
        return graph._target_to_str(target)
    m = _NUMBERED.match(n.name)
    return m.group(1) if m else n.name
