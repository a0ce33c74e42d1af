"""Bad and hostile input, as a new user meets it: every case ends in a short error that names the
flag, field or file and what to do, never a Python traceback, and nothing already written is
lost. CLI cases run `titan-autopar` in this process (exit code 2, the message on stderr); Python
API cases assert the ValueError's words; the disk-full cases run in a subprocess whose file size
limit makes writes fail for real."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from conftest import tiny_llama
from titan_autopar import Plan, apply_plan, plan_model
from titan_autopar.cli import main
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.plan import PlanError

REPO = Path(__file__).resolve().parents[1]
QUIET = dict(progress=lambda s: None)
PLAN_ARGS = ["plan", "--model", "llama3", "--flavor", "debugmodel", "--seq-len", "64",
             "--local-batch-size", "1", "--mesh", "dp_shard=2"]


def cli(args, capsys) -> tuple[int, str]:
    """Run the CLI in this process: (exit code, everything it printed)."""
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text, text
    return code, text


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    """A real plan: one llama layer on a 2x2 mesh (parameters, nodes and collectives on both)."""
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    mesh = fake_mesh(("dp_shard", "tp"), (2, 2))
    plan_model(tiny_llama(dim=128, layers=1, seq=32, n_heads=4), mesh,
               (torch.zeros(2, 32, dtype=torch.long),), **QUIET).save(path)
    return path


def edited(plan_file: Path, tmp_path: Path, edit) -> Path:
    d = json.loads(plan_file.read_text())
    edit(d)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(d))
    return out


# ---------------------------------------------------------------- plan flags
@pytest.mark.parametrize("flag, value, says", [
    ("--memory-budget-gib", "nan", "must be more than 0"),
    ("--memory-budget-gib", "-1", "must be more than 0"),
    ("--memory-budget-gib", "inf", "must be more than 0"),
    ("--memory-budget-gib", "lots", "expected a number"),
    ("--seq-len", "0", "must be more than 0"),
    ("--seq-len", "-5", "must be more than 0"),
    ("--local-batch-size", "0", "must be more than 0"),
    ("--local-batch-size", "-2", "must be more than 0"),
    ("--local-batch-size", "two", "expected a whole number"),
    ("--time-limit-s", "0", "must be more than 0"),
    ("--mesh", "foo=2", "unknown mesh dim name 'foo'"),
    ("--mesh", "pp=2", "pipeline stages are not planned on one mesh"),
    ("--mesh", "dp_shard=0", "must be a positive integer"),
    ("--mesh", "dp_shard", "name=size"),
    ("--mesh", "dp_shard=2,dp_shard=2", "names a dim twice"),
    ("--mesh", "dp_shard=65536,tp=2", "at most 65536"),
    ("--flavor", "nope", "debugmodel"),
    ("--model", "nope", "unknown TorchTitan model 'nope'"),
    ("--hardware", "tpu9", "unknown hardware preset 'tpu9'"),
    ("--solver", "gurobi", "invalid choice"),
])
def test_plan_flags(flag, value, says, tmp_path, capsys):
    out = tmp_path / "p.json"
    args = list(PLAN_ARGS)
    if flag in args:
        i = args.index(flag)
        args[i + 1] = value
    else:
        args += [flag, value]
    code, text = cli(args + ["--out", out], capsys)
    assert code == 2 and says in text, text
    assert not out.exists()


def test_out_is_a_folder(tmp_path, capsys):
    code, text = cli(PLAN_ARGS + ["--out", tmp_path], capsys)
    assert code == 2 and "is a folder" in text


def test_out_under_a_file(tmp_path, capsys):
    (tmp_path / "notes").write_text("x")
    code, text = cli(PLAN_ARGS + ["--out", tmp_path / "notes" / "plan.json"], capsys)
    assert code == 2 and "is a file, so nothing can be written under it" in text


def test_out_that_is_not_a_plan_is_kept(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    code, text = cli(PLAN_ARGS + ["--out", notes], capsys)
    assert code == 2 and "is not a plan: refusing to overwrite it" in text and "--force" in text
    assert notes.read_text() == "my notes\n"


# ---------------------------------------------------------------- plan --config
@pytest.mark.parametrize("edit, says", [
    (lambda t: t + "\n[broken\n", "is not valid TOML"),
    (lambda t: t.replace("local_batch_size = 2", 'local_batch_size = "two"'),
     "[training] local_batch_size = 'two' is not a whole number"),
    (lambda t: t.replace("auto = true", 'auto = "false"'),
     "[parallelism] auto = 'false' is not true or false"),
    (lambda t: t.replace("auto = true", 'auto = "yes"'), "[parallelism] auto = 'yes'"),
    (lambda t: t.replace("seq_len = 256", "seq_len = 0"), "[training] seq_len = 0: it must be at least 1"),
    (lambda t: t.replace('hardware = "calibrate"', "hardware = 100"), "[auto_parallel] hardware = 100"),
])
def test_plan_config_values(edit, says, tmp_path, capsys):
    cfg = tmp_path / "job.toml"
    cfg.write_text(edit((REPO / "train_configs/llama3_debug_cpu_auto4.toml").read_text()))
    code, text = cli(["plan", "--config", cfg, "--out", tmp_path / "p.json"], capsys)
    assert code == 2 and says in text and str(cfg) in text, text


@pytest.mark.parametrize("value, shown", [('"false"', "'false'"), ('"yes"', "'yes'"), ("1", "1")])
def test_the_auto_switch_takes_only_a_boolean(value, shown, tmp_path):
    """The switch TorchTitan calls refuses `auto` of another type before anything is built."""
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec

    from titan_autopar.titan.config_check import ConfigError

    cfg = tmp_path / "job.toml"
    cfg.write_text((REPO / "train_configs/llama3_debug_cpu_auto4.toml").read_text()
                   .replace("auto = true", f"auto = {value}"))
    job = ConfigManager().parse_args(["--job.config_file", str(cfg)])
    with pytest.raises(ConfigError) as e:
        get_train_spec("llama3").parallelize_fn(None, None, job)
    assert f"[parallelism] auto = {shown} is not true or false" in str(e.value)
    assert "is not true or false" in str(e.value) and str(cfg) in str(e.value)


def test_plan_config_missing(tmp_path, capsys):
    code, text = cli(["plan", "--config", tmp_path / "none.toml"], capsys)
    assert code == 2 and "no config at" in text


# ---------------------------------------------------------------- plan files
def _deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize("content, says", [
    (b"", "not JSON"),
    (b"\x89PNG\r\n\x1a\n\x00\x00binary", "not UTF-8 text"),
    (_deep(200_000).encode(), "nested deeper than any plan"),
    (b"{}", "no schema_version"),
    (b"[1, 2]", "no schema_version"),
    (b'{"schema_version": 1, "schema_version": 1}', "appears twice"),
    (b'{"schema_version": NaN}', "not a number a plan can hold"),
])
def test_explain_of_what_is_not_a_plan(content, says, tmp_path, capsys):
    f = tmp_path / "x.json"
    f.write_bytes(content)
    code, text = cli(["explain", f], capsys)
    assert code == 2 and says in text and str(f) in text, text


def test_explain_of_a_folder_and_a_missing_file(tmp_path, capsys):
    code, text = cli(["explain", tmp_path], capsys)
    assert code == 2 and "is a folder" in text
    code, text = cli(["explain", tmp_path / "missing.json"], capsys)
    assert code == 2 and "no such file" in text


@pytest.mark.parametrize("edit, says", [
    (lambda d: d.pop("mesh"), "mesh: missing"),
    (lambda d: d.pop("fingerprint"), "fingerprint: missing"),
    (lambda d: d.update(schema_version="1"),
     "schema_version: expected the whole number 2, found the string '1'"),
    (lambda d: d.update(schema_version=7), "plan schema 7, this version reads schema 2"),
    (lambda d: d["predicted"].update(step_time_s="fast"), "predicted.step_time_s: expected a number"),
    (lambda d: d["parameters"].update({"output.weight": ["X", "R"]}),
     "parameters['output.weight'][0]: unknown placement 'X'"),
    (lambda d: d["parameters"].update({"output.weight": ["R"]}),
     "has 1 placements, the mesh has 2 dims"),
    (lambda d: d["mesh"].update(shape=[2, 0]), "mesh.shape[1]: expected a whole number of at least 1"),
    (lambda d: d["mesh"].update(shape=[2, 4]), "fingerprint.mesh"),
    (lambda d: d["collectives"][0].update(mesh_dim="pp"), "is not a dim of the mesh"),
    (lambda d: d["collectives"][0].update(count=-3), "count: expected a whole number of at least 1"),
    (lambda d: d.update(memory_budget_gib=0), "memory_budget_gib: must be more than 0"),
    (lambda d: d.update(activation_checkpointing="some"), "activation_checkpointing"),
    (lambda d: d.update(param_dtype="int8"), "param_dtype"),
])
def test_hand_edited_plan_files(edit, says, plan_file, tmp_path, capsys):
    bad = edited(plan_file, tmp_path, edit)
    code, text = cli(["explain", bad], capsys)
    assert code == 2 and says in text and str(bad) in text, text


def test_diff_of_plans_of_different_models(plan_file, tmp_path, capsys):
    other = tmp_path / "other.json"
    mesh = fake_mesh(("dp_shard", "tp"), (2, 2))
    plan_model(tiny_llama(dim=128, layers=2, seq=32, n_heads=4), mesh,
               (torch.zeros(2, 32, dtype=torch.long),), **QUIET).save(other)
    code, text = cli(["diff", plan_file, other], capsys)
    assert code == 0 and text.startswith("these are plans of different models"), text


def test_control_characters_in_names_are_escaped(plan_file, tmp_path, capsys):
    def edit(d):
        name = "layers.0.attention.wq.weight"
        d["parameters"]["\x1b[2J\x1b[H" + name] = d["parameters"].pop(name)
        d["mesh"]["names"][0] = "dp\x07shard"
        d["fingerprint"]["mesh"]["names"][0] = "dp\x07shard"
        for c in d["collectives"]:
            if c["mesh_dim"] == "dp_shard":
                c["mesh_dim"] = "dp\x07shard"
    code, text = cli(["explain", edited(plan_file, tmp_path, edit)], capsys)
    assert code == 0
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b[2J\\x1b[H" in text and "dp\\x07shard" in text


# ---------------------------------------------------------------- the Python API
@pytest.fixture(scope="module")
def small():
    return tiny_llama(dim=128, layers=1, seq=32, n_heads=4), fake_mesh(("dp_shard",), (2,))


@pytest.mark.parametrize("kwargs, says", [
    (dict(memory_budget_gib="80"), "memory_budget_gib must be a number, got '80'"),
    (dict(memory_budget_gib=float("nan")), "finite number above 0"),
    (dict(time_limit_s=-1), "time_limit_s must be a finite number above 0"),
    (dict(input_placements={"tokens": (Shard(0),)}), "input_placements must be a list"),
    (dict(input_placements=[Shard(0)]), "input_placements[0] must be a tuple of placements"),
    (dict(input_placements=[("S(0)",)]), "not a placement"),
    (dict(output_placements=[(Shard(0), Replicate())]), "output_placements[0] has 2 placements"),
    (dict(activation_checkpointing="most"), "activation checkpointing mode 'most'"),
    (dict(param_dtype="bfloat16"), "param_dtype must be a floating-point torch.dtype"),
])
def test_plan_model_arguments(kwargs, says, small):
    model, mesh = small
    with pytest.raises(ValueError) as e:
        plan_model(model, mesh, (torch.zeros(2, 32, dtype=torch.long),), **QUIET, **kwargs)
    assert says in str(e.value)


@pytest.mark.parametrize("tokens, says", [
    (torch.zeros(2, 32), "integer token ids"),
    (torch.zeros(64, dtype=torch.long), "(batch, seq)"),
    (torch.zeros(2, 64, dtype=torch.long), "longer than the model's max_seq_len 32"),
    (torch.zeros(3, 32, dtype=torch.long), "batch 3, which the 2 ranks of dp_shard=2 do not divide"),
    ([1, 2], "sample_inputs[0] is a list, not a tensor"),
])
def test_plan_model_inputs(tokens, says, small):
    model, mesh = small
    with pytest.raises(ValueError) as e:
        plan_model(model, mesh, (tokens,), **QUIET)
    assert says in str(e.value)


def test_plan_model_mesh_names():
    with pytest.raises(ValueError, match="unknown mesh dim name 'foo'"):
        plan_model(tiny_llama(dim=128, layers=1, seq=32, n_heads=4), fake_mesh(("foo",), (2,)),
                   (torch.zeros(2, 32, dtype=torch.long),), **QUIET)


def test_a_failing_forward_says_where(small):
    model, mesh = small

    class Broken(torch.nn.Module):
        def forward(self, x):
            assert x.shape[1] == 7
            return x

    with pytest.raises(ValueError) as e:
        plan_model(Broken(), mesh, (torch.zeros(2, 32),), **QUIET)
    msg = str(e.value)
    assert "the model's forward failed on the sample inputs [(2, 32) float32]" in msg
    assert "AssertionError" in msg and "test_bad_input.py" in msg and "assert x.shape[1] == 7" in msg


@pytest.mark.parametrize("edit, says", [
    (lambda d: next(e for e in d["nodes"].values() if e["op"] == "aten.mm.default")["out"]
     .__setitem__(0, ["S(7)", "R"]), "].out[0] = ['S(7)', 'R'] shards dim 7 of a tensor with 2 dims"),
    (lambda d: d["parameters"].update({"norm.weight": ["R", "R"]}),
     "parameters['norm.weight']: says ['R', 'R'], but its graph node"),
])
def test_apply_refuses_a_plan_edited_out_of_shape(edit, says, plan_file, tmp_path):
    bad = Plan.load(edited(plan_file, tmp_path, edit))
    model = tiny_llama(dim=128, layers=1, seq=32, n_heads=4)
    with pytest.raises(PlanError) as e:
        apply_plan(model, bad, fake_mesh(("dp_shard", "tp"), (2, 2)), **QUIET)
    assert says in str(e.value) and "edited.json" in str(e.value)


# ---------------------------------------------------------------- ab
def test_ab_arguments_are_checked_before_anything_runs(tmp_path, capsys):
    cfg = "train_configs/llama3_debug_cpu_auto4.toml"
    code, text = cli(["ab", "--config", cfg, "--steps", "0"], capsys)
    assert code == 2 and "--steps" in text and "must be more than 0" in text
    code, text = cli(["ab", "--config", cfg, "--nproc", "0"], capsys)
    assert code == 2 and "--nproc" in text
    code, text = cli(["ab", "--config", cfg, "--rounds", "0"], capsys)
    assert code == 2 and "--rounds" in text and "must be more than 0" in text
    code, text = cli(["ab", "--config", "train_configs/llama3_debug_cpu_fsdp4.toml"], capsys)
    assert code == 2 and "no [job] custom_config_module" in text
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "thesis.tex").write_text("keep me")
    code, text = cli(["ab", "--config", REPO / cfg, "--out", mine], capsys)
    assert code == 2 and "refusing to clear it" in text and (mine / "thesis.tex").exists()


# ---------------------------------------------------------------- a full disk
def _limited(limit_bytes: int):
    def preexec():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))
    return preexec


def test_a_full_disk_while_solving_leaves_no_solver_files(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = tmp_path / "plan.json"
    # CBC runs in a subprocess that writes its program to files (HiGHS, the default, writes none)
    run = subprocess.run([sys.executable, "-m", "titan_autopar.cli", *PLAN_ARGS, "--solver", "cbc",
                          "--out", str(out)],
                         env={**os.environ, "TMPDIR": str(tmp)}, capture_output=True, text=True,
                         preexec_fn=_limited(4096), cwd=REPO, timeout=600)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Traceback" not in run.stderr and "if the disk is full" in run.stderr, run.stderr[-2000:]
    assert list(tmp.iterdir()) == [] and not out.exists()


def test_a_full_disk_while_saving_keeps_the_old_plan(plan_file, tmp_path):
    target = tmp_path / "plan.json"
    target.write_bytes(plan_file.read_bytes())
    bigger = json.loads(plan_file.read_text())
    bigger["fallbacks"] = {"x" * 1000 + str(i): 1 for i in range(100)}  # longer than the file
    src = tmp_path / "bigger.json"
    src.write_text(json.dumps(bigger))
    code = ("from titan_autopar import Plan; import sys\n"
            "try:\n"
            f"    Plan.load({str(src)!r}).save({str(target)!r})\n"
            "except ValueError as e:\n"
            "    print(e); sys.exit(2)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         preexec_fn=_limited(target.stat().st_size + 1000), timeout=300)
    assert run.returncode == 2 and "nothing was changed there" in run.stdout, run.stdout + run.stderr
    assert target.read_bytes() == plan_file.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bigger.json", "plan.json"]

