"""Bad input around plans: hand-edited plan files whose fields have the wrong type or range,
plans whose placements disagree with the program they would build, manual-region declarations
their tensors cannot take, and expert parallelism asked for where no region would run it. Each
ends in one line that names the field, region or setting and what to write instead; CLI cases
run `titan-autopar` in this process (exit code 2, one line on stderr, no traceback)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.tensor import Partial, Replicate, Shard

from conftest import tiny_llama
from titan_autopar import Plan, apply_plan, manual, plan_model
from titan_autopar.cli import main
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.graph.manual import ManualRegionError, resolve_all
from titan_autopar.plan_check import PlanError, check_against_graph
from titan_autopar.titan.config_check import ConfigError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "examples"))
import manual_moe  # noqa: E402  (the example of docs/manual_regions.md)
from test_bad_input import edited  # noqa: E402
from test_manual import DIM, WithDoubler  # noqa: E402

QUIET = dict(progress=lambda s: None)
MESH = (("dp_shard", "tp"), (2, 2))
LLAMA4 = REPO / "train_configs/llama4_debug_cpu_auto4.toml"


def cli(args, capsys) -> tuple[int, str, str]:
    """Run the CLI in this process: (exit code, stdout, stderr); a refusal is one line."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err, out.out + out.err
    if code == 2:
        assert len(out.err.strip().splitlines()) == 1, out.err
    return code, out.out, out.err


def tiny():
    return tiny_llama(dim=128, layers=1, seq=32, n_heads=4)


