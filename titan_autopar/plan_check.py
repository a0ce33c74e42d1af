"""Reading a plan file safely: every field checked, every failure one `PlanError`.

A plan is a file people edit, copy and mistype, so nothing in it is trusted. `read_plan_file`
reads the text through `files.read_capped` (a missing file, a folder, a device or a named pipe
are errors, not tracebacks or hangs), parses it with `strict_json` (binary data, duplicate keys,
NaN, numbers of absurd length and JSON nested past any plan's depth are refused, naming the
field where there is one) and `check_plan_data` checks each field against the schema written
out in `docs/plan_format.md`: types and ranges, placement syntax ("R", "P", "S(d)"), one
placement per mesh dim, the mesh against the fingerprint, the collectives' mesh dims against the
mesh. Every error names the file and the field, so a person can find what to fix. What needs
the model itself is checked where the graph is known, by `check_against_graph` in `apply_plan`
before any rank runs the plan: a Shard dim beyond a tensor's rank, the `parameters` section
against the graph's parameter nodes and the manual regions' declarations, and every node's
placements against the ways its op runs.
"""

from __future__ import annotations

import math
import re

from titan_autopar import strict_json
from titan_autopar.files import read_capped

SCHEMA_VERSION = 2  # 2: manual regions (`manual_regions` replaces `opaque_blocks`)
_PLACEMENT = re.compile(r"^(R|P|S\((0|[1-9][0-9]{0,2})\))$")
DTYPES = ("float32", "bfloat16", "float16", "float64")
REGION_STYLES = ("user", "data_parallel", "torchtitan_ep")
CHECKPOINTING = ("none", "selective", "full")
SOLVERS = ("highs", "cbc", "joint")
RECIPES = ("fsdp", "fsdp_tp")
COLLECTIVE_KINDS = ("parameter", "activation", "region")


class PlanError(ValueError):
    """A plan file that cannot be used, naming the file and the field."""


def _fail(source, where: str, what: str):
    raise PlanError(f"{source}: {where}: {what}" if where else f"{source}: {what}")


def read_plan_file(path) -> dict:
    """The JSON object in the file at `path`, or PlanError saying why there is none."""
    raw = read_capped(path, name=str(path), what="a plan", error=PlanError,
                      fix="give the path of a plan saved by `titan-autopar plan` or by a job's "
                      "save_plan")
    return parse_plan_text(raw, path)


def parse_plan_text(raw: bytes | str, source) -> dict:
    try:
        d = strict_json.loads(raw, "plan")
    except strict_json.JsonProblem as e:
        if e.where:
            raise PlanError(f"{source}: {e.where}: {e.what}") from None
        raise PlanError(f"{source} is not a plan: {e.what}") from None
    if not isinstance(d, dict) or "schema_version" not in d:
        raise PlanError(f"{source} is not a titan_autopar plan (no schema_version)")
    return d


# ------------------------------------------------------------------ field checks
def _obj(src, where, v) -> dict:
    if not isinstance(v, dict):
        _fail(src, where, f"expected an object, found {_kind(v)}")
    return v


def _list(src, where, v) -> list:
    if not isinstance(v, list):
        _fail(src, where, f"expected a list, found {_kind(v)}")
    return v


def _str(src, where, v) -> str:
    if not isinstance(v, str):
        _fail(src, where, f"expected a string, found {_kind(v)}")
    return v


def _int(src, where, v, low: int = 0) -> int:
    if not isinstance(v, int) or isinstance(v, bool):
        _fail(src, where, f"expected a whole number, found {_kind(v)}")
    if v < low:
        _fail(src, where, f"expected a whole number of at least {low}, found {v}")
    return v


def _num(src, where, v, low: float | None = 0.0, unit: str = "") -> float:
    """A finite number, at least `low` (None: any); `unit` names what it counts."""
    want = "a number" + (f" of {unit}" if unit else "") + ("" if low is None else f" >= {low:g}")
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
        _fail(src, where, f"expected {want}, found {_kind(v)}")
    if low is not None and v < low:
        _fail(src, where, f"expected {want}, found {v}")
    return v


def _one_of(src, where, v, allowed) -> str:
    if v not in allowed:
        _fail(src, where, f"found {_kind(v)}; expected one of {', '.join(allowed)}")
    return v


