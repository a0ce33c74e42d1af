"""A plan depends on its inputs alone, not on how busy the machine is.

An 8B-wide llama (two layers: the repeated blocks share one program, so the programs are those
of Llama3-8B) on an 8x8 mesh at 8 x 8192 tokens: several of its integer programs need branch-
and-bound for seconds, where a wall-clock limit would stop at a load-dependent point. It is
planned twice, the second time with two processes burning both cores beside it, and the two
plans must be the same bytes.
"""

from __future__ import annotations

import subprocess
import sys

import torch

from conftest import tiny_llama
from titan_autopar import plan_model


def _plan(mesh_of):
    model = tiny_llama(dim=4096, layers=2, seq=8192, n_heads=32, n_kv_heads=8,
                       ffn_dim_multiplier=1.3, multiple_of=1024)
    mesh = mesh_of(("dp_shard", "tp"), (8, 8))
    return plan_model(model, mesh, (torch.zeros(8, 8192, dtype=torch.long),),
                      progress=lambda s: None)


def test_the_same_plan_on_an_idle_and_a_busy_machine(mesh_of):
    idle = _plan(mesh_of)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        busy = _plan(mesh_of)
    finally:
        for b in burners:
            b.kill()
            b.wait()
    assert idle.data["solver"]["gap"] > 0  # branch-and-bound ran (the LP was not integral)
    assert idle.data["solver"]["status"] == "optimal"
    assert busy.to_json() == idle.to_json()