TOKENS = torch.zeros(2, 32, dtype=torch.long)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A real plan of one llama layer on a 2 x 2 (dp_shard, tp) mesh, its file and its graph."""
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    mesh = fake_mesh(*MESH)
    cache: dict = {}
    plan_model(tiny(), mesh, (TOKENS,), trace_cache=cache, **QUIET).save(path)
    (jg, _), = cache.values()
    return path, jg


# ---------------------------------------------------------------- plan fields: type and range
def _fsdp_schedule(**fields):
    return lambda d: d.update(recipe_schedule=fields)


@pytest.mark.parametrize("edit, says", [
    (lambda d: d["predicted"].update(loop_s="x"),
     "predicted.loop_s: expected a number of seconds >= 0, found the string 'x'"),
    (lambda d: d["predicted"].update(framework_s="x"),
     "predicted.framework_s: expected a number of seconds >= 0, found the string 'x'"),
    (lambda d: d["recipes"]["fsdp"].update(framework_s="x"),
     "recipes.fsdp.framework_s: expected a number of seconds >= 0, found the string 'x'"),
    (lambda d: d["predicted"].update(compute_s=-0.5),
     "predicted.compute_s: expected a number of seconds >= 0, found -0.5"),
    (lambda d: d["predicted"]["memory_gib"].update(activations=[1]),
     "predicted.memory_gib.activations: expected a number of GiB >= 0, found a list"),
    (lambda d: d["recipes"]["fsdp_tp"].update(peak_memory_gib=None),
     "recipes.fsdp_tp.peak_memory_gib: expected a number of GiB >= 0, found null"),
    (lambda d: d["recipes"].update(ddp=d["recipes"]["fsdp"]),
     "recipes.ddp: is no recipe: the priced recipes are fsdp, fsdp_tp"),
    (_fsdp_schedule(recipe="fsdp"), "recipe_schedule.gain_pct: expected a number, found null"),
    (_fsdp_schedule(recipe="fsdp", gain_pct=2.5),
     "recipe_schedule.why: expected a string, found null"),
    (_fsdp_schedule(recipe="fsdp_tp", gain_pct=2.5, why="close"),
     "recipe_schedule.recipe: found the string 'fsdp_tp'; expected 'fsdp'"),
    (lambda d: d.update(recipe_schedule="fsdp"), "recipe_schedule: expected an object"),
    (lambda d: d.update(planner_revision="5"),
     "planner_revision: expected a whole number, found the string '5'"),
    (lambda d: d["fingerprint"]["inputs"][0].__setitem__(1, "torch.int65"),
     "fingerprint.inputs[0][1]: expected a torch dtype such as 'torch.int64', found 'torch.int65'"),
    (lambda d: d["solver"].update(name="gurobi"),
     "solver.name: found the string 'gurobi'; expected one of highs, cbc, joint"),
    (lambda d: d["collectives"][0].update(kind="bulk"),
     "collectives[0].kind: found the string 'bulk'; expected one of parameter, activation, region"),
    (lambda d: d["collectives"][0].update(seconds_each="slow"),
     "collectives[0].seconds_each: expected a number of seconds >= 0"),
    (lambda d: d.update(reshard_after_forward="no"),
     "reshard_after_forward: found the string 'no'; expected true or false"),
    (lambda d: d.update(cp_attention="spiral"), "cp_attention: found the string 'spiral'"),
    (lambda d: d["mesh"]["crosses_nodes"].__setitem__(0, "yes"),
     "mesh.crosses_nodes[0]: expected true or false"),
    (lambda d: d["sizes"].update(shared_blocks={"layers.0": []}),
     "sizes.shared_blocks.layers.0: empty"),
    (lambda d: d["manual_regions"].update(moe={"style": "mine", "in": [], "out": [], "params": {}}),
     "manual_regions['moe'].style: found the string 'mine'"),
    (lambda d: d.update(timings=[]), "timings: expected an object, found a list"),
])
def test_plan_fields_are_checked_on_load(edit, says, planned, tmp_path, capsys):
    bad = edited(planned[0], tmp_path, edit)
    code, _, err = cli(["explain", bad], capsys)
    assert code == 2 and f"{bad}: {says}" in err, err


@pytest.mark.parametrize("command", ["explain", "show", "diff"])
def test_every_reader_refuses_the_same_field(command, planned, tmp_path, capsys):
    bad = edited(planned[0], tmp_path, lambda d: d.update(recipe_schedule={"recipe": "fsdp"}))
    picture = tmp_path / "plan.png"
    args = {"explain": [bad], "show": [bad, "--out", picture], "diff": [planned[0], bad]}
    code, _, err = cli([command, *args[command]], capsys)
    assert code == 2 and "recipe_schedule.gain_pct: expected a number" in err, err
    assert not picture.exists()


# ---------------------------------------------------------------- plans against their program
def _attention(d) -> dict:
    return next(e for e in d["nodes"].values() if "flash_attention_for_cpu.default" in e["op"])


def _param_node(d, jg, name) -> dict:
    return d["nodes"][jg.param_nodes[name].name]


def _place(name, pl):
    """Edit parameter `name` to `pl` in `parameters` and in its graph node alike."""
    def edit(d, jg):
        d["parameters"][name] = pl
        _param_node(d, jg, name)["out"][0] = pl
    return edit


def _head_dim(d, jg):  # q, k, v (batch, heads, seq, head_dim) sharded on head_dim over tp
    e = _attention(d)
    e["in"] = [["S(0)", "S(3)"]] * 3
    e["out"][0] = ["S(0)", "S(3)"]


def _q_on_heads(d, jg):  # over tp: q's heads split, k and v whole
    _attention(d)["in"][0][1] = "S(1)"


def _ring_twice(d, jg):  # the sequence over both mesh dims
    e = _attention(d)
    e["in"] = [["S(2)", "S(2)"]] * 3
    e["out"] = [["S(2)", "S(2)"], ["S(2)", "S(2)"]]


def _mm_partial(d, jg):
    e = next(e for e in d["nodes"].values()
             if e["op"] == "aten.mm.default" and e["in"][1] == ["R", "R"])
    e["out"][0] = ["P", e["out"][0][1]]


def _mm_without_inputs(d, jg):
    next(e for e in d["nodes"].values() if e["op"] == "aten.mm.default").pop("in")


def _batch_over_four(d, jg):  # 2 sequences over 2 x 2 ranks
    d["nodes"][jg.input_nodes[0].name]["out"][0] = ["S(0)", "S(0)"]


@pytest.mark.parametrize("edit, says", [
    (_head_dim, "on mesh dim 'tp': in [S(3), S(3), S(3)] -> out [S(3), "),
    (_q_on_heads, "on mesh dim 'tp': in [S(1), R, R] -> out [R, R] is not a way this op runs, "
     "so the program would compute something else"),
    (_ring_twice, "shards attention's sequence over mesh dims 'dp_shard', 'tp': ring attention "
     "runs on one mesh dim"),
    (_mm_partial, "(aten.mm.default) on mesh dim 'dp_shard': in [S(0), R] -> out [P] is not a "
     "way this op runs"),
    (_mm_without_inputs, "(aten.mm.default): has placements for 1 outputs and 0 inputs; the op "
     "has 1 and 2"),
    (_batch_over_four, ".out[0] = ['S(0)', 'S(0)'] splits dim 0 (size 2) of a tensor of shape "
     "(2, 32) over dp_shard=2, tp=2, which does not divide it"),
    (_place("norm.weight", ["P", "R"]), "(parameter norm.weight) is P on mesh dim 'dp_shard', "
     "which a graph input (parameter, buffer or input) of shape (128,) cannot be"),
    (_place("layers.0.attention.wq.weight", ["S(3)", "R"]),
     "].out[0] = ['S(3)', 'R'] shards dim 3 of a tensor with 2 dims (shape (128, 128))"),
    (lambda d, jg: d["parameters"].update({"output.weight": ["R", "S(1)"]}),
     "parameters['output.weight']: says ['R', 'S(1)'], but its graph node"),
])
def test_placements_that_disagree_with_the_program_are_refused(edit, says, planned):
    path, jg = planned
    d = json.loads(path.read_text())
    check_against_graph(d, jg, "plan.json", fake_mesh(*MESH))  # the plan as made passes
    edit(d, jg)
    with pytest.raises(PlanError) as e:
        check_against_graph(d, jg, "plan.json", fake_mesh(*MESH))
    assert str(e.value).startswith("plan.json: ") and says in str(e.value), str(e.value)


def test_apply_refuses_attention_weights_sharded_past_their_dims(planned, tmp_path):
    """The edit that trained with slightly wrong losses: q, k, v and out weights S(3)."""
    path, jg = planned

    def edit(d):
        for w in ("wq", "wk", "wv", "wo"):
            _place(f"layers.0.attention.{w}.weight", ["S(3)", "R"])(d, jg)

    bad = Plan.load(edited(path, tmp_path, edit))
    with pytest.raises(PlanError) as e:
        apply_plan(tiny(), bad, fake_mesh(*MESH), **QUIET)
    assert "edited.json: nodes[" in str(e.value)
    assert "shards dim 3 of a tensor with 2 dims (shape (128, 128))" in str(e.value)


@pytest.fixture(scope="module")
def moe_plan(tmp_path_factory):
    """The example MoE block (docs/manual_regions.md) planned on (dp_shard, ep), and its graph."""
    mesh = fake_mesh(("dp_shard", "ep"), (2, 2))
    with torch.device("meta"):
        model = manual_moe.mark(manual_moe.Model(32, 8, ep=2))
    x = torch.zeros(8, 4, 32, device="meta")
    cache: dict = {}
    plan = plan_model(model, mesh, (x,), trace_cache=cache, **QUIET)
    (jg, _), = cache.values()
    return json.loads(plan.to_json()), jg, mesh


def test_a_region_parameter_off_its_declaration_is_refused(moe_plan):
    d, jg, mesh = moe_plan
    d = json.loads(json.dumps(d))
    assert d["parameters"]["moe.w"][1] == "S(0)"
    _place("moe.w", [d["parameters"]["moe.w"][0], "R"])(d, jg)
    with pytest.raises(PlanError) as e:
        check_against_graph(d, jg, "plan.json", mesh)
    assert ("plan.json: parameters['moe.w']: is ['S(0)', 'R'], but its manual region 'moe' "
            "declares S(0) on 'ep'") in str(e.value), str(e.value)


# ---------------------------------------------------------------- manual() declarations


def doubler() -> WithDoubler:
    with torch.device("meta"):
        return WithDoubler()


def test_a_negative_parameter_dim_is_counted_from_the_end_and_the_plan_loads(tmp_path):
    model = doubler()
    manual(model.inner, in_placements=[(Shard(0),)], out_placements=[(Shard(0),)],
           param_placements={"proj.weight": (Shard(-1),)})
    plan = plan_model(model, fake_mesh(("dp_shard",), (2,)), (torch.zeros(8, 4, DIM),), **QUIET)
    loaded = Plan.load(plan.save(tmp_path / "plan.json"))
    assert loaded.data["manual_regions"]["inner"]["params"]["proj.weight"] == ["S(1)"]
    assert loaded.parameters["inner.proj.weight"] == ["S(1)"]


@pytest.mark.parametrize("kwargs, says", [
    (dict(in_placements=[(Shard(-1),)], out_placements=[(Shard(0),)]),
     "manual(Doubler): in_placements[0] puts Shard(-1) on mesh dim 0: count the tensor dim from "
     "the front, Shard(d) with d >= 0"),
    (dict(in_placements=[{"dp_shard": Shard(0)}], out_placements=[{"dp_shard": Shard(-2)}]),
     "manual(Doubler): out_placements[0] puts Shard(-2) on 'dp_shard': count the tensor dim"),
    (dict(in_placements=[(Shard(0),)], out_placements=[(Shard(0),)],
          param_placements={"proj.weight": {"dp_shard": Shard(3)}}),
     "manual(Doubler): param_placements['proj.weight'] puts Shard(3) on 'dp_shard', but "
     "proj.weight has 2 dims (shape (32, 32)): use a dim from 0 to 1"),
    (dict(in_placements=[(Shard(0),)], out_placements=[(Shard(0),)],
          param_placements={"proj.bias": (Partial(),)}),
     "param_placements['proj.bias'] puts Partial() on mesh dim 0: a parameter is stored "
     "Replicate() or Shard(d)"),
])
def test_declarations_manual_refuses(kwargs, says):
    with pytest.raises(ManualRegionError) as e:
        manual(doubler().inner, **kwargs)
    assert says in str(e.value), str(e.value)


def test_an_expert_dim_the_parameter_does_not_have():
    """param_placements={"w": {"ep": Shard(3)}} on the example's (experts, dim, dim) weight."""
    with torch.device("meta"):
        model = manual_moe.Model(DIM, 8, ep=2)
    with pytest.raises(ManualRegionError) as e:
        manual(model.moe, in_placements=[{"ep": Shard(0)}], out_placements=[{"ep": Shard(0)}],
               param_placements={"w": {"ep": Shard(3)}})
    assert ("manual(AllToAllMoE): param_placements['w'] puts Shard(3) on 'ep', but w has 3 dims "
            "(shape (8, 32, 32)): use a dim from 0 to 2") in str(e.value)


