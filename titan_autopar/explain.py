"""Reading plans: `explain` (a per-layer table of parameter roles, the collectives, predictions)
and `diff` (what changed between two plans). Works from the Plan's JSON alone. Every string
taken from a plan file is shown with control characters escaped (`shown`), so a name in a
hand-edited file cannot move the cursor or clear a person's screen."""

from __future__ import annotations

from collections import defaultdict


def _escape(s: str) -> str:
    if s.isprintable():
        return s
    out = []
    for c in s:
        if c.isprintable():
            out.append(c)
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}")
    return "".join(out)


def shown(obj):
    """`obj` (a plan's JSON data) with every string, keys included, made safe to print."""
    if isinstance(obj, str):
        return _escape(obj)
    if isinstance(obj, dict):
        return {shown(k): shown(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shown(v) for v in obj]
    return obj


class _Shown:
    """The parts of a Plan that explain reads, escaped."""

    def __init__(self, plan):
        self.data = shown(plan.data)
        self.mesh_names = self.data["mesh"]["names"]
        self.parameters = self.data["parameters"]


def _memory_order(m: dict) -> list[str]:
    known = ("parameters", "gradients", "optimizer", "activations")
    return [k for k in known if k in m] + sorted(k for k in m if k not in known)


def _block_of(param: str, shared: dict[str, list[str]]) -> tuple[str, str]:
    """(block label, name inside the block) for a parameter name."""
    for cls, members in shared.items():
        for m in members:
            if param.startswith(m + "."):
                return f"{cls} (x{len(members)}, same plan for {members[0]}..{members[-1]})", param[len(m) + 1:]
    return "(not in a repeated block)", param


def _declared(plan, name: str) -> list:
    """A manual region's declaration for parameter `name` (None per dim it leaves open)."""
    for q, reg in plan.data["manual_regions"].items():
        if name.startswith(q + "."):
            return reg["params"].get(name[len(q) + 1:]) or []
    return []


def param_role(plan, name: str) -> str:
    """Each mesh dim's role for a parameter, in words."""
    pls = plan.parameters[name]
    declared = _declared(plan, name)
    gathered = {
        c["mesh_dim"]
        for c in plan.data["collectives"]
        if c["producer"] == name and c["collective"] == "all_gather"
    }
    roles = []
    for i, (dim, p) in enumerate(zip(plan.mesh_names, pls)):
        if p == "R":
            continue
        if i < len(declared) and declared[i] is not None:
            roles.append(f"{p} over {dim} as its manual region declares")
        elif dim in gathered:
            roles.append(f"FSDP-sharded {p} over {dim}")
        elif p == "S(0)":
            roles.append(f"TP column over {dim}")
        elif p == "S(1)":
            roles.append(f"TP row over {dim}")
        else:
            roles.append(f"{p} over {dim}")
    return ", ".join(roles) if roles else "replicated"


def _fmt_bytes(b: float) -> str:
    for unit, f in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if b >= f:
            return f"{b / f:.1f} {unit}"
    return f"{int(b)} B"


def explain(plan, max_collectives: int = 25) -> str:
    plan = _Shown(plan)
    d = plan.data
    names = plan.mesh_names
    out = []
    mesh = " x ".join(f"{n}={s}" for n, s in zip(names, d["mesh"]["shape"]))
    cross = [n for n, c in zip(names, d["mesh"]["crosses_nodes"]) if c]
    out.append(f"Plan for a {mesh} mesh on {d['hardware']['name']} "
               f"(dims crossing nodes: {', '.join(cross) or 'none'})")
    p = d["predicted"]
    out.append(
        f"Predicted step {p['step_time_s'] * 1e3:.2f} ms = compute {p['compute_s'] * 1e3:.2f} ms + "
        f"exposed comm {p['exposed_comm_s'] * 1e3:.2f} ms (all comm {p['total_comm_s'] * 1e3:.2f} ms)"
        + (f" + the training loop's own collectives {p['loop_s'] * 1e3:.2f} ms"
           if p.get("loop_s") else "")
    )
    m = p["memory_gib"]
    out.append(
        f"Peak memory per rank {p['peak_memory_gib']:.2f} GiB of {d['memory_budget_gib']:.2f}: "
        + ", ".join(f"{k} {m[k]:.2f}" for k in _memory_order(m))
    )
    rs = d.get("recipe_schedule")
    if rs:
        rp = d["recipes"][rs["recipe"]]
        out.append(f"Runs as the {rs['recipe']} recipe under TorchTitan ([auto_parallel] "
                   f"recipe_runtime): {rs['why']}; predicted {rp['step_time_s'] * 1e3:.2f} ms "
                   "with FSDP2's runtime")
    if d.get("reshard_after_forward") is False:
        out.append("Gathered parameters are kept from the forward to the backward (FSDP would "
                   "gather them again): held in the parameters' memory, each gathered once")
    for r, rp in d.get("recipes", {}).items():
        ratio = rp["step_time_s"] / p["step_time_s"] if p["step_time_s"] else float("nan")
        out.append(
            f"Expert recipe {r}: step {rp['step_time_s'] * 1e3:.2f} ms"
            + (f" (of which the framework's runtime {rp['framework_s'] * 1e3:.2f} ms: FSDP2's"
               + (", DTensor's" if r == "fsdp_tp" else "") + ")"
               if rp.get("framework_s") else "")
            + f", peak {rp['peak_memory_gib']:.2f} GiB (plan is {ratio:.3f}x its speed)"
        )
    s = d["solver"]
    out.append(f"Solver {s['name']}: {s['status']} (gap {s['gap']:.4f}), {s['programs']} programs, "
               f"largest {s['max_variables']} variables / {s['max_constraints']} rows")
    if d["manual_regions"]:
        by_style: dict[str, list[str]] = defaultdict(list)
        for name, reg in d["manual_regions"].items():
            by_style[reg["style"]].append(name)
        for style, names_ in sorted(by_style.items()):
            shown_names = ", ".join(names_[:4]) + (f" and {len(names_) - 4} more" if len(names_) > 4 else "")
            out.append(f"Manual regions ({style}, run as their code is written): {shown_names}")
    if d["fallbacks"]:
        out.append("Ops with no sharding rule (replicated): "
                   + ", ".join(f"{k} x{v}" for k, v in d["fallbacks"].items()))
    out.append("")
    shared = d["sizes"]["shared_blocks"]
    groups: dict[str, list] = defaultdict(list)
    seen_rel: dict[str, set] = defaultdict(set)
    for name in plan.parameters:
        block, rel = _block_of(name, shared)
        if rel in seen_rel[block]:
            continue
        seen_rel[block].add(rel)
        groups[block].append((rel, name))
    w = max((len(rel) for g in groups.values() for rel, _ in g), default=10) + 2
    out.append(f"{'parameter':<{w}}{'placement (' + ', '.join(names) + ')':<28}role")
    for block, items in groups.items():
        out.append(f"-- {block}")
        for rel, name in items:
            pl = "[" + ", ".join(plan.parameters[name]) + "]"
            out.append(f"  {rel:<{w - 2}}{pl:<28}{param_role(plan, name)}")
    out.append("")
    colls = d["collectives"]
    total = sum(c["bytes"] * c["count"] for c in colls)
    out.append(f"Collectives per step: {sum(c['count'] for c in colls)} "
               f"({_fmt_bytes(total)} in all); largest first:")
    out.append(f"  {'collective':<15}{'dim':<13}{'bytes':>11}{'count':>7}  {'kind':<11}what")
    for c in colls[:max_collectives]:
        out.append(
            f"  {c['collective']:<15}{c['mesh_dim']:<13}{_fmt_bytes(c['bytes']):>11}{c['count']:>7}  "
            f"{c['kind']:<11}{c['producer']} -> {c['consumer']} "
            f"[{','.join(c['from'])}] -> [{','.join(c['to'])}]"
        )
    if len(colls) > max_collectives:
        out.append(f"  ... {len(colls) - max_collectives} more in the plan's \"collectives\"")
    return "\n".join(out)


def diff(a, b) -> str:
    out = []
    a, b = _Shown(a), _Shown(b)
    da, db = a.data, b.data
    if da["fingerprint"]["model"] != db["fingerprint"]["model"]:
        out.append(f"these are plans of different models (model fingerprints "
                   f"{da['fingerprint']['model']} and {db['fingerprint']['model']}): what follows "
                   "compares unrelated layers")
    if da["fingerprint"] != db["fingerprint"]:
        for k in sorted(set(da["fingerprint"]) | set(db["fingerprint"])):
            if da["fingerprint"].get(k) != db["fingerprint"].get(k):
                out.append(f"fingerprint {k}: {da['fingerprint'].get(k)} -> {db['fingerprint'].get(k)}")
    pa, pb = da["predicted"], db["predicted"]
    for k in ("step_time_s", "compute_s", "exposed_comm_s", "peak_memory_gib"):
        if pa[k] != pb[k]:
            out.append(f"predicted {k}: {pa[k]:.6g} -> {pb[k]:.6g}")
    changed = [n for n in sorted(set(a.parameters) | set(b.parameters))
               if a.parameters.get(n) != b.parameters.get(n)]
    for n in changed:
        out.append(f"parameter {n}: {a.parameters.get(n)} -> {b.parameters.get(n)}")
    na, nb = da["nodes"], db["nodes"]
    nodes_changed = sum(1 for n in set(na) | set(nb) if na.get(n) != nb.get(n))
    if nodes_changed:
        out.append(f"{nodes_changed} graph nodes changed placement")
    ca = sum(c["bytes"] * c["count"] for c in da["collectives"])
    cb = sum(c["bytes"] * c["count"] for c in db["collectives"])
    if ca != cb:
        out.append(f"collective bytes per step: {ca} -> {cb}")
    return "\n".join(out) if out else "plans are identical"
