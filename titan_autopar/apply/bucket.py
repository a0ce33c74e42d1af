"""Fewer, larger collectives: parameter all-gathers and gradient reduce-scatters per block.

The recorded program gathers each parameter shard and reduce-scatters each gradient on its
own, one collective per tensor. A collective costs a fixed latency on top of its bytes, so,
like FSDP's per-block groups, `bucket_collectives` merges them:

- all-gathers of parameter shards (inputs computed from parameters alone) that belong to the
  same block (`bucket_groups`: the parameters outside the blocks form two groups, those before
  the blocks and those after them) and mesh group become one: the flattened shards are
  concatenated, gathered once, and each gathered tensor is copied out of the (ranks,
  elements) result -- the same layout `all_gather_into_tensor` gives per tensor. The merged gather sits where the block's first
  gather was; the parameter views it needs move up with it (they read parameters only).
- reduce-scatters of one block's gradients become one, placed where the block's last one was;
  each rank's slice of every gradient is cut from the merged result, and the views between a
  gradient and the program's output move after it. Only reductions whose result feeds nothing
  but one gradient output are merged.

The values are bit-identical to the unmerged program: each element is reduced over the same
ranks in the same order.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from titan_autopar.graph.blocks import bucket_groups

aten = torch.ops.aten
c10d = torch.ops._c10d_functional
AG, RS, WAIT = c10d.all_gather_into_tensor.default, c10d.reduce_scatter_tensor.default, c10d.wait_tensor.default


def _waits(gm: fx.GraphModule, op) -> list[tuple[fx.Node, fx.Node]]:
    out = []
    for n in gm.graph.nodes:
        if n.op == "call_function" and n.target is op:
            users = list(n.users)
            if len(users) == 1 and users[0].target is WAIT:
                out.append((n, users[0]))
    return out


def _root_placeholder(n: fx.Node) -> fx.Node | None:
    """The placeholder `n` is a chain of single-input local ops on, or None (a chain through a
    collective -- the second dim of a 2-D gather -- is not a parameter shard)."""
    while n.op == "call_function":
        ins = n.all_input_nodes
        if len(ins) != 1 or "_c10d_functional" in str(n.target):
            return None
        n = ins[0]
    return n if n.op == "placeholder" else None


def _chain(n: fx.Node) -> list[fx.Node]:
    out = []
    while n.op == "call_function":
        out.append(n)
        n = n.all_input_nodes[0]
    return out[::-1]


def _new(g: fx.Graph, target, args: tuple) -> fx.Node:
    """A new call_function node with a name no other node has (`bucket_<op>_<k>`)."""
    taken = g.__dict__.get("_bucket_names")
    if taken is None:
        taken = g.__dict__["_bucket_names"] = {n.name for n in g.nodes}
    op, k = str(target).split(".")[-2], len(taken)
    while f"bucket_{op}_{k}" in taken:
        k += 1
    taken.add(f"bucket_{op}_{k}")
    return g.create_node("call_function", target, args, name=f"bucket_{op}_{k}")


def _meta(n: fx.Node) -> torch.Tensor:
    return n.meta["val"]


def _bucket_gathers(gm: fx.GraphModule, block_of) -> int:
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    groups: dict[tuple, list[tuple[fx.Node, fx.Node]]] = {}
    for ag, wait in _waits(gm, AG):
        root = _root_placeholder(ag.args[0])
        block = block_of(root.name) if root is not None else None
        if block is None:
            continue
        key = (block, ag.args[1], str(ag.args[2]), _meta(ag.args[0]).dtype)
        groups.setdefault(key, []).append((ag, wait))
    merged = 0
    g = gm.graph
    for (_, ws, _, _), members in groups.items():
        if len(members) < 2:
            continue
        order = {n: i for i, n in enumerate(g.nodes)}
        members.sort(key=lambda m: order[m[0]])
        first = members[0][0]
        for ag, _ in members:  # parameter views move up to the merged gather
            for v in _chain(ag.args[0]):
                if order[v] > order[first]:
                    first.prepend(v)
        sizes = [_meta(ag.args[0]).numel() for ag, _ in members]
        with g.inserting_before(first):
            flats = [_new(g, aten.reshape.default, (ag.args[0], [-1])) for ag, _ in members]
            cat = _new(g, aten.cat.default, (flats,))
            big = _new(g, AG, (cat, ws, first.args[2]))
            done = _new(g, WAIT, (big,))
            table = _new(g, aten.view.default, (done, [ws, sum(sizes)]))
            offset = 0
            for (ag, wait), size in zip(members, sizes):
                piece = _new(g, aten.slice.Tensor, (table, 1, offset, offset + size))
                out = _new(g, aten.reshape.default, (piece, list(_meta(wait).shape)))
                out.meta["val"] = _meta(wait)
                wait.replace_all_uses_with(out)
                offset += size
        for ag, wait in members:
            g.erase_node(wait)
            g.erase_node(ag)
        merged += len(members)
    return merged


def _gradient_path(wait: fx.Node, outputs: dict[fx.Node, int]) -> tuple[int, list[fx.Node]] | None:
    """(output index, the single-user chain from `wait` to it), if `wait` only feeds one output."""
    chain, n = [], wait
    while n not in outputs:
        users = list(n.users)
        if len(users) != 1 or users[0].op != "call_function" or "_c10d_functional" in str(users[0].target):
            return None  # (a reduction feeding another one, on a 2-D mesh, stays as it is)
        n = users[0]
        chain.append(n)
    return outputs[n], chain


def _bucket_reductions(gm: fx.GraphModule, block_of_grad) -> int:
    g = gm.graph
    out_node = next(n for n in g.nodes if n.op == "output")
    outputs = {a: i for i, a in enumerate(out_node.args[0]) if isinstance(a, fx.Node)}
    order = {n: i for i, n in enumerate(g.nodes)}
    groups: dict[tuple, list[tuple[fx.Node, fx.Node, list[fx.Node]]]] = {}
    for rs, wait in _waits(gm, RS):
        path = _gradient_path(wait, outputs)
        block = block_of_grad(path[0]) if path is not None else None
        if block is None:
            continue
        key = (block, rs.args[1], rs.args[2], str(rs.args[3]), _meta(rs.args[0]).dtype)
        groups.setdefault(key, []).append((rs, wait, path[1]))
    merged = 0
    for (_, op, ws, _, _), members in groups.items():
        if len(members) < 2:
            continue
        members.sort(key=lambda m: order[m[0]])
        last = members[-1][0]
        sizes = [_meta(rs.args[0]).numel() // ws for rs, _, _ in members]
        with g.inserting_before(last.next):
            rows = [_new(g, aten.reshape.default, (rs.args[0], [ws, -1])) for rs, _, _ in members]
            cat = _new(g, aten.cat.default, (rows, 1))
            flat = _new(g, aten.view.default, (cat, [ws * sum(sizes)]))
            big = _new(g, RS, (flat, op, ws, last.args[3]))
            done = _new(g, WAIT, (big,))
            offset = 0
            for (rs, wait, _), size in zip(members, sizes):
                piece = _new(g, aten.slice.Tensor, (done, 0, offset, offset + size))
                out = _new(g, aten.view.default, (piece, list(_meta(wait).shape)))
                out.meta["val"] = _meta(wait)
                wait.replace_all_uses_with(out)
                offset += size
        for rs, wait, chain in members:
            g.erase_node(wait)
            g.erase_node(rs)
            for v in chain:  # the gradient's views now follow the merged reduction
                out_node.prepend(v)
        merged += len(members)
    return merged


def bucket_collectives(forward: fx.GraphModule, backward: fx.GraphModule,
                       param_placeholders: dict[str, str], param_names: list[str],
                       blocks: list[str]) -> dict[str, int]:
    """Merge per block, in place. `param_placeholders` maps the joint graph's placeholder names
    to parameter names (the backward sees them as "saved_<name>"); the backward's outputs are
    the gradients of `param_names` in order; `blocks` are the repeated blocks' module names."""

    group = bucket_groups(param_names, blocks)

    def block_of(ph_name: str):
        p = param_placeholders.get(ph_name.removeprefix("saved_"))
        return group.get(p) if p is not None else None

    def block_of_grad(i: int):
        return group.get(param_names[i]) if i < len(param_names) else None

    counts = {"gathers_merged": 0, "reductions_merged": 0}
    for gm in (forward, backward):
        counts["gathers_merged"] += _bucket_gathers(gm, block_of)
    counts["reductions_merged"] = _bucket_reductions(backward, block_of_grad)
    for gm in (forward, backward):
        gm.graph.lint()
        gm.recompile()
    return counts