def test_a_pinned_dim_the_parameter_does_not_have():
    with pytest.raises(ValueError) as e:
        plan_model(tiny(), fake_mesh(*MESH), (TOKENS,), **QUIET,
                   parameter_placements={"norm.weight": (Shard(1), Replicate())})
    assert ("parameter_placements['norm.weight'] = (Shard(dim=1), Replicate()) puts Shard(dim=1) "
            "on 'dp_shard', which a tensor of shape (128,) cannot be stored as: use Replicate() "
            "or Shard(d) of a dim longer than 1") in str(e.value), str(e.value)


@pytest.mark.parametrize("declare, x, says", [
    (dict(in_placements=[(Shard(0),), (Shard(0),)], out_placements=[(Shard(0),)]),
     torch.zeros(8, 4, DIM), "manual region 'inner' (Doubler) declares 2 in_placements, but its "
     "forward is called with 1 tensor input: give one in_placements entry per tensor input"),
    (dict(in_placements=[(Shard(1),)], out_placements=[(Shard(1),)]), torch.zeros(8, 3, DIM),
     "manual region 'inner' (Doubler): in_placements[0] shards dim 1 of input 0 (shape "
     "(8, 3, 32)) over dp_shard=2, whose 2 ranks do not divide its size 3: declare a dim that 2 "
     "divides (or Replicate()), or give a size that is a multiple of 2"),
    (dict(in_placements=[(Replicate(),)], out_placements=[(Shard(3),)]), torch.zeros(8, 4, DIM),
     "manual region 'inner' (Doubler): out_placements[0] puts Shard(3) on 'dp_shard', but "
     "output 0 has 3 dims (shape (8, 4, 32))"),
    (dict(in_placements=[(Shard(0),)], out_placements=[(Shard(0),)],
          param_placements={"odd": (Shard(0),)}), torch.zeros(8, 4, DIM),
     "manual region 'inner' (Doubler): param_placements['odd'] shards dim 0 of parameter odd "
     "(shape (31,)) over dp_shard=2, whose 2 ranks do not divide its size 31"),
])
def test_declarations_the_tensors_cannot_take(declare, x, says):
    model = doubler()
    model.inner.odd = nn.Parameter(torch.zeros(DIM - 1, device="meta"))
    manual(model.inner, **declare)
    with pytest.raises(ManualRegionError) as e:
        plan_model(model, fake_mesh(("dp_shard",), (2,)), (x,), **QUIET)
    assert says in str(e.value), str(e.value)


