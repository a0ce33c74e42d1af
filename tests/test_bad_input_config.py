"""Bad numbers, configs and flags, as a new user meets them: each ends in one line that names
the flag, `[section] key`, field or file and what to write instead, before any tracing,
solving, measuring or training. A bad job config is refused alike by `titan-autopar plan
--config` and by the job itself (what each rank runs first, `job_parse.parse_job`, and the
switch TorchTitan's trainer calls); CLI cases run `titan-autopar` in this process (exit code 2).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from test_bad_input import PLAN_ARGS, cli
from titan_autopar import plan_model
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.cost.hardware import PRESETS, Hardware, check_figures, get_hardware
from titan_autopar.cost.profile import ProfileError, machine_description, write_profile
from titan_autopar.titan.config_check import ConfigError
from titan_autopar.titan.job_parse import parse_job

REPO = Path(__file__).resolve().parents[1]
AUTO4 = REPO / "train_configs/llama3_debug_cpu_auto4.toml"
FSDP4 = REPO / "train_configs/llama3_debug_cpu_fsdp4.toml"
MODULE_LINE = 'custom_config_module = "titan_autopar.titan.job_config"'


def one_line(text: str) -> bool:
    return len(text.strip().splitlines()) == 1


def job_copy(tmp_path: Path, edit, source: Path = AUTO4, name: str = "job.toml") -> Path:
    """An edited copy of a config in train_configs/; the edit must change it."""
    text = source.read_text()
    new = edit(text)
    assert new != text, "the edit did not apply"
    out = tmp_path / name
    out.write_text(new)
    return out


def sub(old: str, new: str):
    return lambda t: t.replace(old, new)


def in_auto_parallel(line: str):
    return sub("[auto_parallel]\n", f"[auto_parallel]\n{line}\n")


# ---------------------------------------------------------------- plan flags
@pytest.mark.parametrize("args, says", [
    (["--seq-len", "99999999999999999999"], "argument --seq-len: must be at most 16777216"),
    (["--local-batch-size", "9223372036854775807"],
     "argument --local-batch-size: must be at most 65536"),
    (["--memory-budget-gib", "1e300"], "argument --memory-budget-gib: must be at most 1048576"),
    (["--mesh", "dp_shard=²"], "--mesh: size of 'dp_shard' must be a positive integer (a whole "
     "number such as 8, in the digits 0-9), got '²'"),
    (["--mesh", "dp_shard=2.5"], "size of 'dp_shard' must be a positive integer"),
    (["--top", "3"], "--top counts the degrees the search plans in full, so it needs --search"),
    (["--hardware", "calibrate"], "--hardware calibrate measures the ranks of a job, so it needs "
     "--config JOB.toml"),
])
def test_plan_flags(args, says, tmp_path, capsys):
    out = tmp_path / "p.json"
    base = list(PLAN_ARGS)
    for flag, value in zip(args[::2], args[1::2]):
        if flag in base:
            base[base.index(flag) + 1] = value
        else:
            base += [flag, value]
    code, text = cli(base + ["--out", out], capsys)
    assert code == 2 and says in text and one_line(text), text
    assert not out.exists()


def test_the_api_refuses_an_absurd_budget():
    with pytest.raises(ValueError, match="memory_budget_gib must be at most 1048576, got 1e"):
        plan_model(torch.nn.Linear(4, 4), fake_mesh(("dp_shard",), (2,)), (torch.zeros(2, 4),),
                   memory_budget_gib=1e300, progress=lambda s: None)


# ---------------------------------------------------------------- one config, both roads
VALUE_ROWS = [
    (sub("local_batch_size = 2", "local_batch_size = 9223372036854775807"),
     "[training] local_batch_size = 9223372036854775807: it must be at least 1 and at most 65536"),
    (sub("seq_len = 256", "seq_len = -1"), "[training] seq_len = -1: it must be at least 1"),
    (sub("seq_len = 256", "seq_len = 99999999999"), "write seq_len = 16777216 or less"),
    (sub("tensor_parallel_degree = 1", "tensor_parallel_degree = 0"),
     "[parallelism] tensor_parallel_degree = 0: a degree is a whole number from 1"),
    (sub("tensor_parallel_degree = 1", "tensor_parallel_degree = -2"),
     "[parallelism] tensor_parallel_degree = -2: a degree is a whole number from 1"),
    (sub("data_parallel_replicate_degree = 1", "data_parallel_replicate_degree = 0"),
     "[parallelism] data_parallel_replicate_degree = 0: a degree is"),
    (sub("expert_parallel_degree = 1", "expert_parallel_degree = 0"),
     "[parallelism] expert_parallel_degree = 0: a degree is a whole number from 1"),
    (sub("data_parallel_shard_degree = 4", "data_parallel_shard_degree = 0"),
     "or -1 for the ranks the other degrees leave; write data_parallel_shard_degree = -1"),
    (sub('hardware = "calibrate"', 'hardware = ""'),
     "[auto_parallel] hardware = '': unknown hardware: name a preset (a100, b200, cpu, h100, h200)"),
    (sub('hardware = "calibrate"', 'hardware = "tpu9"'), "[auto_parallel] hardware = 'tpu9'"),
    (in_auto_parallel('solver = "gurobi"'),
     "[auto_parallel] solver = 'gurobi': it must be one of 'highs', 'cbc', 'joint'"),
    (in_auto_parallel("time_limit_s = -1"),
     "[auto_parallel] time_limit_s = -1: it must be at least 0"),
    (in_auto_parallel("memory_budget_gib = 1e300"),
     "[auto_parallel] memory_budget_gib = 1e+300: it must be at least 0 and at most 1048576"),
    (in_auto_parallel("memory_budget_gib = nan"), "[auto_parallel] memory_budget_gib = nan"),
    (in_auto_parallel('cp_attention = "rings"'), "[auto_parallel] cp_attention = 'rings'"),
]
KEY_ROWS = [
    (in_auto_parallel("memory_budget_gb = 3"),
     "[auto_parallel] memory_budget_gb is not a key of [auto_parallel]: did you mean "
     "memory_budget_gib?"),
    (sub("[training]", "[trainin]"),
     "[trainin] is not a section of a TorchTitan job: did you mean [training]?"),
    (sub("titan_autopar.titan.job_config", "titan_autopar.titan.job_confg"),
     "[job] custom_config_module = 'titan_autopar.titan.job_confg' is not a module Python can "
     f"import; for the auto switch write {MODULE_LINE}"),
    (sub(MODULE_LINE, ""), "[parallelism] auto is read through titan_autopar's config module, "
     f"which [job] does not name: add the line {MODULE_LINE} under [job]"),
]
ROWS = VALUE_ROWS + KEY_ROWS


@pytest.mark.parametrize("edit, says", ROWS)
def test_plan_config_refuses(edit, says, tmp_path, capsys):
    cfg = job_copy(tmp_path, edit)
    out = tmp_path / "p.json"
    code, text = cli(["plan", "--config", cfg, "--out", out], capsys)
    assert code == 2 and says in text and str(cfg) in text and one_line(text), text
    assert not out.exists()


@pytest.mark.parametrize("edit, says", ROWS)
def test_the_job_refuses_alike(edit, says, tmp_path):
    """What each rank of a CPU job runs before the trainer: the same words as plan --config."""
    cfg = job_copy(tmp_path, edit)
    with pytest.raises(ConfigError) as e:
        parse_job(["--job.config_file", str(cfg)])
    assert says in str(e.value) and str(cfg) in str(e.value) and one_line(str(e.value))


@pytest.mark.parametrize("edit, says", VALUE_ROWS)
def test_the_switch_refuses_alike(edit, says, tmp_path):
    """A job TorchTitan's own entry point parsed (no titan_autopar code before it): the switch
    refuses it before planning, in the same words."""
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec

    cfg = job_copy(tmp_path, edit)
    job = ConfigManager().parse_args(["--job.config_file", str(cfg)])
    with pytest.raises(ConfigError) as e:
        get_train_spec("llama3").parallelize_fn(None, None, job)
    assert says in str(e.value) and str(cfg) in str(e.value)


@pytest.mark.parametrize("degrees, says", [
    (dict(tp=0), "[parallelism] tensor_parallel_degree = 0: a degree is a whole number from 1"),
    (dict(ep=0), "[parallelism] expert_parallel_degree = 0: a degree is a whole number from 1"),
    (dict(dp_replicate=-3), "[parallelism] data_parallel_replicate_degree = -3"),
])
def test_the_trainers_degree_check_names_a_degree_of_0(degrees, says):
    """TorchTitan's degree validation, as the config module replaces it (every job's first
    check): a degree below 1 is named, not divided by or asserted on."""
    from titan_autopar.titan.degree_check import degree_problem

    given = dict(world=4, dp_replicate=1, dp_shard=4, cp=1, tp=1, pp=1, ep=1) | degrees
    assert says in degree_problem(**given)


def test_the_launcher_refuses_before_starting_ranks(tmp_path):
    from titan_autopar.titan.launch import launch

    cfg = job_copy(tmp_path, sub(MODULE_LINE, ""))
    with pytest.raises(ConfigError, match="add the line custom_config_module"):
        launch(cfg, 1, stream=False, timeout=5)


# ---------------------------------------------------------------- flags override the config
@pytest.fixture(scope="module")
def overridden(tmp_path_factory):
    """One plan of a job whose every setting a flag overrides (the job says hardware =
    "calibrate", solver "cbc", no checkpointing, fp32, 4 ranks, seq 256 x 2)."""
    tmp = tmp_path_factory.mktemp("overridden")
    cfg = job_copy(tmp, in_auto_parallel('solver = "cbc"\ncp_attention = "cheapest"'))
    out = tmp / "plan.json"
    code = _main(["plan", "--config", cfg, "--hardware", "cpu", "--solver", "highs",
                  "--activation-checkpointing", "full", "--memory-budget-gib", "3",
                  "--seq-len", "32", "--local-batch-size", "1", "--mesh", "dp_shard=2",
                  "--param-dtype", "bfloat16", "--cp-attention", "ring", "--out", out])
    assert code == 0
    return json.loads(out.read_text())


def _main(args) -> int:
    from titan_autopar.cli import main

    with contextlib.redirect_stdout(None):
        return main([str(a) for a in args])


@pytest.mark.parametrize("field, want", [
    (lambda p: p["hardware"]["name"], "cpu"),
    (lambda p: p["solver"]["name"], "highs"),
    (lambda p: p["activation_checkpointing"], "full"),
    (lambda p: p["memory_budget_gib"], 3.0),
    (lambda p: p["fingerprint"]["inputs"], [[[2, 32], "torch.int64"]]),
    (lambda p: (p["mesh"]["names"], p["mesh"]["shape"]), (["dp_shard"], [2])),
    (lambda p: p["param_dtype"], "bfloat16"),
    (lambda p: p["cp_attention"], "ring"),
], ids=["hardware", "solver", "checkpointing", "budget", "seq_len+batch", "mesh", "dtype", "cp"])
def test_every_flag_given_overrides_the_config(field, want, overridden):
    assert field(overridden) == want


def test_the_search_takes_the_budget_flag(tmp_path, capsys):
    code, text = cli(["plan", "--config", AUTO4, "--search", "--hardware", "cpu",
                      "--memory-budget-gib", "0.01", "--out", tmp_path / "p.json"], capsys)
    assert code == 2 and "no degrees for 4 ranks fit" in text and "(budget 0.01)" in text, text


def test_the_search_refuses_a_mesh_flag(tmp_path, capsys):
    code, text = cli(["plan", "--config", AUTO4, "--search", "--mesh", "dp_shard=4",
                      "--out", tmp_path / "p.json"], capsys)
    assert code == 2 and "--mesh with --search: the search chooses the mesh" in text, text


def test_plan_out_in_a_read_only_folder(capsys):
    with read_only_folder() as ro:
        code, text = cli(PLAN_ARGS + ["--out", ro / "plan.json"], capsys)
    assert code == 2 and f"--out {ro / 'plan.json'}: the folder {ro} cannot be written" in text


# ---------------------------------------------------------------- hardware profiles
@pytest.fixture(scope="module")
def profile_doc(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("profile") / "profile.json"
    write_profile(path, "cpu-here", machine_description("cpu", "gloo", 4, 4, 1), PRESETS["cpu"], {})
    return json.loads(path.read_text())


@pytest.mark.parametrize("field, value, says", [
    ("compute_efficiency", 0, "must be a number > 0 and <= 1, found 0"),
    ("compute_efficiency", 1.5, "must be a number > 0 and <= 1, found 1.5"),
    ("overlap_efficiency", 5, "must be a number >= 0 and <= 1, found 5"),
    ("compute_scale", 0, "must be a number > 0, found 0"),
    ("gpus_per_node", 2.5, "must be a whole number >= 1, found 2.5"),
    ("hbm_bytes", 0, "must be a number > 0, found 0"),
    ("launch_overhead", -1e-6, "must be a number >= 0, found -1e-06"),
    ("peak_fp32_flops", "fast", "must be a number > 0, found 'fast'"),
])
def test_profile_figures_out_of_range(field, value, says, profile_doc, tmp_path, capsys):
    doc = json.loads(json.dumps(profile_doc))
    doc["hardware"][field] = value
    bad = tmp_path / "profile.json"
    bad.write_text(json.dumps(doc))
    code, text = cli(PLAN_ARGS + ["--hardware", bad, "--out", tmp_path / "p.json"], capsys)
    assert code == 2 and f"hardware profile {bad}: hardware.{field} {says}" in text, text
    assert "titan-autopar calibrate --out" in text and one_line(text)


def test_a_hardware_of_ones_own_is_held_to_the_ranges():
    with pytest.raises(ValueError, match="compute_efficiency must be a number > 0 and <= 1"):
        get_hardware(Hardware(**{**PRESETS["h100"].as_dict(), "compute_efficiency": 0}))


def test_the_presets_are_within_the_ranges():
    for hw in PRESETS.values():
        assert check_figures(hw) is hw


# ---------------------------------------------------------------- calibrate
@contextlib.contextmanager
def read_only_folder():
    """A folder this process cannot write into; as root (who writes anywhere) the folder is met
    as an ordinary user meets it, with the effective user id of `nobody`."""
    base = Path(tempfile.mkdtemp(prefix="titan_autopar_ro_"))
    ro = base / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    base.chmod(0o755)
    root = os.geteuid() == 0
    try:
        if root:
            os.seteuid(65534)
        yield ro
    finally:
        if root:
            os.seteuid(0)
        ro.chmod(0o755)
        shutil.rmtree(base)


def test_calibrate_into_a_read_only_folder(capsys):
    importlib.import_module("titan_autopar.titan.launch")  # read before the user id changes

    with read_only_folder() as ro:
        code, text = cli(["calibrate", "--nproc", "1", "--out", ro / "profile.json"], capsys)
        assert not (ro / "profile.json").exists()
    assert code == 2 and f"the folder {ro} cannot be written (Permission denied)" in text, text
    assert "measuring" not in text and one_line(text)


@pytest.mark.parametrize("args, says", [
    (["--device", "cuda", "--nproc", str(torch.cuda.device_count() + 1)],
     f"torch sees {torch.cuda.device_count()} CUDA GPU(s) on this machine"),
    (["--mesh", "2,²", "--nproc", "4"], "--mesh 2,²: each size must be a positive integer"),
    (["--mesh", "2,3", "--nproc", "4"], "whose product is --nproc 4"),
])
def test_calibrate_flags(args, says, tmp_path, capsys):
    out = tmp_path / "profile.json"
    code, text = cli(["calibrate", *args, "--out", out], capsys)
    assert code == 2 and says in text and "measuring" not in text and one_line(text), text
    assert not out.exists()


def test_calibrate_under_a_file(tmp_path, capsys):
    (tmp_path / "notes").write_text("x")
    code, text = cli(["calibrate", "--out", tmp_path / "notes" / "p.json"], capsys)
    assert code == 2 and "is a file, so nothing can be written under it" in text


# ---------------------------------------------------------------- the profile cache
@pytest.fixture
def cache_is_a_file(tmp_path, monkeypatch) -> Path:
    f = tmp_path / "cache"
    f.write_text("not a folder")
    monkeypatch.setenv("TITAN_AUTOPAR_CACHE", str(f))
    return f


def test_plan_with_a_cache_that_is_a_file(cache_is_a_file, tmp_path, capsys):
    code, text = cli(["plan", "--config", AUTO4, "--out", tmp_path / "p.json"], capsys)
    assert code == 2 and f"TITAN_AUTOPAR_CACHE={cache_is_a_file} is a file, not a folder" in text
    assert cache_is_a_file.read_text() == "not a folder"


def test_a_calibrating_job_with_a_cache_that_is_a_file(cache_is_a_file):
    """The job's hardware step refuses before it measures anything."""
    from titan_autopar.titan.job_hardware import resolve_hardware

    job = parse_job(["--job.config_file", str(AUTO4)])
    with pytest.raises(ProfileError, match="is a file, not a folder: hardware = \"calibrate\""):
        resolve_hardware(job)
    assert cache_is_a_file.read_text() == "not a folder"


