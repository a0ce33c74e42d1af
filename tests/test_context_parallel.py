"""Context parallelism under auto: ring attention planned on a cp dim, run on gloo ranks.

A one-head attention block on one sequence of 36 tokens, planned with cp_attention = "ring" on a
cp dim of 2 ranks (shards of 18: the load-balanced ring) and of 4 (shards of 9: the plain ring on
contiguous chunks). The test checks the plan's attention ops are sequence-sharded (dim 2), then
runs the plan against single-device attention: forward, every gradient and the input's, five
AdamW steps' losses (`test_apply_parity.check_parity`). Without the option, the planner picks
the ring where it is priced lowest (`test_ring_is_chosen_where_heads_run_out`).
"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import tiny_llama
from parity_models import RING_MODEL
from test_apply_parity import check_parity
from titan_autopar import plan_model
from titan_autopar.strategy.rules import balanced


@pytest.mark.parametrize("ranks", [2, 4])
def test_ring_attention_parity(ranks, tmp_path):
    figures = check_parity((ranks,), [(RING_MODEL, "ring")], tmp_path, names=("cp",))
    plan = json.loads((tmp_path / "plans" / f"{RING_MODEL}-ring.json").read_text())
    attention = {k: v for k, v in plan["nodes"].items() if "flash_attention" in v["op"]}
    assert len(attention) == 2  # forward and backward
    for name, entry in attention.items():
        assert entry["in"][0] == ["S(2)"], f"{name} is not sequence-sharded: {entry}"
    r = figures[f"{RING_MODEL}-ring"]
    assert any("all_to_all" in c for c in r["collectives"]), r["collectives"]  # the rotations
    print(f"{'balanced' if balanced(True, 36 // ranks, ranks) else 'plain'} ring attention on "
          f"{ranks} ranks: forward rel {r['fwd_rel'][0]:.1e}, gradients "
          f"{r['grad_rel'][0]:.1e}, input gradient {r['input_grad_rel']:.1e}")


def _attention_placements(plan) -> list:
    return [v["in"][0] for v in plan.data["nodes"].values() if "flash_attention" in v["op"]]


@pytest.mark.parametrize("heads, chosen", [(2, "S(2)"), (4, "S(1)")])
def test_ring_is_chosen_where_heads_run_out(heads, chosen, mesh_of):
    """On cp=4 at 16k tokens (h100 prices), attention with 4 heads is split by heads (an
    all-to-all each way, no ring); with 2 heads, which do not split 4 ways, the planner runs
    the ring rather than all-gathering the sequence."""
    model = tiny_llama(dim=512, layers=1, seq=16384, n_heads=heads)
    plan = plan_model(model, mesh_of(("cp",), (4,)), (torch.zeros(1, 16384, dtype=torch.long),),
                      progress=lambda s: None)
    assert _attention_placements(plan) == [[chosen], [chosen]]


def test_ring_prices():
    """The balanced ring does the balanced share of the work and pays its re-layout; the plain
    one (odd shards) does (2n - 1) / n of it and has no re-layout."""
    from titan_autopar.cost.comm import Topology
    from titan_autopar.cost.hardware import get_hardware
    from titan_autopar.cost.ring import ring_imbalance, ring_relayout_seconds

    class Node:  # a causal attention forward, as the trace records it
        target = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
        args, kwargs = (None, None, None, 0.0, True), {}

    topo = Topology((4,), get_hardware("h100"))
    assert ring_imbalance(Node, 4, 1024) == 1.0
    assert ring_imbalance(Node, 4, 1023) == pytest.approx(7 / 4)
    assert ring_relayout_seconds(Node, topo, 0, 1023, 1e9) == 0.0
    bw = get_hardware("h100").intra_node_bandwidth
    assert ring_relayout_seconds(Node, topo, 0, 1024, 1e9) == pytest.approx(1e9 / bw, rel=0.01)
