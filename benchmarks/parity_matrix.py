"""The full `apply_plan` parity matrix on real gloo ranks, one JSON line.

Every model (MLP, attention block, llama3 and DeepSeek-V3 debug) x every plan kind (FSDP, TP,
the solver's own, with activation checkpointing) on 2 ranks, 4 ranks and 2x2 (plus the tied-weight
qwen3 on 2x2), each against a single-process reference: forward, gradients, gradient norm, eval
forward and five AdamW steps (the checks of `tests/test_apply_parity.py`, whose CI slice runs
2x2 whole and a few cases on 4 ranks). Prints the worst forward and gradient errors per mesh.

  OMP_NUM_THREADS=1 .venv/bin/python benchmarks/parity_matrix.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_apply_parity import all_cases, check_parity  # noqa: E402


def main() -> None:
    out = {"benchmark": "parity_matrix"}
    for shape in ((2,), (4,), (2, 2)):
        with tempfile.TemporaryDirectory() as tmp:
            res = check_parity(shape, all_cases(shape), Path(tmp))
        key = "x".join(map(str, shape))
        out[key] = {"cases": len(res),
                    "worst_forward_rel": max(r["fwd_rel"][0] for r in res.values()),
                    "worst_gradient_rel": max(r["grad_rel"][0] for r in res.values())}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
