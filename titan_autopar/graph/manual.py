"""Manual regions: modules whose distributed code their author wrote, which the planner does not
look inside.

`manual(module, in_placements=..., out_placements=..., param_placements=...)` marks a module
instance (the contract of DTensor's `local_map`): its forward receives and returns this rank's
local shards of tensors placed as declared, and its parameters as local tensors placed as
declared; it may issue its own collectives. The planner only sees the declaration: it plans
everything around the region and chooses where the region's parameters are *stored* on the
dims the declaration leaves open (`None`: gathered before the region runs, the gradient reduced
after, e.g. FSDP of expert weights outside `ep`).

Placements are given per mesh dim, either as a tuple (one per dim, in the mesh's order) or as a
dict {dim name: placement} (dims left out: Replicate). Each output has the shape and dtype of the
input at the same position (the first input where there are fewer inputs).

Built-in styles, for TorchTitan's MoE blocks (`MoE` modules: router, shared experts, routed
experts; the router sorts each rank's own tokens, so the block runs as a whole):
- "data_parallel": each rank's tokens in and out, the planner choosing per mesh dim whether the
  tokens are split (data-parallel) or whole on every rank; every parameter left to the planner
  (gathered for use). A MoE block nobody marked is planned this way.
- "torchtitan_ep": as "data_parallel", but the tokens are split on the `ep` dim, the routed
  experts' weights are Shard(0) there, and at run time TorchTitan's own `ExpertParallel` dispatches and combines tokens with
  all-to-alls on that dim (`apply/regions_run.py`).

`resolve_all(model, mesh_names, mesh_sizes)` turns the marks into per-dim placements for a mesh
(`Resolved`), with a clear error for a dim the mesh lacks, a tuple of the wrong length, or an ep
degree that does not divide the experts; it also records the shapes that price a MoE block.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from torch import nn
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

MARK = "_titan_autopar_manual"
STYLES = ("user", "data_parallel", "torchtitan_ep")
EXPERT_WEIGHTS = ("experts.w1", "experts.w2", "experts.w3")


class ManualRegionError(ValueError):
    """A manual region's declaration that cannot be used, naming the region."""


@dataclass(frozen=True)
class ManualSpec:
    """What `manual()` recorded: placements as given (tuples or dicts), or a built-in style."""

    in_placements: tuple = ()
    out_placements: tuple = ()
    param_placements: tuple = ()  # ((name, placements), ...)
    style: str = "user"


@dataclass
class Resolved:
    """A region's declaration on one mesh: one placement per mesh dim everywhere; a parameter's
    entry is None on a dim the planner chooses (the region sees it Replicate there)."""

    name: str
    style: str
    ins: list[tuple[Placement | None, ...]]  # None: the planner picks Shard(0) or Replicate
    outs: list[tuple[Placement | None, ...]]
    params: dict[str, tuple[Placement | None, ...]]  # every parameter of the module, in order
    n_out: int
    ep_dim: int | None = None  # the mesh dim of the style's all-to-alls
    extra: dict = field(default_factory=dict)
    mesh: tuple[tuple[str, int], ...] = ()  # (dim name, size) of the mesh it was resolved on

    def param_use(self, name: str) -> tuple[Placement, ...]:
        """How the region receives parameter `name`: its declared placement, Replicate where the
        planner chooses."""
        return tuple(Replicate() if p is None else p for p in self.params[name])

    def to_json(self) -> dict:
        """The declaration as a plan records it: "R", "S(d)", "P", null where the planner chooses."""
        def one(p):
            if p is None:
                return None
            return f"S({p.dim})" if isinstance(p, Shard) else "P" if isinstance(p, Partial) else "R"

        def pl(t):
            return [one(p) for p in t]

        return {"style": self.style, "in": [pl(t) for t in self.ins],
                "out": [pl(t) for t in self.outs],
                "params": {n: pl(t) for n, t in self.params.items()}}


def _as_tuple(x, what: str):
    if x is None:
        return ()
    if isinstance(x, (list, tuple)):
        return tuple(x)
    raise ManualRegionError(f"{what} must be a list with one entry per tensor, got "
                            f"{type(x).__name__}")


def manual(module: nn.Module, *, in_placements, out_placements,
           param_placements: dict | None = None) -> nn.Module:
    """Mark `module` (in place; returned) as a manual region: see the module docstring."""
    if not isinstance(module, nn.Module):
        raise ManualRegionError(f"manual() marks an nn.Module, got {type(module).__name__}")
    ins = _as_tuple(in_placements, "in_placements")
    outs = _as_tuple(out_placements, "out_placements")
    if not ins or not outs:
        raise ManualRegionError("manual() needs in_placements and out_placements: one entry per "
                                "tensor input and output of the module's forward")
    params = dict(param_placements or {})
    own = dict(module.named_parameters())
    unknown = sorted(set(params) - set(own))
    if unknown:
        raise ManualRegionError(f"param_placements names {unknown}, which {type(module).__name__} "
                                f"does not have; its parameters are {sorted(own)[:6]}")
    where = f"manual({type(module).__name__})"
    for what, given in (("in_placements", ins), ("out_placements", outs)):
        for i, value in enumerate(given):
            for label, p in _entries(value):
                if isinstance(p, Shard) and p.dim < 0:
                    raise ManualRegionError(
                        f"{where}: {what}[{i}] puts Shard({p.dim}) on {label}: count the tensor "
                        "dim from the front, Shard(d) with d >= 0 (the last dim of a 3-d tensor "
                        "is Shard(2)); a plan records each placement by that dim")
    params = {n: _stored(v, own[n], f"{where}: param_placements[{n!r}]", n)
              for n, v in params.items()}
    setattr(module, MARK, ManualSpec(ins, outs, tuple(params.items()), "user"))
    return module


