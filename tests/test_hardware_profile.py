"""Hardware profiles: measured on real ranks, round-tripped, refused clearly when unusable, and
named by the plans they price; and the picture of a plan."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from titan_autopar import Plan, plan_model
from titan_autopar.cli import main
from titan_autopar.cost.hardware import PRESETS, get_hardware
from titan_autopar.cost.profile import (ProfileError, check_machine, hardware_from_profile,
                                        machine_description, write_profile)

REPO = Path(__file__).resolve().parents[1]
QUIET = dict(progress=lambda s: None)


@pytest.fixture(scope="module")
def measured(tmp_path_factory) -> Path:
    """`titan-autopar calibrate` on two real gloo ranks (torchrun)."""
    out = tmp_path_factory.mktemp("profile") / "two_ranks.json"
    run = subprocess.run([sys.executable, "-m", "titan_autopar.cli", "calibrate", "--nproc", "2",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "wrote" in run.stdout and "GFLOP/s" in run.stdout
    return out


def test_calibration_measures_this_machine(measured):
    doc = json.loads(measured.read_text())
    assert doc["format"] == "titan_autopar.hardware_profile" and doc["version"] == 1
    on = doc["measured_on"]
    assert on["world_size"] == 2 and on["backend"] == "gloo" and on["threads"] == 1
    hw = hardware_from_profile(measured)
    # a CPU rank: well under a GPU's figures, and every figure measured (none left at 0)
    assert 1e8 < hw.peak_fp32_flops < 1e13 and 1e8 < hw.hbm_bandwidth < 1e12
    assert 0 < hw.launch_overhead < 1e-3 and hw.optimizer_time_per_element > 0
    assert hw.attention_flops > 0 and hw.compute_efficiency == 1.0
    kinds = {(k, n) for k, n, _, _ in hw.collective_fits}
    assert kinds == {(k, 2) for k in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")}
    for kind, n, lat, spb in hw.collective_fits:
        points = doc["measurements"]["collectives"][f"{kind}/{n}"]
        assert len(points) == 4 and lat >= 0 and spb > 0
    assert hw.profile == f"{measured.name}#{on['fingerprint']}"
    # the optimizer on DTensors, few large tensors then many small: both terms solved from them
    opt = doc["measurements"]["optimizer"]
    assert [p["tensors"] for p in opt] == [8, 64] and hw.optimizer_time_per_tensor > 0
    # FSDP2's collectives inside a small training step, counted and sized as they were called
    step = doc["measurements"]["collectives_in_step"]
    assert step["collectives"] == 18  # 6 blocks: a gather, a regather (backward), a reduction each
    assert step["fsdp_step_s"] > step["fsdp_one_rank_step_s"] > step["compute_alone_s"] > 0
    assert step["clean_collectives_s"] > 0 and step["groups"] == 6
    assert hw.collective_step_overhead == pytest.approx(step["per_call_s"], rel=0.06)
    # FSDP2's own runtime (hooks, copies in and out), on a mesh of one rank: more than nothing
    assert hw.fsdp_group_overhead == pytest.approx(step["per_group_s"], rel=0.06)
    assert hw.fsdp_group_overhead > 0
    # DTensor's runtime under tensor parallelism on the same mesh of one: per linear, measured
    assert step["tp_linears"] == 24 and step["tp_one_rank_step_s"] > step["compute_alone_s"]
    assert hw.tp_linear_overhead == pytest.approx(step["per_tp_linear_s"], rel=0.06)
    assert hw.tp_linear_overhead > 0
    # the overlap one all-reduce beside one matmul showed, at most what the step hid
    assert 0 <= step["hidden_share"] <= 1 and hw.overlap_efficiency <= step["hidden_share"] + 0.01
    # one transformer layer timed against the sum of its priced ops
    layer = doc["measurements"]["layer"]
    assert layer["nodes"] > 100 and layer["measured_s"] > 0 and layer["priced_s"] > 0
    assert hw.compute_scale == pytest.approx(layer["measured_s"] / layer["priced_s"], rel=0.06)


def test_one_rank_measures_no_collective_and_keeps_the_default_overlap(tmp_path):
    """One rank has no collective to hide behind compute: its profile keeps the default overlap
    rather than a figure timed on a group of one."""
    out = tmp_path / "one.json"
    run = subprocess.run([sys.executable, "-m", "titan_autopar.cli", "calibrate", "--nproc", "1",
                          "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    doc = json.loads(out.read_text())
    hw = hardware_from_profile(out)
    assert hw.collective_fits == () and doc["measurements"]["collectives"] == {}
    step = doc["measurements"]["collectives_in_step"]
    assert hw.collective_step_overhead == 0 and "per_call_s" not in step and "groups" in step
    assert "overlap" not in doc["measurements"] and hw.overlap_efficiency == 0.9
    assert "overlap of a collective" not in run.stdout


def test_the_committed_gpu_profile_loads_for_planning():
    """The H200 profile measured by benchmarks/gpu/calibrate_and_check.py prices plans here."""
    hw = get_hardware(str(REPO / "benchmarks/profiles/h200_1gpu.json"))
    assert hw.name == "cuda-nccl-1" and hw.peak_bf16_flops == 7.9e14
    assert hw.peak_fp32_flops == 5.1e13 and hw.attention_flops == 5.9e14
    # one GPU: no collective measured, FSDP2's runtime and the layer's scale are
    assert hw.collective_step_overhead == 0 and hw.fsdp_group_overhead == 5.1e-4
    assert hw.compute_scale == 1.0 and hw.attention_floor == 2.6e-4


def test_a_profile_round_trips(tmp_path):
    hw = replace(PRESETS["cpu"], name="mine", collective_fits=(("all_gather", 4, 1e-3, 2e-9),
                                                                ("all_reduce", 2, 2e-3, 1e-9)))
    on = machine_description("cpu", "gloo", 4, 4, 1)
    p = write_profile(tmp_path / "p.json", "mine", on, hw, {"note": "by hand"})
    back = hardware_from_profile(p)
    assert replace(back, profile="") == replace(hw, collective_fits=tuple(sorted(hw.collective_fits)))
    assert get_hardware(str(p)) == back  # a path works wherever a preset name does
    assert not list(tmp_path.glob(".*.tmp"))  # written to a temporary name, then renamed


def _profile(tmp_path, edit) -> Path:
    on = machine_description("cpu", "gloo", 4, 4, 1)
    p = write_profile(tmp_path / "p.json", "mine", on, PRESETS["cpu"], {})
    doc = json.loads(p.read_text())
    edit(doc)
    p.write_text(json.dumps(doc) if isinstance(doc, dict) else doc)
    return p


@pytest.mark.parametrize("edit, says", [
    (lambda d: d.update(version=0), "version is 0; this titan_autopar reads version 1 (the profile is stale)"),
    (lambda d: d.update(format="x"), "not a hardware profile"),
    (lambda d: d["hardware"].pop("peak_fp32_flops"), "hardware.peak_fp32_flops is missing"),
    (lambda d: d["hardware"].update(hbm_bandwidth=-1), "hardware.hbm_bandwidth must be a number > 0"),
    (lambda d: d["hardware"].update(hbm_bandwidth="fast"), "hardware.hbm_bandwidth must be a number"),
    (lambda d: d["hardware"].update(warp_speed=9), "hardware.warp_speed is not a figure"),
    (lambda d: d["hardware"].update(collective_fits=[["all_gather", 1, 0, 0]]),
     "hardware.collective_fits[0]"),
    (lambda d: d.pop("measured_on"), "measured_on is missing"),
])
def test_a_malformed_or_stale_profile_says_which_field(tmp_path, edit, says):
    p = _profile(tmp_path, edit)
    with pytest.raises(ProfileError, match="titan-autopar calibrate") as e:
        hardware_from_profile(p)
    assert says in str(e.value) and str(p) in str(e.value)


def test_not_json_and_missing_files_are_clear(tmp_path):
    p = tmp_path / "p.json"
    p.write_text("{not json")
    with pytest.raises(ProfileError, match="is not JSON"):
        get_hardware(str(p))
    with pytest.raises(ProfileError, match="no such file: give a preset name"):
        get_hardware(str(tmp_path / "none.json"))


def test_a_profile_of_another_machine_is_refused_saying_what_differs(tmp_path):
    p = _profile(tmp_path, lambda d: None)
    with pytest.raises(ProfileError, match="world_size: profile 4, this job 2"):
        check_machine(p, machine_description("cpu", "gloo", 2, 2, 1))
    check_machine(p, machine_description("cpu", "gloo", 4, 4, 1))  # its own machine: accepted


def test_a_plan_records_its_profile_and_is_priced_by_it(tmp_path, mesh_of, debug_model):
    model = debug_model("llama3")
    mesh = mesh_of(("dp_shard",), (4,))
    tokens = torch.zeros(4, 128, dtype=torch.long)
    # half a second per collective and 10 MB/s: bytes decide between plans whose latencies tie
    slow = replace(PRESETS["cpu"], collective_step_overhead=0.0, collective_fits=tuple(
        (k, 4, 0.5, 1e-7) for k in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")))
    on = machine_description("cpu", "gloo", 4, 4, 1)
    p = write_profile(tmp_path / "slow_links.json", "slow-links", on, slow, {})
    plan = plan_model(model, mesh, (tokens,), hardware=str(p), **QUIET)
    hw = plan.data["hardware"]
    assert hw["name"] == "slow-links" and hw["profile"] == f"slow_links.json#{on['fingerprint']}"
    plan.save(tmp_path / "plan.json")
    assert Plan.load(tmp_path / "plan.json").data["hardware"]["profile"] == hw["profile"]
    # half a second per collective: the plan moves only parameters and gradients (FSDP), whose
    # collectives are merged per block -- a block of 9 weights pays 1/9 of a latency each
    assert plan.data["collectives"]
    assert all(c["kind"] == "parameter" for c in plan.data["collectives"])
    layer0 = [c for c in plan.data["collectives"] if c["block"] == "layers.0"]
    assert len(layer0) >= 9 and all(
        c["seconds_each"] == round(0.5 / 9 + c["bytes"] * 1e-7, 9) for c in layer0)


def test_show_draws_a_plan(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "llama3", "--flavor", "debugmodel", "--mesh",
                 "dp_shard=2,tp=2", "--seq-len", "128", "--local-batch-size", "1",
                 "--out", str(plan)]) == 0
    png = tmp_path / "pic" / "plan.png"
    assert main(["show", str(plan), "--out", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000
    assert main(["show", str(plan), "--out", str(tmp_path / "plan.txt")]) == 2
    assert "give a .png file name" in capsys.readouterr().err


def test_plan_ahead_of_a_calibrating_job(tmp_path, monkeypatch, capsys):
    """`plan --config` of a job that says hardware = "calibrate": the profile the job's ranks
    measured on this machine (from the cache), or an error saying how to get one."""
    from titan_autopar.cost.profile import cached_profile_path

    monkeypatch.setenv("TITAN_AUTOPAR_CACHE", str(tmp_path / "cache"))
    cfg = str(REPO / "train_configs/llama3_debug_cpu_auto4.toml")
    out = tmp_path / "plan.json"
    assert main(["plan", "--config", cfg, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert 'hardware = "calibrate" measures the job\'s ranks when it runs' in err
    assert "titan-autopar calibrate --nproc 4" in err and not out.exists()
    on = machine_description("cpu", "gloo", 4, 4, 1)
    write_profile(cached_profile_path(on["fingerprint"]), "cached-here", on, PRESETS["cpu"], {})
    assert main(["plan", "--config", cfg, "--out", str(out)]) == 0
    assert json.loads(out.read_text())["hardware"]["name"] == "cached-here"