def _bool(src, where, v) -> bool:
    if not isinstance(v, bool):
        _fail(src, where, f"expected true or false, found {_kind(v)}")
    return v


def _is_dtype(name: str) -> bool:
    """A torch dtype's name as the fingerprint writes it ("torch.int64")."""
    import torch

    return name.startswith("torch.") and isinstance(
        getattr(torch, name.removeprefix("torch."), None), torch.dtype)


def _kind(v) -> str:
    if isinstance(v, bool):
        return f"{str(v).lower()}"
    if isinstance(v, (int, float)):
        return f"the number {v}"
    if isinstance(v, str):
        return f"the string {v[:40]!r}"
    if v is None:
        return "null"
    return {dict: "an object", list: "a list"}.get(type(v), type(v).__name__)


def _placements(src, where, v, ndim: int, *, absent_ok: bool = False) -> list:
    _list(src, where, v)
    if len(v) != ndim:
        _fail(src, where, f"has {len(v)} placements, the mesh has {ndim} dims: give one per dim")
    for i, p in enumerate(v):
        _str(src, f"{where}[{i}]", p)
        if absent_ok and p == "-":
            continue
        if not _PLACEMENT.match(p):
            _fail(src, f"{where}[{i}]", f"unknown placement {p!r}: use R, P or S(d) with d a "
                  "tensor dim")
    if absent_ok and "-" in v and any(p != "-" for p in v):
        _fail(src, where, "mixes '-' (no tensor) with placements")
    return v


def _price(src, where, v) -> None:
    """A price (`predicted`, or one of `recipes`): seconds and GiB, none below 0; `framework_s`
    and `loop_s` may be absent (plans written before they were priced)."""
    _obj(src, where, v)
    for k in ("step_time_s", "compute_s", "exposed_comm_s", "total_comm_s"):
        _num(src, f"{where}.{k}", v.get(k), unit="seconds")
    for k in ("framework_s", "loop_s"):
        if k in v:
            _num(src, f"{where}.{k}", v[k], unit="seconds")
    _num(src, f"{where}.peak_memory_gib", v.get("peak_memory_gib"), unit="GiB")
    for k, x in _obj(src, f"{where}.memory_gib", v.get("memory_gib")).items():
        _num(src, f"{where}.memory_gib.{k}", x, unit="GiB")


