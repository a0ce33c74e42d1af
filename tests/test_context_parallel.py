"""Context parallelism under auto: ring attention planned on a cp dim, run on gloo ranks.

A one-head attention block with one sequence leaves the planner nothing to shard on a cp dim
but the sequence, so its plan runs ring attention (`apply/ring_attention.py`); the test checks
that the plan chose it (the attention ops sharded on the sequence, dim 2), then runs it on 2 and
4 ranks against single-device attention: forward, every gradient and the input's, five AdamW
steps' losses (`test_apply_parity.check_parity`). The price's terms (`cost/ring.py`) are
checked on their own.
"""

from __future__ import annotations

import json

import pytest

from parity_models import RING_MODEL
from test_apply_parity import check_parity


@pytest.mark.parametrize("ranks", [2, 4])
def test_ring_attention_parity(ranks, tmp_path):
    figures = check_parity((ranks,), [(RING_MODEL, "auto")], tmp_path, names=("cp",))
    plan = json.loads((tmp_path / "plans" / f"{RING_MODEL}-auto.json").read_text())
    attention = {k: v for k, v in plan["nodes"].items() if "flash_attention" in v["op"]}
    assert len(attention) == 2  # forward and backward
    for name, entry in attention.items():
        assert entry["in"][0] == ["S(2)"], f"{name} is not sequence-sharded: {entry}"
    r = figures[f"{RING_MODEL}-auto"]
    assert any("all_to_all" in c for c in r["collectives"]), r["collectives"]  # the rotations
    print(f"ring attention on {ranks} ranks: forward rel {r['fwd_rel'][0]:.1e}, gradients "
          f"{r['grad_rel'][0]:.1e}, input gradient {r['input_grad_rel']:.1e}")