# ---------------------------------------------------------------- expert parallelism
def llama4_job(tmp_path, **parallelism) -> Path:
    """The llama4 debug job with [parallelism] and [auto_parallel] values replaced."""
    text = LLAMA4.read_text()
    for key, value in parallelism.items():
        if key in ("manual_modules", "manual_style"):
            text = text.replace("[auto_parallel]\n", f"[auto_parallel]\n{key} = {json.dumps(value)}\n")
        else:
            text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


DATA_PARALLEL_WITH_EP = ('[auto_parallel] manual_style = "data_parallel" runs MoE blocks without '
                         "expert parallelism, but [parallelism] expert_parallel_degree = 2: set "
                         'manual_style = "torchtitan_ep"')


@pytest.mark.parametrize("settings, says", [
    (dict(expert_parallel_degree=2, manual_modules=["layers.*.moe"], manual_style="data_parallel"),
     DATA_PARALLEL_WITH_EP),
    (dict(expert_parallel_degree=2, manual_style="data_parallel"), DATA_PARALLEL_WITH_EP),
    (dict(manual_modules=["layers.*.moe"]), '[auto_parallel] manual_modules run as manual_style = '
     '"torchtitan_ep" (TorchTitan\'s ExpertParallel on the ep dim), but [parallelism] '
     "expert_parallel_degree = 1: set it above 1"),
    (dict(expert_parallel_degree=2, manual_style="ep"),
     "[auto_parallel] manual_style = 'ep': it must be one of 'torchtitan_ep', 'data_parallel'; "
     'write manual_style = "torchtitan_ep"'),
])
def test_plan_config_says_how_to_get_expert_parallelism(settings, says, tmp_path, capsys):
    job = llama4_job(tmp_path, **settings)
    code, _, err = cli(["plan", "--config", job, "--out", tmp_path / "p.json"], capsys)
    assert code == 2 and f"{job}: {says}" in err, err