def check_plan_data(d: dict, source) -> None:
    """Check every field of a plan's JSON object; PlanError names the file and the field."""
    src = source
    v = d.get("schema_version")
    if not isinstance(v, int) or isinstance(v, bool):
        _fail(src, "schema_version", f"expected the whole number {SCHEMA_VERSION}, found {_kind(v)}")
    if v != SCHEMA_VERSION:
        _fail(src, "", f"plan schema {v}, this version reads schema {SCHEMA_VERSION}: replan with "
              "`titan-autopar plan`")
    for key in ("fingerprint", "mesh", "hardware", "predicted", "recipes", "solver", "sizes",
                "parameters", "nodes", "collectives", "memory_budget_gib", "fallbacks",
                "manual_regions"):
        if key not in d:
            _fail(src, key, "missing: the plan is incomplete; replan with `titan-autopar plan`")
    if "planner_revision" in d:
        _int(src, "planner_revision", d["planner_revision"], low=1)

    mesh = _obj(src, "mesh", d["mesh"])
    names = _list(src, "mesh.names", mesh.get("names"))
    for i, n in enumerate(names):
        _str(src, f"mesh.names[{i}]", n)
    if not names:
        _fail(src, "mesh.names", "empty: a mesh has at least one dim")
    if len(set(names)) != len(names):
        _fail(src, "mesh.names", f"names a dim twice: {names}")
    shape = _list(src, "mesh.shape", mesh.get("shape"))
    for i, s in enumerate(shape):
        _int(src, f"mesh.shape[{i}]", s, low=1)
    if len(shape) != len(names):
        _fail(src, "mesh.shape", f"has {len(shape)} sizes for {len(names)} dim names")
    cross = _list(src, "mesh.crosses_nodes", mesh.get("crosses_nodes"))
    if len(cross) != len(names):
        _fail(src, "mesh.crosses_nodes", f"has {len(cross)} entries for {len(names)} dims")
    for i, c in enumerate(cross):
        _bool(src, f"mesh.crosses_nodes[{i}]", c)
    ndim = len(names)

    fp = _obj(src, "fingerprint", d["fingerprint"])
    for k in ("model", "hardware"):
        _str(src, f"fingerprint.{k}", fp.get(k))
    _int(src, "fingerprint.parameters", fp.get("parameters"))
    for i, x in enumerate(_list(src, "fingerprint.inputs", fp.get("inputs"))):
        w = f"fingerprint.inputs[{i}]"
        if not isinstance(x, list) or len(x) != 2:
            _fail(src, w, "expected [shape, dtype]")
        for j, s in enumerate(_list(src, f"{w}[0]", x[0])):
            _int(src, f"{w}[0][{j}]", s)
        if not _is_dtype(_str(src, f"{w}[1]", x[1])):
            _fail(src, f"{w}[1]", f"expected a torch dtype such as 'torch.int64', found {x[1]!r}")
    fmesh = _obj(src, "fingerprint.mesh", fp.get("mesh"))
    if fmesh != {"names": names, "shape": shape}:
        _fail(src, "fingerprint.mesh", f"says {fmesh}, the plan's mesh is names {names}, shape "
              f"{shape}: the two must agree")

    hw = _obj(src, "hardware", d["hardware"])
    _str(src, "hardware.name", hw.get("name"))
    for k, x in hw.items():
        if k == "profile":
            _str(src, "hardware.profile", x)
        elif k == "collective_fits":
            for i, f in enumerate(_list(src, "hardware.collective_fits", x)):
                w = f"hardware.collective_fits[{i}]"
                if not isinstance(f, list) or len(f) != 4:
                    _fail(src, w, "expected [kind, group size, latency s, seconds per byte]")
                _str(src, f"{w}[0]", f[0])
                _int(src, f"{w}[1]", f[1])
                _num(src, f"{w}[2]", f[2])
                _num(src, f"{w}[3]", f[3])
        elif k != "name":
            _num(src, f"hardware.{k}", x)
    _num(src, "memory_budget_gib", d["memory_budget_gib"], unit="GiB")
    if d["memory_budget_gib"] <= 0:
        _fail(src, "memory_budget_gib", "must be more than 0")
    _price(src, "predicted", d["predicted"])
    for r, p in _obj(src, "recipes", d["recipes"]).items():
        if r not in RECIPES:
            _fail(src, f"recipes.{r}", f"is no recipe: the priced recipes are {', '.join(RECIPES)}")
        _price(src, f"recipes.{r}", p)

    sv = _obj(src, "solver", d["solver"])
    _one_of(src, "solver.name", sv.get("name"), SOLVERS)
    for k in ("method", "status", "best_start"):
        _str(src, f"solver.{k}", sv.get(k))
    for k in ("gap", "objective_ms"):
        _num(src, f"solver.{k}", sv.get(k))
    for k in ("programs", "max_variables", "max_constraints"):
        _int(src, f"solver.{k}", sv.get(k))
    for k in ("simplex_iterations", "nodes", "mip_programs"):  # counted work (absent before)
        if k in sv:
            _int(src, f"solver.{k}", sv[k])

    sizes = _obj(src, "sizes", d["sizes"])
    for k in ("graph_nodes", "representatives", "edges", "options"):
        _int(src, f"sizes.{k}", sizes.get(k))
    for c, members in _obj(src, "sizes.shared_blocks", sizes.get("shared_blocks")).items():
        if not _list(src, f"sizes.shared_blocks.{c}", members):
            _fail(src, f"sizes.shared_blocks.{c}", "empty: a shared class has members")
        for i, m in enumerate(members):
            _str(src, f"sizes.shared_blocks.{c}[{i}]", m)
    for k, n in _obj(src, "fallbacks", d["fallbacks"]).items():
        _int(src, f"fallbacks.{k}", n, low=1)
    for name, reg in _obj(src, "manual_regions", d["manual_regions"]).items():
        w = f"manual_regions[{name!r}]"
        _obj(src, w, reg)
        if reg.get("style") not in REGION_STYLES:
            _fail(src, f"{w}.style", f"found {_kind(reg.get('style'))}; expected one of "
                  f"{', '.join(REGION_STYLES)}")
        for k in ("in", "out"):
            if not _list(src, f"{w}.{k}", reg.get(k)):
                _fail(src, f"{w}.{k}", "empty: a region has at least one tensor in and out")
            for i, pl in enumerate(reg[k]):
                _list(src, f"{w}.{k}[{i}]", pl)
                _placements(src, f"{w}.{k}[{i}]", [p if p is not None else "R" for p in pl],
                            ndim)
        for pname, pl in _obj(src, f"{w}.params", reg.get("params")).items():
            _list(src, f"{w}.params[{pname!r}]", pl)
            _placements(src, f"{w}.params[{pname!r}]", [p if p is not None else "R" for p in pl],
                        ndim)
    ac = d.get("activation_checkpointing", "none")
    if ac not in CHECKPOINTING:
        _fail(src, "activation_checkpointing", f"found {_kind(ac)}; expected one of "
              f"{', '.join(CHECKPOINTING)}")
    ca = d.get("cp_attention", "cheapest")
    if ca not in ("cheapest", "ring"):
        _fail(src, "cp_attention", f"found {_kind(ca)}; expected cheapest or ring")
    rf = d.get("reshard_after_forward", True)
    if not isinstance(rf, bool):
        _fail(src, "reshard_after_forward", f"found {_kind(rf)}; expected true or false")
    rs = d.get("recipe_schedule")
    if rs is not None:
        _obj(src, "recipe_schedule", rs)
        if rs.get("recipe") != "fsdp" or "fsdp" not in d["recipes"]:
            _fail(src, "recipe_schedule.recipe", f"found {_kind(rs.get('recipe'))}; expected "
                  "'fsdp' (a priced recipe of the plan's `recipes`), or recipe_schedule null")
        _num(src, "recipe_schedule.gain_pct", rs.get("gain_pct"), low=None)
        _str(src, "recipe_schedule.why", rs.get("why"))
    dt = d.get("param_dtype")
    if dt is not None and dt not in DTYPES:
        _fail(src, "param_dtype", f"found {_kind(dt)}; expected null or one of {', '.join(DTYPES)}")

    params = _obj(src, "parameters", d["parameters"])
    for name, pl in params.items():
        _placements(src, f"parameters[{name!r}]", pl, ndim)
    nodes = _obj(src, "nodes", d["nodes"])
    for name, e in nodes.items():
        w = f"nodes[{name!r}]"
        _obj(src, w, e)
        _str(src, f"{w}.op", e.get("op"))
        for j, pl in enumerate(_list(src, f"{w}.out", e.get("out"))):
            _placements(src, f"{w}.out[{j}]", pl, ndim, absent_ok=True)
        for k, pl in enumerate(_list(src, f"{w}.in", e.get("in", []))):
            _placements(src, f"{w}.in[{k}]", pl, ndim)
    if len(params) != fp["parameters"]:
        _fail(src, "parameters", f"lists {len(params)} parameters, the fingerprint says "
              f"{fp['parameters']}")
    if params and not any(isinstance(e, dict) and e.get("op") == "param" for e in nodes.values()):
        _fail(src, "nodes", "has no parameter nodes, though the plan has parameters")

    for i, c in enumerate(_list(src, "collectives", d["collectives"])):
        w = f"collectives[{i}]"
        _obj(src, w, c)
        for k in ("producer", "consumer", "block", "collective"):
            _str(src, f"{w}.{k}", c.get(k))
        _one_of(src, f"{w}.kind", c.get("kind"), COLLECTIVE_KINDS)
        if _str(src, f"{w}.mesh_dim", c.get("mesh_dim")) not in names:
            _fail(src, f"{w}.mesh_dim", f"{c['mesh_dim']!r} is not a dim of the mesh {names}")
        _int(src, f"{w}.bytes", c.get("bytes"))
        _int(src, f"{w}.count", c.get("count"), low=1)
        _num(src, f"{w}.seconds_each", c.get("seconds_each"), unit="seconds")
        _placements(src, f"{w}.from", c.get("from"), ndim)
        _placements(src, f"{w}.to", c.get("to"), ndim)
    timings = d.get("timings", {})
    if not isinstance(timings, dict):
        _fail(src, "timings", f"expected an object, found {_kind(timings)}")


