"""Identical repeated blocks, found so that one block's decisions serve them all.

Owns `find_blocks`: blocks (children of a ModuleList/ModuleDict) whose parameter signature and
whose traced forward and backward node sequences (op and output shape, in order; a manual
region's declaration too) are equal form one *class*. Every node of such a block maps to the node at the same position in the class's
first block (its *representative*), and every parameter maps to the representative block's
parameter of the same relative name. The integer program then has one variable set per
representative, and its costs are counted once per member. Also `bucket_groups`: which
parameters the program gathers and reduces together (a block's; the rest as two groups).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.fx as fx

from titan_autopar.graph.manual_ops import OPS, region_name
from titan_autopar.graph.trace import BlockTrace, JointGraph


@dataclass
class Blocks:
    rep: dict[fx.Node, fx.Node]  # every node -> its representative (itself if unshared)
    count: dict[fx.Node, int]  # representative -> how many nodes it stands for
    block_of: dict[fx.Node, str]  # representative node -> block class name ("" outside blocks)
    classes: dict[str, list[str]]  # class name (its first block) -> member block names
    param_rep: dict[str, str]  # parameter name -> representative parameter name


def _node_key(n: fx.Node, manual: dict) -> tuple:
    val = n.meta.get("val")
    shape = tuple(val.shape) if isinstance(val, torch.Tensor) else None
    if n.op == "call_function" and n.target in OPS:  # a region's declaration is part of it
        return (str(n.target), shape, json.dumps(manual[region_name(n)].to_json(), sort_keys=True))
    return (str(n.target), shape)


def _share_outside(nodes: list[fx.Node], keys: list[tuple], rep: dict, block_of: dict) -> None:
    """Nodes outside every block span that do the same op on representative-equal inputs --
    the mixed-precision cast of each block's parameters before the forward, and the cast of its
    gradient back after the backward -- share a representative too, which belongs to the block
    class of its inputs. Without this, each layer's casts are units of their own, and the
    parameter communication they carry is hidden behind the wrong group's compute."""
    first: dict[tuple, fx.Node] = {}
    for n, key in zip(nodes, keys):
        if n.op != "call_function" or n in block_of or rep[n] is not n:
            continue
        sig = (key, _args_sig(n.args, rep), _args_sig(n.kwargs, rep))
        r = first.setdefault(sig, n)
        # only ops reading a block member's value join (two equal ops on the very same inputs
        # stay apart, as before); the backward meets the last layer first, so either may
        if r is not n and (_reads_shared(n, rep) or _reads_shared(r, rep)):
            rep[n] = r
            cls = next((block_of[rep[a]] for a in n.all_input_nodes if rep[a] in block_of), None)
            if cls is not None:
                block_of[r] = cls


def _reads_shared(n: fx.Node, rep: dict) -> bool:
    return any(rep[a] is not a for a in n.all_input_nodes)


def _args_sig(a, rep: dict):
    """Arguments with each node replaced by its representative's name (hashable)."""
    if isinstance(a, fx.Node):
        return ("node", rep[a].name)
    if isinstance(a, (list, tuple)):
        return tuple(_args_sig(x, rep) for x in a)
    if isinstance(a, dict):
        return tuple(sorted((k, _args_sig(v, rep)) for k, v in a.items()))
    return repr(a)


def find_blocks(jg: JointGraph) -> Blocks:
    nodes = list(jg.gm.graph.nodes)
    keys = [_node_key(n, jg.manual_regions) for n in nodes]

    def seq(span: tuple[int, int]) -> list[tuple]:
        return keys[span[0] : span[1]]

    # group blocks into classes: same signature and identical node sequences
    classes: dict[str, list[BlockTrace]] = {}
    for b in jg.blocks:
        if b.bwd[0] < 0 or b.bwd[1] < 0:
            classes[b.name] = [b]
            continue
        for members in classes.values():
            first = members[0]
            if (
                first.signature == b.signature
                and first.bwd[0] >= 0
                and seq(first.fwd) == seq(b.fwd)
                and seq(first.bwd) == seq(b.bwd)
            ):
                members.append(b)
                break
        else:
            classes[b.name] = [b]

    rep = {n: n for n in nodes}
    block_of: dict[fx.Node, str] = {}
    param_rep = {p: p for p in jg.param_names}
    for cname, members in classes.items():
        first = members[0]
        for span_name in ("fwd", "bwd"):
            f0 = getattr(first, span_name)
            if f0[0] < 0:
                continue
            for i in range(f0[0], f0[1]):
                block_of[nodes[i]] = cname
            for b in members[1:]:
                s = getattr(b, span_name)
                for i in range(s[1] - s[0]):
                    rep[nodes[s[0] + i]] = nodes[f0[0] + i]
        prefix0 = first.name + "."
        for b in members[1:]:
            prefix = b.name + "."
            for p in jg.param_names:
                if p.startswith(prefix):
                    q = prefix0 + p[len(prefix):]
                    param_rep[p] = q
                    rep[jg.param_nodes[p]] = jg.param_nodes[q]
        for p in jg.param_names:
            if p.startswith(prefix0):
                block_of[jg.param_nodes[p]] = cname

    _share_outside(nodes, keys, rep, block_of)
    count: dict[fx.Node, int] = defaultdict(int)
    for n in nodes:
        count[rep[n]] += 1
    return Blocks(
        rep=rep,
        count=dict(count),
        block_of=block_of,
        classes={c: [b.name for b in m] for c, m in classes.items()},
        param_rep=param_rep,
    )


def bucket_groups(param_names: list[str], blocks: list[str]) -> dict[str, str]:
    """Each parameter's merge group: the repeated block it belongs to; else, as TorchTitan's
    FSDP recipe groups the root's parameters, those before the first block's (the embedding)
    and those after it (the final norm and the output) as two groups."""
    def block(p: str) -> str | None:
        return max((b for b in blocks if p.startswith(b + ".")), key=len, default=None)

    first = next((i for i, p in enumerate(param_names) if block(p) is not None), len(param_names))
    return {p: block(p) or ("(before the blocks)" if i < first else "(after the blocks)")
            for i, p in enumerate(param_names)}