def test_the_running_job_refuses_the_same_before_building_anything(tmp_path):
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.protocols.train_spec import get_train_spec

    job = llama4_job(tmp_path, expert_parallel_degree=2, manual_style="data_parallel")
    config = ConfigManager().parse_args(["--job.config_file", str(job)])
    dims = ParallelDims(dp_replicate=1, dp_shard=4, cp=1, tp=1, pp=1, ep=2, etp=1, world_size=4)
    with pytest.raises(ConfigError) as e:  # no model, no mesh: it stops before either is used
        get_train_spec("llama4").parallelize_fn(None, dims, config)
    assert f"{job}: {DATA_PARALLEL_WITH_EP}" in str(e.value)


def test_plan_with_an_ep_mesh_runs_the_moe_blocks_expert_parallel(tmp_path, capsys):
    """`plan --mesh dp_shard=2,ep=N` marks every MoE block torchtitan_ep, as a job with
    expert_parallel_degree = N does: here N = 3, which the 8 experts refuse before planning."""
    code, out, err = cli(["plan", "--model", "llama4", "--flavor", "debugmodel", "--seq-len", 16,
                          "--local-batch-size", 1, "--mesh", "dp_shard=2,ep=3",
                          "--out", tmp_path / "p.json"], capsys)
    assert "manual regions (torchtitan_ep): layers.1.moe, layers.3.moe, layers.5.moe" in out, out
    assert code == 2 and ("expert_parallel_degree = 3 does not divide the 8 experts of "
                          "layers.1.moe (the mesh's ep dim has 3 ranks)") in err, err
    assert not (tmp_path / "p.json").exists()


