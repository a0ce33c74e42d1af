"""The GPU-scale configs in train_configs/: each planned config has an expert-recipe twin that
differs only in `auto`, TorchTitan's own config manager reads both, the degrees fit the GPU
count in the name, and `titan-autopar plan --config` plans one on a simulated cluster."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from titan_autopar.cli import main
from titan_autopar.titan.degree_check import degree_problem
from titan_autopar.titan.job_file import planning_job

REPO = Path(__file__).resolve().parents[1]
AUTO = sorted((REPO / "train_configs").glob("*gpu_auto.toml"))


def _load(path: Path) -> dict:
    with path.open("rb") as f:
        return tomllib.load(f)


def test_the_real_configs_are_there():
    names = {p.name.removesuffix("_auto.toml") for p in AUTO}
    assert {"llama3_8b_8gpu", "llama3_8b_64gpu", "llama3_70b_128gpu", "llama3_70b_256gpu",
            "llama3_405b_512gpu", "llama4_17bx16e_64gpu", "deepseek_v3_16b_64gpu",
            "deepseek_v3_671b_512gpu"} <= names


@pytest.mark.parametrize("auto", AUTO, ids=lambda p: p.stem)
def test_twin_differs_only_in_auto_and_degrees_fit(auto):
    expert = auto.with_name(auto.name.replace("_auto.toml", "_expert.toml"))
    a, e = _load(auto), _load(expert)
    assert a["parallelism"].pop("auto") is True and e["parallelism"].pop("auto") is False
    for cfg in (a, e):
        del cfg["job"]["dump_folder"], cfg["job"]["description"]
    assert a == e
    gpus = int(re.search(r"_(\d+)gpu_", auto.name).group(1))
    p = a["parallelism"]
    assert degree_problem(gpus, p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"],
                          p["context_parallel_degree"], p["tensor_parallel_degree"],
                          p["pipeline_parallel_degree"]) is None
    assert planning_job(auto).world_size == gpus


@pytest.mark.parametrize("auto", AUTO, ids=lambda p: p.stem)
def test_torchtitan_reads_the_config(auto):
    from torchtitan.config import ConfigManager
    from torchtitan.protocols.train_spec import get_train_spec

    cfg = ConfigManager().parse_args(["--job.config_file", str(auto)])
    assert cfg.parallelism.auto is True and cfg.auto_parallel.hardware == "h100"
    assert cfg.model.flavor in get_train_spec(cfg.model.name).model_args


def test_plan_a_real_config_on_a_simulated_cluster(tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["plan", "--config", str(REPO / "train_configs/llama3_8b_8gpu_auto.toml"),
               "--out", str(out)])
    assert rc == 0
    plan = json.loads(out.read_text())
    assert plan["mesh"]["names"] == ["dp_shard"] and plan["mesh"]["shape"] == [8]
    assert plan["fingerprint"]["inputs"] == [[[16, 8192], "torch.int64"]]  # 2 per rank x 8
    # the plan is no slower than the expert recipe (FSDP) priced by the same model
    assert plan["predicted"]["step_time_s"] <= plan["recipes"]["fsdp"]["step_time_s"] * (1 + 1e-9)
    assert plan["predicted"]["peak_memory_gib"] <= 80


def test_a_config_with_an_open_shard_degree_says_what_to_write(tmp_path):
    cfg = (REPO / "train_configs/llama3_8b_8gpu_auto.toml").read_text()
    bad = tmp_path / "open.toml"
    bad.write_text(cfg.replace("data_parallel_shard_degree = 8", "data_parallel_shard_degree = -1"))
    with pytest.raises(ValueError, match="write the degree out"):
        planning_job(bad)