def _rank_problems(where: str, pls, metas) -> str | None:
    for j, (pl, meta) in enumerate(zip(pls, metas)):
        ndim = getattr(meta, "ndim", None)
        if ndim is None:
            continue
        for p in pl:
            if p.startswith("S(") and int(p[2:-1]) >= ndim:
                return (f"{where}[{j}] = {pl} shards dim {p[2:-1]} of a tensor with {ndim} dims "
                        f"(shape {tuple(meta.shape)})")
    return None


def check_against_graph(d: dict, jg, source, mesh=None) -> None:
    """What a plan file can only be checked against with the model's traced graph `jg` at hand:
    every Shard dim within its tensor's rank, one output placement per output, each parameter's
    placement in `parameters` equal to its graph node's (the one that runs) and to what its
    manual region declares; and, given the `mesh`, the program itself (`_check_program`)."""
    import torch.fx as fx
    from torch.utils import _pytree as pytree

    nodes = d["nodes"]
    for n in jg.gm.graph.nodes:
        entry = nodes.get(n.name)
        if entry is None:
            continue
        val = n.meta.get("val")
        outs = list(val) if isinstance(val, (tuple, list)) else [val]
        if len(entry["out"]) > len(outs):
            _fail(source, f"nodes[{n.name!r}].out", f"has {len(entry['out'])} placements for "
                  f"{len(outs)} outputs")
        problem = _rank_problems(f"nodes[{n.name!r}].out", entry["out"], outs)
        if problem is None and "in" in entry:
            flat = pytree.tree_leaves((n.args, n.kwargs))
            ins = [a.meta.get("val") for a in flat if isinstance(a, fx.Node)
                   and hasattr(a.meta.get("val"), "ndim")]
            problem = _rank_problems(f"nodes[{n.name!r}].in", entry["in"], ins)
        if problem:
            _fail(source, "", problem)
    for name, node in jg.param_nodes.items():
        entry = nodes.get(node.name)
        if entry is None or name not in d["parameters"]:
            continue  # the fingerprint check names the model mismatch
        if entry["out"] and entry["out"][0] != d["parameters"][name]:
            _fail(source, f"parameters[{name!r}]", f"says {d['parameters'][name]}, but its graph "
                  f"node nodes[{node.name!r}].out[0] says {entry['out'][0]}; edit both alike "
                  "(the node's placement is what runs) or plan again")
    names = d["mesh"]["names"]
    for q, region in jg.manual_regions.items():
        for pname, declared in region.params.items():
            have = d["parameters"].get(f"{q}.{pname}")
            for m, want in enumerate(declared if have else ()):
                if want is not None and have[m] != _text(want):
                    _fail(source, f"parameters['{q}.{pname}']", f"is {have}, but its manual "
                          f"region {q!r} declares {_text(want)} on {names[m]!r} (the region's "
                          "code receives it so): put back the declared placement or plan again")
    if mesh is not None:
        _check_program(d, jg, source, mesh)