def _entries(value) -> list[tuple[str, object]]:
    """(label, placement) of one declaration entry given as a dict by dim name or a tuple."""
    if isinstance(value, dict):
        return [(repr(k), p) for k, p in value.items()]
    if isinstance(value, (list, tuple)):
        return [(f"mesh dim {m}", p) for m, p in enumerate(value)]
    return []  # resolve() says what an entry must be


def _stored(value, param, what: str, name: str):
    """A parameter's declared placements with Shard(-k) as Shard(ndim - k); refused where the
    parameter cannot be stored so: a dim it does not have, a dim of size 1, a partial sum."""
    shape = tuple(param.shape)

    def one(label, p):
        if isinstance(p, Partial):
            raise ManualRegionError(f"{what} puts Partial() on {label}: a parameter is stored "
                                    "Replicate() or Shard(d), not as a partial sum")
        if not isinstance(p, Shard):
            return p
        d = p.dim + len(shape) if p.dim < 0 else p.dim
        if not 0 <= d < len(shape):
            raise ManualRegionError(
                f"{what} puts Shard({p.dim}) on {label}, but {name} has {len(shape)} dims "
                f"(shape {shape}): use a dim from 0 to {len(shape) - 1}" if shape else
                f"{what} puts Shard({p.dim}) on {label}, but {name} is a scalar: use Replicate()")
        if shape[d] == 1:
            raise ManualRegionError(f"{what} puts Shard({p.dim}) on {label}, but dim {d} of {name} "
                                    f"(shape {shape}) has size 1: use Replicate() there")
        return Shard(d) if d != p.dim else p

    if isinstance(value, dict):
        return {k: one(repr(k), p) for k, p in value.items()}
    if isinstance(value, (list, tuple)):
        return tuple(one(f"mesh dim {m}", p) for m, p in enumerate(value))
    return value  # resolve() says what an entry must be


def mark_style(module: nn.Module, style: str) -> nn.Module:
    """Mark a TorchTitan MoE block with a built-in style ("data_parallel", "torchtitan_ep")."""
    if style not in STYLES[1:]:
        raise ManualRegionError(f"unknown manual region style {style!r}: use one of "
                                f"{', '.join(STYLES[1:])}")
    if not is_moe_block(module):
        raise ManualRegionError(
            f"style {style!r} is for TorchTitan MoE blocks (the module holding router, "
            f"shared_experts and experts), not {type(module).__name__}: mark the MoE block "
            "itself, e.g. layers.*.moe")
    setattr(module, MARK, ManualSpec(style=style))
    return module


def spec_of(module: nn.Module) -> ManualSpec | None:
    return getattr(module, MARK, None)


def is_moe_block(module: nn.Module) -> bool:
    """TorchTitan's MoE class (and subclasses), or any module with a class named ``MoE``."""
    try:
        from torchtitan.models.moe import MoE
    except Exception:  # torchtitan absent or broken: fall back to class names
        MoE = None
    if MoE is not None and isinstance(module, MoE):
        return True
    return any(c.__name__ == "MoE" for c in type(module).__mro__)


def find_manual_regions(model: nn.Module) -> list[tuple[str, nn.Module, ManualSpec]]:
    """Outermost manual regions of `model`, in `named_modules` order. A TorchTitan MoE block
    nobody marked counts as a "data_parallel" region (its routing is data-dependent)."""
    found: list[tuple[str, nn.Module, ManualSpec]] = []
    for qname, mod in model.named_modules():
        if any(qname == p or qname.startswith(p + ".") for p, _, _ in found):
            continue  # inside a region already found
        spec = spec_of(mod)
        if spec is None and is_moe_block(mod):
            spec = ManualSpec(style="data_parallel")
        if spec is not None:
            found.append((qname, mod, spec))
    return found


def mark_matching(model: nn.Module, patterns, style: str) -> list[str]:
    """Mark every module whose qualified name matches one of `patterns` (fnmatch, e.g.
    "layers.*.moe") with `style`; a pattern that matches nothing is an error."""
    names = [n for n, _ in model.named_modules() if n]
    marked = []
    for pat in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pat)]
        if not hits:
            near = sorted({n.rsplit(".", 1)[-1] for n in names})[:12]
            raise ManualRegionError(
                f"manual_modules pattern {pat!r} matches no module of the model; module names "
                f"look like {names[1] if len(names) > 1 else names[0]!r} (last parts: "
                f"{', '.join(near)})")
        for n in hits:
            mark_style(model.get_submodule(n), style)
            marked.append(n)
    return marked


