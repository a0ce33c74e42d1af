"""The planner's named steps, from a model on meta to the chosen placements.

`Planner(settings, say, trace_cache).solve(model, mesh_names, mesh_sizes, inputs, pins)` runs

  trace      the joint forward + backward graph on fake tensors (`graph/stamp.trace_step`),
             or the one traced before for the same shapes (`trace_cache`);
  blocks     the repeated blocks, so one block's choices are made for all (`graph/blocks.py`);
  problem    every node's placements and their prices (`solve/problem.Problem`);
  pins       inputs, the output (through the tangent that mirrors it) and the user's
             parameter pins, each checked against the tensor it pins;
  starts     each expert recipe (FSDP, FSDP+TP where the mesh has tp) priced: its placements
             pinned, the rest descended (`solve/descent.py`), FSDP2's runtime priced on top;
  descent    from replicate-everywhere and from the cheapest recipe (or, for the "joint"
             solver, one exact program over every mesh dim, `solve/joint.py`);
  rank       the candidates (recipes included, unless parameters were pinned) by fitting the
             budget, then predicted step time, then the programs' objective;
  keep       the chosen assignment with gathered parameters kept for the backward where that
             fits and is faster (`keep_gathered`),

and returns a `Solution`: the assignment, its price, the priced recipes, the best start and the
solver's work, with each step's time and size in `phases`. `api.plan_model` turns a Solution
into a Plan. Each step logs one line through `say`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from titan_autopar import checks
from titan_autopar.cost.hardware import GiB, Hardware
from titan_autopar.cost.loop import loop_seconds
from titan_autopar.cost.memory import Precision
from titan_autopar.graph.blocks import find_blocks
from titan_autopar.graph.manual import ManualRegionError
from titan_autopar.graph.recompute import check_mode
from titan_autopar.graph.stamp import trace_step
from titan_autopar.solve.descent import DescentStats, descend, initial_assignment, objective_ms
from titan_autopar.solve.errors import MemoryBudgetError, memory_floor
from titan_autopar.solve.ilp import SolveLimits
from titan_autopar.solve.joint import check_joint_size, solve_joint
from titan_autopar.solve.problem import Problem
from titan_autopar.solve.recipes import RECIPES, TENSOR, recipe_placements
from titan_autopar.strategy.options import OptionBuilder


@dataclass(frozen=True)
class PlannerSettings:
    """What the steps are run with, already checked (`api.plan_model` checks them)."""

    hardware: Hardware
    precision: Precision
    budget: float  # bytes per device
    solver: str  # highs | cbc | joint
    effort: str  # full | screen
    limits: SolveLimits
    activation_checkpointing: str
    cp_attention: str
    param_dtype: object  # torch.dtype or None
    loop_collectives: tuple = ()

    @property
    def programs(self) -> str:
        """What solves the descents' per-dim programs ("joint" checks with HiGHS's)."""
        return "highs" if self.solver == "joint" else self.solver


@dataclass
class Pins:
    """What enters and leaves, and parameters the user placed."""

    inputs: list  # one placement tuple per input
    output: tuple | None = None
    parameters: dict | str | None = None  # name -> placements, or a recipe's name


@dataclass
class Solution:
    graph: object  # graph/trace.JointGraph
    problem: Problem
    builder: OptionBuilder
    assign: list
    price: object  # solve/problem.Price
    start: str
    priced: dict  # recipe -> {"price", "objective_ms"}
    stats: DescentStats
    user_pins: dict
    phases: dict = field(default_factory=dict)


def _trace_key(model, inputs, param_dtype, manual) -> tuple:
    """What a traced graph depends on besides the model: input shapes and dtypes, the compute
    dtype, and the manual regions' declarations on this mesh."""
    regions = json.dumps({n: r.to_json() for n, r in sorted(manual.items())}, sort_keys=True)
    return (id(model), tuple((tuple(x.shape), str(x.dtype)) for x in inputs),
            str(param_dtype), regions)


