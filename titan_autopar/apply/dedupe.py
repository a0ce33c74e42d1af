"""One gather per parameter and placement: repeated parameter-only computations run once.

The recorded program redistributes per edge of the plan, so a parameter read in the forward and
again by a backward op (a norm's weight in its own derivative) is gathered twice, by two
identical chains of local ops and collectives on the parameter shard. `dedupe_state_values`
keeps the first of each set of identical nodes that depend on parameters and buffers alone
(same op, same arguments, same inputs after deduplication) and points the others' readers at
it. Functional collectives are pure, and every rank runs the same program, so every rank
removes the same ones and the values are unchanged. What happens to the kept copy is then
`apply/partition.py`'s to decide: saved for the backward when the plan keeps gathered
parameters, gathered again there when it reshards after the forward.
"""

from __future__ import annotations

import torch.fx as fx


def _key(n: fx.Node, canon: dict[fx.Node, fx.Node]):
    def norm(a):
        if isinstance(a, fx.Node):
            return ("node", canon.get(a, a).name)
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(norm(x) for x in a))
        if isinstance(a, dict):
            return ("dict", tuple(sorted((k, norm(v)) for k, v in a.items())))
        return ("const", repr(a))

    return (str(n.target), norm(n.args), norm(n.kwargs))


def dedupe_state_values(gm: fx.GraphModule, n_state: int) -> int:
    """Merge identical nodes computed from the first `n_state` placeholders (parameters and
    buffers) alone, in place; returns how many were removed."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    state: set[fx.Node] = set(phs[:n_state])
    canon: dict[fx.Node, fx.Node] = {}
    first: dict[tuple, fx.Node] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function" or not n.all_input_nodes:
            continue
        if not all(canon.get(a, a) in state for a in n.all_input_nodes):
            continue
        schema = getattr(n.target, "_schema", None)
        if (schema is not None and schema.is_mutable) or "rand" in str(n.target):
            continue  # an op that writes or draws is not a value to share
        key = _key(n, canon)
        if key in first:
            canon[n] = first[key]
        else:
            first[key] = n
            state.add(n)
    for n, keep in canon.items():
        n.replace_all_uses_with(keep)
    for n in reversed(list(gm.graph.nodes)):
        if n in canon and not n.users:
            gm.graph.erase_node(n)
    gm.graph.lint()
    gm.recompile()
    return len(canon)
