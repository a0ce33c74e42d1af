"""Bad input around plans: hand-edited plan files whose fields have the wrong type or range,
plans whose placements disagree with the program they would build, manual-region declarations
their tensors cannot take, and expert parallelism asked for where no region would run it. Each
ends in one line that names the field, region or setting and what to write instead; CLI cases
run `titan-autopar` in this process (exit code 2, one line on stderr, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import tiny_llama
from titan_autopar import plan_model
from titan_autopar.cli import fake_mesh, main

REPO = Path(__file__).resolve().parents[1]

QUIET = dict(progress=lambda s: None)
MESH = (("dp_shard", "tp"), (2, 2))


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


def edited(path: Path, tmp_path: Path, edit) -> Path:
    d = json.loads(path.read_text())
    edit(d)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(d))
    return out


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