# ---------------------------------------------------------------- ab
@pytest.mark.parametrize("twin, says", [
    (lambda tmp: REPO / "train_configs/llama4_debug_cpu_fsdp4_ep4.toml",
     "[model] name = 'llama4' where --config has 'llama3'"),
    (lambda tmp: job_copy(tmp, sub('flavor = "debugmodel"', 'flavor = "8B"'), FSDP4, "twin.toml"),
     "[model] flavor = '8B' where --config has 'debugmodel'"),
    (lambda tmp: job_copy(tmp, sub('dtype = "float32"', 'dtype = "bfloat16"'), FSDP4, "twin.toml"),
     "[training] dtype = 'bfloat16' where --config has 'float32'"),
    (lambda tmp: job_copy(tmp, sub("[parallelism]\n", "[parallelism]\nauto = false\n"), FSDP4,
                          "twin.toml"), "add the line custom_config_module"),
])
def test_ab_checks_the_twin_first(twin, says, tmp_path, capsys):
    out = tmp_path / "ab"
    code, text = cli(["ab", "--config", AUTO4, "--twin", twin(tmp_path), "--out", out], capsys)
    assert code == 2 and says in text and one_line(text), text
    assert not out.exists()  # nothing ran, not even the seed checkpoint


def test_ab_config_with_a_misspelt_module(tmp_path, capsys):
    cfg = job_copy(tmp_path, sub("titan_autopar.titan.job_config", "titan_autopar.titan.jobconfig"))
    code, text = cli(["ab", "--config", cfg, "--out", tmp_path / "ab"], capsys)
    assert code == 2 and "is not a module Python can import; for the auto switch write" in text