def _per_dim(value, names: tuple[str, ...], region: str, what: str, allow_none: bool):
    if isinstance(value, dict):
        unknown = [d for d in value if d not in names]
        if unknown:
            raise ManualRegionError(f"manual region {region!r}: {what} names mesh dim "
                                    f"{unknown[0]!r}, which the mesh does not have (its dims: "
                                    f"{', '.join(names)})")
        out = tuple(value.get(d, Replicate()) for d in names)
    elif isinstance(value, (list, tuple)):
        if len(value) != len(names):
            raise ManualRegionError(f"manual region {region!r}: {what} has {len(value)} "
                                    f"placements, the mesh has {len(names)} dims "
                                    f"({', '.join(names)}): give one per dim, or a dict by dim name")
        out = tuple(value)
    else:
        raise ManualRegionError(f"manual region {region!r}: {what} must be a tuple of "
                                f"placements (one per mesh dim) or a dict by dim name, got {value!r}")
    for p in out:
        if p is None and allow_none:
            continue
        if not isinstance(p, (Shard, Replicate, Partial)):
            raise ManualRegionError(f"manual region {region!r}: {what} holds {p!r}; use Shard(d), "
                                    "Replicate() or Partial()" + (" or None" if allow_none else ""))
    return out


def moe_facts(module: nn.Module) -> dict:
    """The shapes that price a TorchTitan MoE block (`cost/regions.py`)."""
    w1 = module.experts.w1
    shared = getattr(module, "shared_experts", None)
    return {"dim": int(w1.shape[2]), "hidden": int(w1.shape[1]), "experts": int(w1.shape[0]),
            "top_k": int(module.router.top_k),
            "shared_hidden": int(shared.w1.weight.shape[0]) if shared is not None else 0}


def resolve(qname: str, module: nn.Module, spec: ManualSpec, names: tuple[str, ...],
            sizes: tuple[int, ...]) -> Resolved:
    """The region's placements on a mesh with dims `names` and sizes `sizes`."""
    pnames = [n for n, _ in module.named_parameters()]
    if spec.style == "user":
        ins = [_per_dim(v, names, qname, f"in_placements[{i}]", False)
               for i, v in enumerate(spec.in_placements)]
        outs = [_per_dim(v, names, qname, f"out_placements[{j}]", False)
                for j, v in enumerate(spec.out_placements)]
        given = dict(spec.param_placements)
        params = {n: (_per_dim(given[n], names, qname, f"param_placements[{n!r}]", True)
                      if n in given else (Replicate(),) * len(names)) for n in pnames}
        elements = sum(p.numel() for p in module.parameters())
        return Resolved(qname, "user", ins, outs, params, len(outs),
                        extra={"param_elements": elements}, mesh=tuple(zip(names, sizes)))
    facts = moe_facts(module)
    # tokens: split on ep (its all-to-all needs each rank's own); elsewhere the planner's choice
    batch = tuple(Shard(0) if n == "ep" else None for n in names)
    params = {n: (None,) * len(names) for n in pnames}
    ep_dim = None
    if spec.style == "torchtitan_ep":
        if "ep" not in names:
            raise ManualRegionError(f"manual region {qname!r} has style 'torchtitan_ep', but the "
                                    f"mesh has no ep dim (its dims: {', '.join(names)})")
        ep_dim = names.index("ep")
        if facts["experts"] % sizes[ep_dim]:
            raise ManualRegionError(
                f"expert_parallel_degree = {sizes[ep_dim]} does not divide the "
                f"{facts['experts']} experts of {qname} (the mesh's ep dim has {sizes[ep_dim]} "
                f"ranks): choose an ep degree that divides {facts['experts']}")
        for n in pnames:
            if n in EXPERT_WEIGHTS:
                params[n] = tuple(Shard(0) if m == ep_dim else None for m in range(len(names)))
    return Resolved(qname, spec.style, [batch], [batch], params, 1, ep_dim, {"moe": facts},
                    tuple(zip(names, sizes)))


def resolve_all(model: nn.Module, names: tuple[str, ...],
                sizes: tuple[int, ...]) -> dict[str, Resolved]:
    return {q: resolve(q, m, s, names, sizes) for q, m, s in find_manual_regions(model)}


def grad_placement(use: Placement, inputs_on_dim: list[Placement]) -> Placement:
    """Where a region leaves a parameter's gradient on one dim, given how the region received
    the parameter there: sharded stays sharded (each rank owns its slice's gradient); a whole
    parameter used on a shard of the data is a partial sum; on replicated data, whole."""
    if isinstance(use, Shard):
        return use
    return Partial() if any(isinstance(p, Shard) for p in inputs_on_dim) else Replicate()