def _text(p) -> str:
    """A placement as a plan writes it."""
    from torch.distributed.tensor import Partial, Shard

    if p is None:
        return "-"
    return f"S({p.dim})" if isinstance(p, Shard) else "P" if isinstance(p, Partial) else "R"


def _parsed(pl: list[str]) -> tuple | None:
    """One tensor's placements from the plan; None for "-" (not a tensor)."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    if pl and pl[0] == "-":
        return None
    return tuple(Replicate() if p == "R" else Partial() if p == "P" else Shard(int(p[2:-1]))
                 for p in pl)


def _uneven(label: str, pl, t, names, sizes) -> str | None:
    """Why placements `pl` split tensor `t` into shards of different sizes, or None."""
    if pl is None or not hasattr(t, "shape"):
        return None
    ways = {}
    for p, n, k in zip(pl, names, sizes):
        if _text(p).startswith("S(") and k > 1 and p.dim < t.ndim:
            ways.setdefault(p.dim, []).append((n, k))
    for dim, over in ways.items():
        w = math.prod(k for _, k in over)
        if t.shape[dim] % w:
            return (f"{label} = {[_text(p) for p in pl]} splits dim {dim} (size {t.shape[dim]}) "
                    f"of a tensor of shape {tuple(t.shape)} over "
                    f"{', '.join(f'{n}={k}' for n, k in over)}, which does not divide it: shards "
                    "must be equal; put back the planned placements or plan again")
    return None


def _check_program(d: dict, jg, source, mesh) -> None:
    """The program `apply/interpret.py` would build reads `nodes` only: each node's output
    placements and the placements its tensor inputs are moved to. Each must be, on every mesh
    dim, a way the op runs (one of the single-dim strategies the planner chooses from,
    `strategy/options.py`: what DTensor's rules, our own rules and a region's declaration
    allow -- an op run on local shards, such as attention or a manual region, computes
    something else on any other), every tensor split into equal shards, and attention's
    sequence ring-sharded on at most one dim."""
    import operator

    import torch

    from titan_autopar.cost.ring import ring_dims
    from titan_autopar.strategy.options import OptionBuilder, output_metas, tensor_inputs

    names, sizes = d["mesh"]["names"], d["mesh"]["shape"]
    builder = OptionBuilder(mesh[names[0]], jg.manual_regions)
    params = {node: name for name, node in jg.param_nodes.items()}

    def val(p, i):
        v = p.meta.get("val")
        return v[i] if isinstance(v, (tuple, list)) else v

    for n in jg.gm.graph.nodes:
        if n.op == "placeholder":
            outs, ins = [n.meta.get("val")], []
            what = f"nodes[{n.name!r}]" + (f" (parameter {params[n]})" if n in params else "")
        elif n.op == "call_function" and n.target is not operator.getitem:
            outs = output_metas(n)
            if not any(isinstance(t, torch.Tensor) for t in outs):
                continue
            ins = [val(p, i) for p, i in tensor_inputs(n)]
            what = f"nodes[{n.name!r}] ({n.target})"
        else:
            continue
        entry = d["nodes"].get(n.name)
        if entry is None:
            _fail(source, "nodes", f"has no entry for graph node {n.name!r}: the plan was made "
                  "for another graph; plan again")
        given_in = entry.get("in", []) if n.op == "call_function" else []
        if len(entry["out"]) != len(outs) or len(given_in) != len(ins):
            _fail(source, what, f"has placements for {len(entry['out'])} outputs and "
                  f"{len(given_in)} inputs; the op has {len(outs)} and {len(ins)}: put back the "
                  "planned entry or plan again")
        out_pl, in_pl = [_parsed(pl) for pl in entry["out"]], [_parsed(pl) for pl in given_in]
        for label, pls, ts in ((f"{what}.out", out_pl, outs), (f"{what}.in", in_pl, ins)):
            for k, (pl, t) in enumerate(zip(pls, ts)):
                problem = _uneven(f"{label}[{k}]", pl, t, names, sizes)
                if problem:
                    _fail(source, "", problem)
        if n.op == "placeholder":
            options = builder.tensor_options(outs[0])
            allowed = [range(len(options))] * len(names)
        else:
            options, _ = builder.options(n)
            allowed = builder.dim_options(n) or [range(len(options))] * len(names)
        chosen = []
        for m, dim in enumerate(names):
            out_m = tuple(None if pl is None else pl[m] for pl in out_pl)
            in_m = tuple(pl[m] if pl is not None else None for pl in in_pl)
            hit = next((options[i] for i in allowed[m]
                        if options[i].out == out_m and options[i].ins == in_m), None)
            if hit is None:
                _fail(source, "", _not_a_way(what, dim, out_m, in_m, n.op == "placeholder",
                                             [options[i] for i in allowed[m]], outs[0]))
            chosen.append(hit)
        ring = ring_dims(n, chosen)
        if len(ring) > 1:
            _fail(source, "", f"{what} shards attention's sequence over mesh dims "
                  f"{', '.join(repr(names[m]) for m in ring)}: ring attention runs on one mesh "
                  "dim; put back the planned placements or plan again")


def _not_a_way(what, dim, out_m, in_m, placeholder: bool, options, meta) -> str:
    def row(ps):
        return "[" + ", ".join(_text(p) for p in ps) + "]"

    if placeholder:
        return (f"{what} is {_text(out_m[0])} on mesh dim {dim!r}, which a graph input "
                f"(parameter, buffer or input) of shape {tuple(meta.shape)} cannot be: it is "
                f"stored {', '.join(_text(o.out[0]) for o in options)}; put back the planned "
                "placement or plan again")
    shown = "; ".join(f"in {row(o.ins)} -> out {row(o.out)}" for o in options[:3])
    more = f" and {len(options) - 3} more" if len(options) > 3 else ""
    return (f"{what} on mesh dim {dim!r}: in {row(in_m)} -> out {row(out_m)} is not a way this "
            f"op runs, so the program would compute something else (it runs {shown}{more}); "
            "put back the planned placements or plan again")
