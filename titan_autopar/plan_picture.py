"""A picture of a plan (`titan-autopar show plan.json --out plan.png`), from its JSON alone.

Four panels:
  placements     one row per weight (a repeated block's weights once, for all its layers), one
                 column per mesh dim; each cell the weight's placement on that dim, coloured by
                 kind (replicated, sharded on dim 0, on dim 1, other shards, a manual region's)
  memory         one rank's peak split into parameters, gradients, optimizer state and
                 activations, for the plan and each priced recipe, with the budget
  communication  seconds per step of each collective kind on each mesh dim, its MiB on the bar
  step time      compute and exposed communication, for the plan and each priced recipe

The PNG is written whole (`pictures.save_png`) and titled, so that `show --out` can replace an
earlier picture of its own and refuse anyone else's (`is_plan_picture`).
"""

from __future__ import annotations

from collections import defaultdict

from titan_autopar.explain import shown
from titan_autopar.pictures import png_titled, save_png

COLOURS = {"R": "#d9d9d9", "S(0)": "#4c78a8", "S(1)": "#59a14f", "S": "#f28e2b", "P": "#e15759"}
MEMORY_KINDS = ("parameters", "gradients", "optimizer", "activations")
PICTURE_TITLE = "titan-autopar show"  # in the PNG's Title chunk: how a later `show` knows it


def _rows(data: dict) -> list[tuple[str, list[str]]]:
    """(label, placements) per weight: a repeated block's weights once, labelled with its
    layers; then the weights outside any repeated block."""
    shared = data["sizes"].get("shared_blocks", {})
    params = data["parameters"]
    rows, seen = [], set()
    for rep, members in shared.items():
        for name, pl in params.items():
            if name.startswith(rep + "."):
                rows.append((f"{members[0]}..{members[-1].split('.')[-1]} {name[len(rep) + 1:]}", pl))
        for m in members:
            seen.update(n for n in params if n.startswith(m + "."))
    rows += [(n, pl) for n, pl in params.items() if n not in seen]
    return rows


def _colour(p: str) -> str:
    return COLOURS.get(p, COLOURS["S"] if p.startswith("S(") else COLOURS["P"])


def draw(plan, path):
    """Write the picture of `plan` (a Plan) to `path` (PNG); returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = shown(plan.data)
    names = data["mesh"]["names"]
    rows = _rows(data)
    h = max(6.0, 0.22 * len(rows) + 2)
    fig = plt.figure(figsize=(15, h))
    grid = fig.add_gridspec(3, 2, width_ratios=[1, 1.6])
    ax = fig.add_subplot(grid[:, 0])
    for i, (label, pls) in enumerate(rows):
        for j, p in enumerate(pls):
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color=_colour(p), ec="white"))
            ax.text(j + 0.5, i + 0.5, p, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, len(names))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(names))], names)
    ax.xaxis.tick_top()
    ax.set_yticks([i + 0.5 for i in range(len(rows))], [r[0] for r in rows], fontsize=7)
    ax.set_title("placement of each weight on each mesh dim", fontsize=10, pad=20)
    for s in ax.spines.values():
        s.set_visible(False)

    arms = {"auto (this plan)": data["predicted"], **data["recipes"]}
    ax = fig.add_subplot(grid[0, 1])
    left = [0.0] * len(arms)
    for k in MEMORY_KINDS:
        vals = [a["memory_gib"].get(k, 0.0) for a in arms.values()]
        ax.barh(list(arms), vals, left=left, label=k)
        left = [x + v for x, v in zip(left, vals)]
    budget = data.get("memory_budget_gib")
    shown_budget = budget if budget and budget < 2 * max(left) else 0.0
    if shown_budget:
        ax.axvline(budget, color="black", ls="--", lw=1, label=f"budget {budget:.3g} GiB")
    ax.set_xlabel("GiB per rank (predicted peak)" + ("" if shown_budget or not budget
                                                     else f"; budget {budget:.3g} GiB"))
    ax.set_xlim(0, 1.45 * max(max(left), shown_budget))
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="center right")
    ax.set_title("memory per rank", fontsize=10)

    ax = fig.add_subplot(grid[1, 1])
    secs, mib = defaultdict(float), defaultdict(float)
    for c in data["collectives"]:
        key = f"{c['collective']}\n{c['mesh_dim']}"
        secs[key] += c["count"] * c["seconds_each"]
        mib[key] += c["count"] * c["bytes"] / 2**20
    keys = sorted(secs, key=lambda k: -secs[k])
    bars = ax.bar(keys, [secs[k] * 1e3 for k in keys], color="#76b7b2")
    for b, k in zip(bars, keys):
        size = f"{mib[k] / 1024:.3g} GiB" if mib[k] >= 1024 else f"{mib[k]:.3g} MiB"
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), size,
                ha="center", va="bottom", fontsize=7)
    ax.set_ylabel("ms per step (before overlap)")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title("communication by kind and mesh dim", fontsize=10)

    ax = fig.add_subplot(grid[2, 1])
    comp = [a["compute_s"] * 1e3 for a in arms.values()]
    comm = [a["exposed_comm_s"] * 1e3 for a in arms.values()]
    # a recipe's FSDP2 (and under TP DTensor) runtime (plans written before it was priced have none)
    fw = [a.get("framework_s", 0.0) * 1e3 for a in arms.values()]
    ax.barh(list(arms), comp, label="compute", color="#4c78a8")
    ax.barh(list(arms), comm, left=comp, label="exposed communication", color="#e15759")
    if any(fw):
        ax.barh(list(arms), fw, left=[c + e for c, e in zip(comp, comm)],
                label="FSDP2 / DTensor runtime", color="#f2b447")
    loop = [a.get("loop_s", 0.0) * 1e3 for a in arms.values()]  # the same for every arm
    if any(loop):
        ax.barh(list(arms), loop, left=[c + e + f for c, e, f in zip(comp, comm, fw)],
                label="training loop's collectives", color="#9c755f")
    ends = [c + e + f + g for c, e, f, g in zip(comp, comm, fw, loop)]
    for i, end in enumerate(ends):
        ax.text(end, i, f" {end:.4g} ms", va="center", fontsize=7)
    ax.set_xlim(0, 1.45 * max(ends))
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (predicted)")
    ax.legend(fontsize=7, loc="center right")
    ax.set_title("step time", fontsize=10)

    mesh = " x ".join(f"{n}={s}" for n, s in zip(names, data["mesh"]["shape"]))
    fig.suptitle(f"plan on {mesh}, priced for {data['hardware']['name']}", fontsize=12)
    fig.tight_layout()
    try:
        return save_png(fig, path, PICTURE_TITLE, dpi=110)
    finally:
        plt.close(fig)


def is_plan_picture(path) -> bool:
    """True if `path` holds a picture `draw` made (the guard on `show --out` replaces only
    those unless forced)."""
    return png_titled(path, PICTURE_TITLE)
