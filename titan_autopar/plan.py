"""The Plan artifact: what the planner decided, as JSON a person can read, diff and replay.

Owns `Plan` (save/load, the fingerprint check, explain, diff) and `build_plan`, which turns a
solved assignment into one. Placements are written one string per mesh dim: "R" (replicate),
"S(d)" (shard tensor dim d), "P" (partial sum). The JSON is canonical: the same inputs give
byte-identical files (wall-clock timings live in `Plan.timings`, written only on request).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from titan_autopar.cost.comm import redistribute_steps
from titan_autopar.files import write_atomic
from titan_autopar.cost.hardware import GiB, Hardware
from titan_autopar.plan_check import SCHEMA_VERSION, PlanError, check_plan_data, read_plan_file
from titan_autopar.solve.problem import itemsize, local_numel, real_numel

# bumped whenever the planner would choose or price the same job differently: a run that finds
# a plan saved by an earlier revision plans again (a plan_file the user names still replays)
PLANNER_REVISION = 5

__all__ = ["Plan", "PlanError", "StalePlanError", "SCHEMA_VERSION", "build_plan", "fingerprint",
           "is_plan_file", "parse_placement", "placement_str"]


def placement_str(p) -> str:
    if p is None:
        return "-"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Partial):
        return "P"
    if isinstance(p, Replicate):
        return "R"
    return repr(p)


def parse_placement(s: str):
    if s == "R":
        return Replicate()
    if s == "P":
        return Partial()
    if s.startswith("S(") and s.endswith(")"):
        return Shard(int(s[2:-1]))
    raise PlanError(f"unknown placement {s!r} in plan (expected R, P or S(d))")


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(model: torch.nn.Module, inputs, names, sizes, hw: Hardware) -> dict:
    """What a plan is valid for: the model's structure and shapes, the inputs, mesh, hardware."""
    structure = [(n, type(m).__name__) for n, m in model.named_modules()]
    params = [(n, list(p.shape), str(p.dtype)) for n, p in model.named_parameters()]
    buffers = [(n, list(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    return {
        "model": _digest([structure, params, buffers]),
        "parameters": len(params),
        "inputs": [[list(x.shape), str(x.dtype)] for x in inputs],
        "mesh": {"names": list(names), "shape": list(sizes)},
        "hardware": _digest(hw.as_dict()),
    }


class StalePlanError(ValueError):
    """A plan made for another model, inputs, mesh or settings than the one it is given to."""


def is_plan_file(path) -> bool:
    """True if `path` holds a plan this version loads: every field checks (`Plan.load`). A
    JSON file that merely has a `schema_version` key is not one."""
    try:
        Plan.load(path)
        return True
    except PlanError:
        return False


@dataclass
class Plan:
    data: dict
    timings: dict = field(default_factory=dict)
    source: str = "the plan"  # where it was read from, for messages

    # -------------------------------------------------------------- persistence
    def to_json(self, timings: bool = False) -> str:
        d = dict(self.data)
        if timings:
            d["timings"] = self.timings
        return json.dumps(d, indent=1, sort_keys=True) + "\n"

    def save(self, path, *, timings: bool = False) -> Path:
        """Write the plan to `path` whole or not at all: into a temporary file beside it, then
        renamed over it (a kill or a full disk mid-write leaves the old file as it was)."""
        p = Path(path)
        try:
            write_atomic(p, self.to_json(timings))
        except OSError as e:
            raise PlanError(f"cannot write the plan to {p} ({e.strerror or e}); nothing was "
                            "changed there") from None
        return p

    @classmethod
    def load(cls, path) -> "Plan":
        """Read and check a plan file; anything wrong is a PlanError naming file and field."""
        d = read_plan_file(path)
        check_plan_data(d, path)
        timings = d.pop("timings", {})
        # keys in the order `save` writes them, so that a hand-ordered file reads as its re-save
        return cls(json.loads(json.dumps(d, sort_keys=True)), timings, str(path))

    # -------------------------------------------------------------- accessors
    @property
    def mesh_names(self) -> list[str]:
        return self.data["mesh"]["names"]

    @property
    def parameters(self) -> dict[str, list[str]]:
        return self.data["parameters"]

    def parameter_placements(self, name: str) -> tuple:
        return tuple(parse_placement(s) for s in self.data["parameters"][name])

    @property
    def predicted(self) -> dict:
        return self.data["predicted"]

    @property
    def recipe_schedule(self) -> str | None:
        """"fsdp" where the plan is predicted less than `MIN_GAIN` faster than the FSDP recipe
        (`solve/recipe_schedule.py`): TorchTitan's switch then runs that recipe by default;
        else None."""
        rs = self.data.get("recipe_schedule")
        return rs["recipe"] if rs else None

    def predicted_run(self, recipe_runtime: bool = True) -> dict:
        """The predicted price of what runs: the recipe's where the plan is a recipe's schedule
        and runs under the recipe's runtime (`recipe_runtime`), else the plan's own."""
        r = self.recipe_schedule
        return self.data["recipes"][r] if r and recipe_runtime else self.predicted

    def check(self, fp: dict) -> None:
        """Refuse a plan made for another model, inputs, mesh or hardware, saying what differs."""
        mine = self.data["fingerprint"]
        diffs = [
            f"{k}: plan has {mine.get(k)!r}, now {fp.get(k)!r}"
            for k in sorted(set(mine) | set(fp))
            if mine.get(k) != fp.get(k)
        ]
        if diffs:
            raise StalePlanError(
                "the plan was made for something else and cannot be replayed: "
                + "; ".join(diffs)
                + ". Replan (titan-autopar plan, or drop plan_file) for the current model and mesh."
            )

    def check_regions(self, manual: dict) -> None:
        """Refuse a model whose manual regions (name -> `graph.manual.Resolved`) differ from
        the ones this plan was made for, saying what differs."""
        mine = self.data["manual_regions"]
        now = {n: r.to_json() for n, r in manual.items()}
        diffs = []
        for n in sorted(set(mine) | set(now)):
            if n not in now:
                diffs.append(f"{n} is a manual region in the plan, not in the model")
            elif n not in mine:
                diffs.append(f"{n} is a manual region in the model ({now[n]['style']}), not in "
                             "the plan")
            elif mine[n] != now[n]:
                diffs.append(f"{n} is declared {now[n]} in the model, {mine[n]} in the plan")
        if diffs:
            raise StalePlanError(
                f"{self.source}: the model's manual regions differ from the plan's: "
                + "; ".join(diffs[:5]) + ". Mark the same modules the same way in the model you "
                "plan and the model you apply the plan to, or plan again.")

    # -------------------------------------------------------------- reading
    def explain(self) -> str:
        from titan_autopar.explain import explain

        return explain(self)

    def diff(self, other: "Plan") -> str:
        from titan_autopar.explain import diff

        return diff(self, other)


def _region_collectives(pb, assign, names) -> list[dict]:
    """The all-to-alls a manual region's own code issues (priced by `cost/regions.py`)."""
    from titan_autopar.cost.regions import region_work
    from titan_autopar.graph.manual_ops import BACKWARD

    out = []
    for u, unit in enumerate(pb.units):
        if unit.region is None:
            continue
        work = region_work(pb.jg.manual_regions[unit.region])
        seconds = pb.region_comm(u, assign[u])
        if work.ep_dim is None or not seconds:
            continue
        calls = 4 if unit.node.target is BACKWARD else 2
        r = pb.jg.manual_regions[unit.region]
        k = len(r.outs) if unit.node.target is BACKWARD else 0
        x = unit.ins[k]
        opts = [unit.options[c] for c in assign[u]]
        local = local_numel(x, tuple(o.ins[k] for o in opts), pb.sizes) or 0
        tokens = local / x.shape[-1]
        nbytes = work.a2a_elements_per_token * tokens * itemsize(x, pb.prec) * pb.sizes[work.ep_dim]
        out.append({
            "producer": unit.region, "consumer": unit.region, "block": unit.block,
            "kind": "region", "collective": "all_to_all", "mesh_dim": names[work.ep_dim],
            "bytes": int(nbytes), "count": unit.weight * calls,
            "seconds_each": round(seconds / (unit.weight * calls), 9),
            "from": [placement_str(o.ins[k]) for o in opts],
            "to": [placement_str(o.ins[k]) for o in opts]})
    return out


def build_plan(pb, assign, price, *, fingerprint, mesh_names, hardware, budget, solver, stats,
               recipes, fallbacks, start) -> Plan:
    jg, reg = pb.jg, pb.blocks
    names = tuple(mesh_names)

    def pl(tup) -> list[str]:
        return [placement_str(p) for p in tup]

    params = {}
    for pname, node in jg.param_nodes.items():
        u = pb.index[reg.rep[node]]
        params[pname] = pl(pb.placement(u, assign[u]))
    nodes = {}
    for n in jg.gm.graph.nodes:
        u = pb.index.get(reg.rep[n])
        if u is None:
            continue
        unit = pb.units[u]
        opts = [unit.options[c] for c in assign[u]]
        entry = {"op": str(n.target) if n.op == "call_function" else unit.kind,
                 "out": [pl(tuple(o.out[j] for o in opts)) for j in range(len(unit.outs))]}
        if unit.kind == "op":
            entry["in"] = [pl(tuple(o.ins[k] for o in opts)) for k in range(len(unit.ins))]
        nodes[n.name] = entry

    collectives = []
    for ei, e in enumerate(pb.edges):
        src = pb.placement(e.src, assign[e.src], e.out)
        dst = pb.in_placement(e.dst, assign[e.dst], e.arg)
        if src == dst:
            continue
        t = pb.units[e.src].outs[e.out]
        steps = redistribute_steps(pb.topo, real_numel(t), itemsize(t, pb.prec), src, dst,
                                   pb.bucket(e), e.gradient)
        for s in steps:
            collectives.append({
                "producer": pb.units[e.src].param_name or pb.units[e.src].node.name,
                "consumer": pb.units[e.dst].param_name or pb.units[e.dst].node.name,
                "block": pb.units[e.dst].block or pb.units[e.src].block,
                "kind": "parameter" if e.param_side else "activation",
                "collective": s.collective,
                "mesh_dim": names[s.mesh_dim],
                "bytes": int(s.bytes),
                "count": pb.runs(e),
                "seconds_each": round(s.seconds, 9),
                "from": pl(src),
                "to": pl(dst),
            })
    collectives += _region_collectives(pb, assign, names)
    collectives.sort(key=lambda c: (-c["bytes"] * c["count"], c["producer"], c["consumer"], c["collective"]))

    def price_dict(p) -> dict:
        return {
            "step_time_s": round(p.step_time, 9),
            "compute_s": round(p.compute, 9),
            "exposed_comm_s": round(p.comm, 9),
            "framework_s": round(p.framework, 9),
            "loop_s": round(p.loop, 9),
            "total_comm_s": round(p.comm_total, 9),
            "memory_gib": {k: round(v / GiB, 6) for k, v in p.memory.items()},
            "peak_memory_gib": round(p.peak_memory / GiB, 6),
        }

    data = {
        "schema_version": SCHEMA_VERSION,
        "planner_revision": PLANNER_REVISION,
        "fingerprint": fingerprint,
        "mesh": {"names": list(names), "shape": list(pb.sizes),
                 "crosses_nodes": [not a for a in pb.topo.intra]},
        "hardware": hardware.as_dict(),
        "memory_budget_gib": round(budget / GiB, 6),
        "predicted": price_dict(price),
        "recipes": {r: price_dict(v["price"]) for r, v in recipes.items()},
        "solver": {
            "name": solver,
            "method": "per-mesh-dim integer programs, block-coordinate descent",
            "status": stats.status,
            "gap": round(stats.gap, 9),
            "objective_ms": round(price.step_time * 1e3, 6),
            "programs": stats.solves,
            "simplex_iterations": stats.iterations,
            "nodes": stats.nodes,
            "mip_programs": stats.mip_programs,
            "max_variables": stats.variables,
            "max_constraints": stats.constraints,
            "best_start": start,
        },
        "sizes": {
            "graph_nodes": len(jg.gm.graph.nodes),
            "representatives": len(pb.units),
            "edges": len(pb.edges),
            "options": sum(len(u.options) for u in pb.units),
            "shared_blocks": {c: m for c, m in reg.classes.items() if len(m) > 1},
        },
        "fallbacks": dict(sorted(fallbacks.items())),
        "manual_regions": {n: r.to_json() for n, r in jg.manual_regions.items()},
        "parameters": params,
        "nodes": nodes,
        "collectives": collectives,
    }
    return Plan(data)
