"""What each mesh dim is *named* for, and TorchTitan's expert recipes as fixed parameter placements.

Owns the name conventions (TorchTitan's: dp_replicate, dp_shard, cp, tp, ...), the default input
placements a data loader implies (batch split over the data-parallel dims, sequence over cp), and
`recipe_placements`: the parameter placements of TorchTitan's hand-written recipes -- FSDP
(`fully_shard`: every parameter Shard(0) over the sharded data-parallel dims), HSDP (replicated
over dp_replicate) and TP with its column/row pattern on the tp dim -- so that a recipe can be
priced by the same model as a plan. The planner itself ignores names: it decides what each dim
carries.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

REPLICATE_DP = {"dp_replicate", "ddp", "replicate"}
SHARD_DP = {"dp_shard", "dp", "fsdp", "dp_shard_cp", "dp_cp", "data"}
CONTEXT = {"cp", "context"}
TENSOR = {"tp", "tensor", "model"}
EXPERT = {"ep"}  # carved out of the data-parallel ranks (TorchTitan's dp2ep): tokens split on it

# TorchTitan's TP plans: column-parallel (weight rows split) and row-parallel (columns split)
COLUMN = ("wq", "wk", "wv", "wq_b", "wkv_b", "w1", "w3", "output")
ROW = ("wo", "w2")
VOCAB_ROW = ("tok_embeddings",)

RECIPES = ("fsdp", "fsdp_tp")
KNOWN_DIMS = REPLICATE_DP | SHARD_DP | CONTEXT | TENSOR | EXPERT
DATA = REPLICATE_DP | SHARD_DP | EXPERT  # dims the batch is split over
EXPERT_WEIGHTS = ("experts.w1", "experts.w2", "experts.w3")


def check_dim_names(names) -> None:
    """Refuse mesh dim names the planner does not know: a name decides how the batch enters
    (split over data-parallel dims, sequence over cp) and which recipes are priced, so an
    unknown name would be planned as if it carried nothing."""
    for n in names:
        if n == "pp" or n in ("pipeline", "pp_rank"):
            raise ValueError(
                f"mesh dim {n!r}: pipeline stages are not planned on one mesh. Plan each stage "
                "on the mesh without pp (a TorchTitan job with pipeline_parallel_degree > 1 "
                "under auto = true does this itself), and leave pp out of --mesh")
        if n not in KNOWN_DIMS:
            raise ValueError(
                f"unknown mesh dim name {n!r}: the planner knows dp_replicate (and ddp, "
                f"replicate), dp_shard (and {', '.join(sorted(SHARD_DP - {'dp_shard'}))}), "
                f"cp (and context), tp (and tensor, model) and ep (expert parallel, out of the "
                "data-parallel ranks); name each dim by what it is for (e.g. --mesh "
                "dp_shard=8,tp=8)")


def default_input_placements(dim_names: tuple[str, ...], x: torch.Tensor) -> tuple[Placement, ...]:
    """Global batch split over the data-parallel dims (ep among them), sequence over cp,
    replicated elsewhere."""
    out: list[Placement] = []
    for n in dim_names:
        if n in DATA and x.ndim >= 1:
            out.append(Shard(0))
        elif n in CONTEXT and x.ndim >= 2:
            out.append(Shard(1))
        else:
            out.append(Replicate())
    return tuple(out)


def _tp_placement(name: str, shape: tuple[int, ...]) -> Placement:
    parts = name.split(".")
    if len(shape) != 2 or parts[-1] != "weight":
        return Replicate()
    owner = parts[-2] if len(parts) >= 2 else ""
    if owner in COLUMN or owner in VOCAB_ROW:
        return Shard(0)
    if owner in ROW:
        return Shard(1)
    return Replicate()


def _is_expert_weight(name: str, shape) -> bool:
    return len(shape) == 3 and name.endswith(EXPERT_WEIGHTS)


def recipe_placements(
    recipe: str, params: dict[str, tuple[int, ...]], dim_names: tuple[str, ...], sizes: tuple[int, ...]
) -> dict[str, tuple[Placement, ...]]:
    """Parameter placements of an expert recipe on this mesh ("fsdp" or "fsdp_tp"). With an ep
    dim, as TorchTitan's FSDP + EP: routed expert weights Shard(0) on ep (each rank its own
    experts) and FSDP over the other data-parallel ranks, on dim 0 while the experts divide,
    else dim 1; every other parameter FSDP over all data-parallel ranks, ep's included."""
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}: use one of {', '.join(RECIPES)}")
    out = {}
    order = sorted(range(len(dim_names)), key=lambda m: dim_names[m] not in EXPERT)  # ep first
    for name, shape in params.items():
        pl: list[Placement] = [Replicate()] * len(dim_names)
        split = [1] * len(shape)
        expert = _is_expert_weight(name, shape)
        for m in order:
            n, k = dim_names[m], sizes[m]
            if n in TENSOR and recipe == "fsdp_tp":
                p = _tp_placement(name, shape)
            elif n in EXPERT or n in SHARD_DP or n in CONTEXT or (n in TENSOR and recipe == "fsdp"):
                p = Shard(0) if shape else Replicate()
            else:
                p = Replicate()
            if isinstance(p, Shard) and shape[p.dim] % (split[p.dim] * k):
                p = Shard(1) if expert and n not in EXPERT and shape[1] % (split[1] * k) == 0 \
                    else Replicate()
            if isinstance(p, Shard):
                split[p.dim] *= k
            pl[m] = p
        out[name] = tuple(pl)
    return out
