"""What the training loop itself communicates each step, outside the model's graph, and its price.

A trainer issues a few collectives of its own every step: TorchTitan sums the batch's valid tokens
over the data-parallel ranks, reduces the gradient norm for clipping over every mesh dim the
gradients are split on, and, on the steps it logs, sums and maxes the loss. They are tiny (a
few bytes), so each costs about one collective's latency plus what a call costs inside a step
(`Hardware.collective_step_overhead`); on CPU ranks that is 5-10 ms apiece, and five of them a
step is a few percent of a small model's step. They are the same for every plan of one job, so
they move the predicted step of the plan and of each recipe alike and never the choice.

Owns `LoopCollective` (one such collective: kind, bytes, the mesh dims it spans, how many per
step) and `loop_seconds` (their price per step on a `Topology`, one call per listed mesh dim of
size > 1). The trainer's own list is `titan/loop_collectives.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from titan_autopar.cost.comm import Topology


@dataclass(frozen=True)
class LoopCollective:
    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all
    nbytes: int  # the tensor as the collective sees it
    dims: tuple[str, ...]  # the mesh dims it spans: one call per dim (of size > 1)
    per_step: float = 1.0  # calls per step (1 / log_freq for what runs on logged steps)
    what: str = ""  # for people: why the loop issues it


def loop_seconds(topo: Topology, names, items) -> float:
    """Seconds per step of the loop's own collectives on this mesh."""
    total = 0.0
    for c in items:
        for d in c.dims:
            if d in names:
                total += c.per_step * topo.collective_time(c.kind, list(names).index(d), c.nbytes)
    return total