def test_the_cli_marks_what_the_job_marks():
    from titan_autopar.titan.manual_marks import mark_job_regions, mark_mesh_regions
    from titan_autopar.titan.models import build_model

    cli_model, _ = build_model("llama4", "debugmodel", 16)
    job_model, _ = build_model("llama4", "debugmodel", 16)
    names, sizes = ("dp_shard", "ep"), (2, 2)
    assert mark_mesh_regions(cli_model, names, sizes) == mark_job_regions(
        job_model, 2, (), "torchtitan_ep") == ["layers.1.moe", "layers.3.moe", "layers.5.moe"]
    cli_regions = {q: r.to_json() for q, r in resolve_all(cli_model, names, sizes).items()}
    job_regions = {q: r.to_json() for q, r in resolve_all(job_model, names, sizes).items()}
    assert cli_regions == job_regions
    assert cli_regions["layers.1.moe"]["params"]["experts.w1"] == [None, "S(0)"]


def test_an_ep_mesh_for_a_dense_model_is_refused(tmp_path, capsys):
    code, _, err = cli(["plan", "--model", "llama3", "--flavor", "debugmodel", "--seq-len", 16,
                        "--mesh", "dp_shard=2,ep=2", "--out", tmp_path / "p.json"], capsys)
    assert code == 2 and ("--mesh has ep=2, but Transformer has no MoE blocks to run "
                          "expert-parallel: leave ep out of --mesh") in err, err


def test_the_search_keeps_the_ep_dim_the_regions_need(tmp_path):
    """A job whose manual_modules run torchtitan_ep with ep = 2: every degree the search plans
    keeps an ep dim (the others are set aside, saying why), and the job's regions resolve on
    each of their meshes (a mesh without ep stopped the search there)."""
    from titan_autopar.cost.hardware import GiB, get_hardware
    from titan_autopar.solve.search import candidate_degrees
    from titan_autopar.titan.degree_search import _keep_regions_runnable, model_shape
    from titan_autopar.titan.job_file import planner_mesh, planning_job
    from titan_autopar.titan.manual_marks import mark_job_regions
    from titan_autopar.titan.models import build_model

    job = planning_job(llama4_job(tmp_path, expert_parallel_degree=2,
                                  manual_modules=["layers.*.moe"]))
    model, args = build_model(job.model, job.flavor, job.seq_len)
    mark_job_regions(model, job.expert_parallel, job.manual_modules, job.manual_style)
    hw = get_hardware(job.hardware)
    cands = candidate_degrees(job.world_size, hw.gpus_per_node, model_shape(model, args),
                              hw.hbm_bytes / GiB)
    without_ep = sum(c.degrees.ep == 1 and not c.reason for c in cands)
    assert without_ep and _keep_regions_runnable(cands, job) == without_ep
    kept = [c.degrees for c in cands if not c.reason]
    assert kept and all(d.ep > 1 for d in kept)
    assert all(c.reason == "the job's manual_modules run torchtitan_ep, which needs ep > 1"
               for c in cands if c.degrees.ep == 1)
    for d in kept:
        regions = resolve_all(model, *planner_mesh(d.dp_replicate, d.dp_shard, d.tp, d.ep))
        assert {r.style for r in regions.values()} == {"torchtitan_ep"}
