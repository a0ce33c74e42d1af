"""The degree search (`plan --config X --search`): its bounds set aside the right factorizations,
and on a small job it picks the degrees a brute-force loop over every factorization, each
planned in full, picks."""

from __future__ import annotations

import json
import tomllib

import torch

from titan_autopar import plan_model
from titan_autopar.cli import main
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.solve.search import Degrees, ModelShape, candidate_degrees
from titan_autopar.titan.job_file import planner_mesh
from titan_autopar.titan.loop_collectives import trainer_loop_collectives
from titan_autopar.titan.models import build_model, global_batch
from titan_autopar.titan.search_outputs import check_search_outputs


def test_bounds_set_aside_with_reasons():
    shape = ModelShape(params=8 * 2**30, n_heads=4, n_kv_heads=2)  # 128 GiB of state
    cands = {c.degrees: c for c in candidate_degrees(8, 4, shape, budget_gib=40.0)}
    assert len(cands) == 10  # (tp, dp_replicate) over the divisors of 8
    assert "does not divide the 4 heads / 2 KV heads" in cands[Degrees(1, 1, 8)].reason
    # 128 GiB over dp_shard x tp = 2 ranks is 64 GiB per rank: no plan can fit 40
    assert "64 GiB per rank over dp_shard x tp = 2" in cands[Degrees(4, 1, 2)].reason
    assert "spans nodes of 4 GPUs" not in "".join(c.reason for c in cands.values())
    kept = sorted(d.label for d, c in cands.items() if not c.reason)
    assert kept == ["dp_replicate=1 dp_shard=4 tp=2", "dp_replicate=1 dp_shard=8 tp=1",
                    "dp_replicate=2 dp_shard=2 tp=2", "dp_replicate=2 dp_shard=4 tp=1"], kept


def test_experts_and_nodes_bound_ep_and_tp():
    shape = ModelShape(params=2**20, n_heads=8, n_kv_heads=8, experts=4)
    cands = candidate_degrees(16, 4, shape, budget_gib=80.0)
    kept = [c.degrees for c in cands if not c.reason]
    assert kept and all(d.ep in (1, 2, 4) and d.tp <= 4 for d in kept)
    eight = next(c for c in cands if c.degrees == Degrees(1, 16, 1, 8))
    assert eight.reason == "ep=8 does not divide the 4 experts"
    tp8 = next(c for c in cands if c.degrees == Degrees(1, 2, 8, 1))
    assert tp8.reason == "tp or ep spans nodes of 4 GPUs"


def test_cp_round_bounds_the_sequence_and_counts_cp_in_the_state_floor():
    """The cp > 1 round (taken when nothing with cp = 1 fits): cp must cut the sequence into
    2 x cp equal halves, and the parameter state spreads over dp_shard x cp x tp."""
    shape = ModelShape(params=8 * 2**30, n_heads=4, n_kv_heads=4)  # 128 GiB of state
    cands = {c.degrees: c for c in candidate_degrees(8, 8, shape, budget_gib=40.0, cp=True,
                                                       seq_len=12)}
    assert all(d.cp > 1 for d in cands)
    assert cands[Degrees(1, 4, 1, 1, 2)].reason == ""  # 12 tokens in 4 halves of 3
    assert cands[Degrees(1, 2, 1, 1, 4)].reason == "cp=4 does not cut the 12 tokens into 8 equal halves"
    assert "64 GiB per rank over dp_shard x cp x tp = 2" in cands[Degrees(4, 1, 1, 1, 2)].reason
    assert Degrees(1, 4, 1, 1, 2).toml().count("context_parallel_degree = 2") == 1


CONFIG = """
[job]
custom_config_module = "titan_autopar.titan.job_config"
[model]
name = "llama3"
flavor = "debugmodel"
[training]
seq_len = 64
local_batch_size = 2
mixed_precision_param = "float32"
[parallelism]
auto = true
data_parallel_shard_degree = 4
[auto_parallel]
hardware = "cpu"
[activation_checkpoint]
mode = "none"
"""


def _brute_force() -> dict[Degrees, tuple[float, float]]:
    """(tokens/s per GPU, step seconds) of the full plan on every factorization of 4 ranks, with
    the trainer's own loop collectives priced as `plan --config` prices them."""
    from titan_autopar.cost.memory import Precision

    model, _ = build_model("llama3", "debugmodel", 64)
    out = {}
    for tp in (1, 2, 4):
        for rep in (1, 2, 4):
            if 4 % (tp * rep):
                continue
            d = Degrees(rep, 4 // tp // rep, tp)
            names, sizes = planner_mesh(d.dp_replicate, d.dp_shard, d.tp)
            tokens = torch.zeros(global_batch(2, names, sizes), 64, dtype=torch.long)
            plan = plan_model(model, fake_mesh(names, sizes), (tokens,), hardware="cpu",
                              precision=Precision(exact_floats=True), progress=lambda s: None,
                              loop_collectives=trainer_loop_collectives(names, sizes))
            step = plan.data["predicted"]["step_time_s"]
            out[d] = (2 * 64 / tp / step, step)
    return out


def test_search_finds_the_brute_force_winner(tmp_path, capsys):
    config = tmp_path / "job.toml"
    config.write_text(CONFIG)
    out = tmp_path / "job.plan.json"
    assert main(["plan", "--config", str(config), "--search", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "(job's own)" in printed and "**(winner)**" in printed
    block = tomllib.loads((tmp_path / "job.parallelism.toml").read_text())["parallelism"]
    found = Degrees(block["data_parallel_replicate_degree"], block["data_parallel_shard_degree"],
                    block["tensor_parallel_degree"])
    brute = _brute_force()
    assert len(brute) == 6
    best = max(brute, key=lambda d: (round(brute[d][0], 6), -d.dp_replicate, -d.tp))
    assert found == best, (found, brute)
    # the plan written is the brute force's own plan of those degrees, to the digit
    step = json.loads(out.read_text())["predicted"]["step_time_s"]
    assert abs(step - brute[best][1]) <= 1e-9 * step
    assert (tmp_path / "job.search.md").read_text().startswith("| degrees |")
    # the next search over the same --out may replace all three: each is known as the search's
    assert check_search_outputs(out, force=False) == (out, tmp_path / "job.parallelism.toml",
                                                      tmp_path / "job.search.md")


def test_cli_search_refuses_without_config(tmp_path, capsys):
    assert main(["plan", "--search", "--out", str(tmp_path / "p.json")]) == 2
    assert "--search needs --config" in capsys.readouterr().err
