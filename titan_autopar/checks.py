"""Arguments of the public API, checked before any work: each failure a ValueError that names the
argument, what was given and what to pass instead.

`plan_model` calls these before tracing (seconds to minutes on a large model), so a mistyped
budget or a batch the data-parallel ranks cannot split stops at once. `traced_model_error`
turns a failure inside the model's own forward on the sample inputs (a bare assertion in the
model code, say) into one message that says where it happened.
"""

from __future__ import annotations

import math
import traceback

import torch
from torch.distributed.tensor.placement_types import Placement, Shard


def positive_number(name: str, value, *, allow_none: bool = True, most: float = math.inf) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__}): pass "
                         f"e.g. {name}=80")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number above 0, got {value!r}")
    if value > most:
        raise ValueError(f"{name} must be at most {most:.0f}, got {value!r}")


def tensor_inputs(sample_inputs) -> tuple[torch.Tensor, ...]:
    if isinstance(sample_inputs, torch.Tensor):
        sample_inputs = (sample_inputs,)
    if not isinstance(sample_inputs, (tuple, list)) or not sample_inputs:
        raise ValueError("sample_inputs must be a tensor or a tuple of tensors (the model's "
                         f"positional inputs at their global shape), got {type(sample_inputs).__name__}")
    for i, x in enumerate(sample_inputs):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"sample_inputs[{i}] is a {type(x).__name__}, not a tensor")
    return tuple(sample_inputs)


def placement_list(name: str, given, count: int, ndim: int) -> list[tuple[Placement, ...]]:
    """`given` as one tuple of `ndim` Placements per tensor (`count` of them)."""
    example = "[(" + ", ".join(["Shard(0)"] + ["Replicate()"] * (ndim - 1)) + ",)]"
    if not isinstance(given, (list, tuple)) or isinstance(given, str):
        raise ValueError(f"{name} must be a list with one tuple of placements per tensor, e.g. "
                         f"{example}; got a {type(given).__name__}")
    if len(given) != count:
        raise ValueError(f"{name}: {len(given)} given for {count} tensors; give one tuple per tensor")
    out = []
    for i, pl in enumerate(given):
        if not isinstance(pl, (list, tuple)):
            raise ValueError(f"{name}[{i}] must be a tuple of placements, one per mesh dim, e.g. "
                             f"{example[1:-1]}; got {pl!r}")
        if len(pl) != ndim:
            raise ValueError(f"{name}[{i}] has {len(pl)} placements; the mesh has {ndim} dims: "
                             "give one per dim")
        for p in pl:
            if not isinstance(p, Placement):
                raise ValueError(f"{name}[{i}] holds {p!r}, not a placement: use Shard(d), "
                                 "Replicate() or Partial() from torch.distributed.tensor")
        out.append(tuple(pl))
    return out


def even_split(name: str, x: torch.Tensor, placements, dim_names, sizes) -> None:
    """Each tensor dim sharded by `placements` must split evenly over the ranks sharding it."""
    ways = [1] * x.ndim
    for p, n, k in zip(placements, dim_names, sizes):
        if isinstance(p, Shard):
            if p.dim >= x.ndim:
                raise ValueError(f"{name}: Shard({p.dim}) over {n}, but the tensor has "
                                 f"{x.ndim} dims (shape {tuple(x.shape)})")
            ways[p.dim] *= k
    for d, w in enumerate(ways):
        if w > 1 and x.shape[d] % w:
            over = [f"{n}={k}" for p, n, k in zip(placements, dim_names, sizes)
                    if isinstance(p, Shard) and p.dim == d]
            what = "batch" if d == 0 else f"dim {d}"
            raise ValueError(f"{name} has {what} {x.shape[d]}, which the {w} ranks of "
                             f"{', '.join(over)} do not divide: give a {what} that is a "
                             f"multiple of {w}")


def token_inputs(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    """A TorchTitan-style model (it has `tok_embeddings`) takes (batch, seq) integer token ids
    no longer than its `model_args.max_seq_len`."""
    if not isinstance(getattr(model, "tok_embeddings", None), torch.nn.Embedding):
        return
    x = inputs[0]
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise ValueError(f"sample_inputs[0] is {str(x.dtype).removeprefix('torch.')}; this model "
                         "embeds integer token ids: pass torch.zeros(batch, seq, dtype=torch.long)")
    if x.ndim != 2:
        raise ValueError(f"sample_inputs[0] has shape {tuple(x.shape)}; this model takes token "
                         "ids shaped (batch, seq), e.g. torch.zeros(8, 2048, dtype=torch.long)")
    limit = getattr(getattr(model, "model_args", None), "max_seq_len", None)
    if isinstance(limit, int) and x.shape[1] > limit:
        raise ValueError(f"sample_inputs[0] has sequence length {x.shape[1]}, longer than the "
                         f"model's max_seq_len {limit}: shorten the sequence or build the model "
                         f"with max_seq_len >= {x.shape[1]}")


def traced_model_error(e: BaseException, inputs) -> ValueError:
    """A failure while tracing the model on its sample inputs, as one message naming where."""
    frames = traceback.extract_tb(e.__traceback__)
    where = ""
    for f in reversed(frames):
        if "titan_autopar" not in f.filename and "/torch/" not in f.filename:
            where = f" at {f.filename}:{f.lineno} ({(f.line or '').strip()})"
            break
    shapes = ", ".join(f"{tuple(x.shape)} {str(x.dtype).removeprefix('torch.')}" for x in inputs)
    text = str(e) or "(no message)"
    return ValueError(
        f"the model's forward failed on the sample inputs [{shapes}]: {type(e).__name__}: {text}"
        f"{where}. Check the inputs' shapes and dtypes against what the model expects; if the "
        "model runs on one device with these inputs, report this with TITAN_AUTOPAR_TRACEBACK=1")


def pin_against_declaration(name: str, pin, declared, dim_names) -> None:
    """A parameter pin may not contradict a manual region's declaration for that parameter."""
    if declared is None:
        return
    for n, want, have in zip(dim_names, declared, pin):
        if want is not None and have is not None and want != have:
            raise ValueError(f"parameter_placements[{name!r}] puts it {have} on {n}, but its "
                             f"manual region declares {want} there: pin it {want} on {n}, or "
                             "leave that dim out")