def _parameter_pins(given, shapes, names, sizes) -> dict:
    if given is None:
        return {}
    if isinstance(given, str):
        return recipe_placements(given, shapes, names, sizes)
    unknown = sorted(set(given) - set(shapes))
    if unknown:
        raise ValueError(f"parameter_placements names {unknown[:3]}, which the model does not have; "
                         f"its parameters are e.g. {list(shapes)[:3]}")
    for n, pl in given.items():
        if len(pl) != len(names):
            raise ValueError(f"parameter_placements[{n!r}] has {len(pl)} placements; the mesh has "
                             f"{len(names)} dims: give one per dim")
    return {n: tuple(pl) for n, pl in given.items()}


class Planner:
    def __init__(self, settings: PlannerSettings, say: Callable[[str], None],
                 trace_cache: dict | None = None):
        self.s = settings
        self.say = say
        self.trace_cache = trace_cache
        self.stats = DescentStats()
        self.phases: dict[str, dict] = {}

    def fits(self, price) -> bool:
        return price.peak_memory <= self.s.budget * (1 + 1e-9)

    # -- trace, blocks, problem, pins -------------------------------------------------------

    def trace(self, model, inputs, manual):
        t = time.perf_counter()
        key = _trace_key(model, inputs, self.s.param_dtype, manual)
        cache = self.trace_cache
        if cache is not None and key in cache:
            jg, blocks = cache[key]
            self.say(f"[trace] reused the graph traced for the same shapes "
                     f"({len(jg.gm.graph.nodes)} nodes)")
        else:
            try:
                jg = trace_step(model, inputs, self.s.param_dtype, manual)
            except ManualRegionError:  # a declaration its tensors cannot take: says which
                raise
            except Exception as e:  # the model's own code, run on the sample inputs
                raise checks.traced_model_error(e, inputs) from e
            blocks = None
        self.phases["trace"] = {"seconds": time.perf_counter() - t,
                                "nodes": len(jg.gm.graph.nodes),
                                # what make_fx traced: four blocks' graph where the rest was stamped
                                "traced_nodes": jg.traced_nodes or len(jg.gm.graph.nodes)}
        how = (f", stamped from {jg.traced_blocks} traced blocks ({jg.traced_nodes} nodes)"
               if jg.traced_blocks else "")
        self.say(f"[trace] {self.phases['trace']['nodes']} nodes in "
                 f"{self.phases['trace']['seconds']:.2f}s{how}")
        return jg, blocks, key

    def blocks(self, jg, blocks, key):
        t = time.perf_counter()
        blocks = blocks or find_blocks(jg)
        if self.trace_cache is not None:
            self.trace_cache[key] = (jg, blocks)
        self.phases["blocks"] = {
            "seconds": time.perf_counter() - t,
            "classes": {c: len(m) for c, m in blocks.classes.items() if len(m) > 1},
            "representatives": len(set(blocks.rep.values())),
        }
        self.say(f"[blocks] {self.phases['blocks']['representatives']} representative nodes; "
                 f"shared classes {self.phases['blocks']['classes']}")
        return blocks

    def problem(self, jg, blocks, first_dim_mesh, names, sizes):
        t = time.perf_counter()
        builder = OptionBuilder(first_dim_mesh, jg.manual_regions)
        pb = Problem(jg, blocks, builder, sizes, self.s.hardware, self.s.precision,
                     recompute=check_mode(self.s.activation_checkpointing), names=names,
                     ring_only=self.s.cp_attention == "ring")
        n_opts = sum(len(u.options) for u in pb.units)
        self.phases["enumerate"] = {"seconds": time.perf_counter() - t, "units": len(pb.units),
                                    "options": n_opts, "edges": len(pb.edges)}
        self.say(f"[enumerate] {len(pb.units)} units, {n_opts} single-dim options, "
                 f"{len(pb.edges)} edges in {self.phases['enumerate']['seconds']:.2f}s")
        return pb, builder

    def pin(self, pb, jg, pins: Pins, names, sizes, param_units, shapes) -> dict:
        """Pins the inputs and the output (through the tangent that mirrors it) on their units;
        returns the user's parameter pins, each checked against its tensor and any manual
        region's declaration."""
        for node, pl in zip(jg.input_nodes, pins.inputs):
            pb.units[pb.index[node]].pin = pl
        if pins.output is not None:
            pb.units[pb.index[jg.tangent_node]].pin = pins.output
        user_pins = _parameter_pins(pins.parameters, shapes, names, sizes)
        for n, pl in user_pins.items():
            pb.units[param_units[n]].pin = pl
            checks.pin_against_declaration(n, pl, pb.units[param_units[n]].region_pin, names)
        for u, unit in enumerate(pb.units):
            for m in range(len(sizes)):
                if not pb.allowed(u, m):
                    declared = unit.region_pin is not None and unit.region_pin[m] is not None
                    what = (f"the manual region's param_placements for {unit.param_name!r}"
                            if declared else f"parameter_placements[{unit.param_name!r}]"
                            if unit.param_name else f"pin of {unit.node.name}")
                    pl = unit.region_pin if declared else unit.pin
                    raise ValueError(f"{what} = {pl} puts {pl[m]!r} on {names[m]!r}, which a "
                                     f"tensor of shape {tuple(unit.outs[0].shape)} cannot be "
                                     "stored as: use Replicate() or Shard(d) of a dim longer "
                                     "than 1")
        if self.s.solver == "joint":  # one too large for the exact check is refused before any program
            check_joint_size(pb)
        if self.s.effort == "screen":  # a mesh that cannot hold the model: before any program
            floor, top = memory_floor(pb)
            if floor > self.s.budget * (1 + 1e-9):
                raise MemoryBudgetError(self.s.budget, floor, top, floor)
        return user_pins

    @staticmethod
    def parameters(pb) -> tuple[dict[str, int], dict[str, tuple[int, ...]]]:
        """Each parameter's unit, and its shape."""
        units = {u.param_name: i for i, u in enumerate(pb.units) if u.kind == "param"}
        return units, {n: tuple(pb.units[i].outs[0].shape) for n, i in units.items()}

    # -- starts, descent, rank, keep --------------------------------------------------------

    def price_recipes(self, pb, names, sizes, param_units, shapes, user_pins, loop_s):
        """Each recipe's placements pinned and the rest descended; returns the starts
        [(recipe, assignment)] and the priced recipes."""
        s = self.s
        rounds = 1 if s.effort == "screen" else 3
        has_tp = any(n in TENSOR for n in names)
        recipes = [r for r in RECIPES if r != "fsdp_tp" or has_tp]
        if s.effort == "screen":  # the recipe TorchTitan would run on these degrees, then the other
            recipes.sort(key=lambda r: r != ("fsdp_tp" if has_tp else "fsdp"))
        priced: dict[str, dict] = {}
        starts = []
        for r in recipes:
            pins = recipe_placements(r, shapes, names, sizes)
            for n, i in param_units.items():
                pb.units[i].pin = pins[n]
            self.say(f"[solve] pricing the {r} recipe")
            a, _ = descend(pb, initial_assignment(pb), budget_bytes=s.budget, solver=s.programs,
                           limits=s.limits, max_rounds=rounds, log=self.say, stats=self.stats)
            for n, i in param_units.items():
                pb.units[i].pin = user_pins.get(n)
            price = pb.evaluate(a)
            price.framework = pb.fsdp_groups() * s.hardware.fsdp_group_overhead  # both run FSDP2
            if r == "fsdp_tp":  # and this one DTensor's runtime on each tensor-parallel matrix
                price.framework += pb.matrices() * s.hardware.tp_linear_overhead
            price.loop = loop_s
            priced[r] = {"price": price, "objective_ms": objective_ms(price, s.budget)}
            starts.append((r, a))
            if s.effort == "screen" and self.fits(price):
                break  # a screen needs one recipe that fits
        return starts, priced

    def descend_from_starts(self, pb, starts, priced, user_pins) -> list:
        """The candidates: each recipe as a plan (unless parameters were pinned elsewhere), and
        the descents from replicate-everywhere (what emerges owes nothing to the recipes) and
        from the cheapest recipe (so the plan can only improve on it)."""
        s = self.s
        cheapest = min(range(len(starts)), key=lambda i: priced[starts[i][0]]["objective_ms"])
        candidates = [] if user_pins else [(f"recipe {r}", a) for r, a in starts]
        auto_starts = (("replicate", initial_assignment(pb)), starts[cheapest])
        if s.solver == "joint":  # the exact check: one program over every mesh dim, no descent
            self.say("[solve] one joint program over every mesh dim")
            warm = initial_assignment(pb) if user_pins else starts[cheapest][1]
            res = solve_joint(pb, warm, budget_bytes=s.budget, limits=s.limits, stats=self.stats)
            candidates, auto_starts = [("joint", res.assign)], ()
        for name, a in auto_starts if s.effort == "full" else ():
            self.say(f"[solve] planning from the {name} start")
            a, _ = descend(pb, a, budget_bytes=s.budget, solver=s.solver, limits=s.limits,
                           log=self.say, stats=self.stats)
            candidates.append((name, a))
        return candidates

    def rank(self, pb, candidates):
        """The candidate that fits, then the fastest, then the lowest objective."""
        def key(c):
            p = pb.evaluate(c[1])
            return (not self.fits(p), round(p.step_time, 12), objective_ms(p, self.s.budget))

        return min(candidates, key=key)

    def keep_gathered(self, pb, assign, price):
        """The plan keeps gathered parameters from the forward to the backward (no second
        gather) where that fits the budget and is priced faster than FSDP's reshard after
        forward: the chosen assignment priced so, and (full effort) a descent from it under that
        pricing, whose programs then see the forward's gathered copies as free for the
        backward. The descent runs wherever the kept copies fit, also when keeping them gains
        nothing at the chosen assignment: gathering a weight before the view or cast its forward
        and backward read, or after it for each, costs the same when the backward gathers again,
        and only the first gains from keeping; which of two such equal plans the programs return
        is theirs to choose. Leaves `pb` pricing the choice made."""
        s = self.s
        pb.keep_gathered(True)
        best = (round(price.step_time, 12), 0, assign, price, False)
        kept = pb.evaluate(assign)
        if self.fits(kept) and any(e.again for e in pb.edges):
            tries = [(assign, kept)]
            if s.effort == "full":
                self.say("[solve] planning again with gathered parameters kept for the backward")
                a, _ = descend(pb, assign, budget_bytes=s.budget, solver=s.programs,
                               limits=s.limits, log=self.say, stats=self.stats)
                tries.append((a, pb.evaluate(a)))
            for i, (a, p) in enumerate(tries, 1):
                if self.fits(p) and (round(p.step_time, 12), i) < best[:2]:
                    best = (round(p.step_time, 12), i, a, p, True)
        pb.keep_gathered(best[4])
        if best[4]:
            self.say(f"[solve] keeping gathered parameters for the backward: "
                     f"{pb.held_gathered(best[2]) / GiB:.3f} GiB held, predicted step "
                     f"{best[3].step_time * 1e3:.2f} ms against {price.step_time * 1e3:.2f} ms")
        return best[2], best[3]

    # -- all of it ---------------------------------------------------------------------------

    def solve(self, model, mesh, names, sizes, inputs, manual, pins: Pins) -> Solution:
        jg, blocks, key = self.trace(model, inputs, manual)
        blocks = self.blocks(jg, blocks, key)
        pb, builder = self.problem(jg, blocks, mesh[names[0]], names, sizes)
        param_units, shapes = self.parameters(pb)
        user_pins = self.pin(pb, jg, pins, names, sizes, param_units, shapes)
        t = time.perf_counter()
        loop_s = loop_seconds(pb.topo, names, self.s.loop_collectives)
        starts, priced = self.price_recipes(pb, names, sizes, param_units, shapes, user_pins,
                                            loop_s)
        candidates = self.descend_from_starts(pb, starts, priced, user_pins)
        start, assign = self.rank(pb, candidates)
        st = self.stats
        self.phases["solve"] = {"seconds": time.perf_counter() - t,
                                "build_seconds": st.build_seconds,
                                "solver_seconds": st.solve_seconds, "programs": st.solves,
                                "max_variables": st.variables, "max_constraints": st.constraints}
        assign, price = self.keep_gathered(pb, assign, pb.evaluate(assign))
        price.loop = loop_s
        self.phases["solve"]["objective_ms"] = objective_ms(price, self.s.budget)
        self.say(f"[solve] {st.solves} programs in {self.phases['solve']['seconds']:.2f}s; "
                 f"predicted step {price.step_time * 1e3:.2f} ms, peak "
                 f"{price.peak_memory / GiB:.2f} GiB (best start: {start})")
        if not self.fits(price):
            floor, top = memory_floor(pb)
            raise MemoryBudgetError(self.s.budget, floor, top, price.peak_memory)
        return Solution(jg, pb, builder, assign, price, start, priced, st, user_pins,
                        self.phases)
