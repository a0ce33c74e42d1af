"""On a machine with GPUs: calibrate them, then hold the cost model to one Llama3-8B layer.

1. `titan-autopar calibrate --device cuda --nproc <GPUs>` writes out/gpu/profile.json (NCCL).
2. On one GPU, in bf16, the matmuls of one Llama3-8B transformer layer (wq, wk, wv, wo, w1, w3,
   w2 at 8192 tokens; forward, and the two backward matmuls each) and its causal attention
   (32 heads, 8192 tokens, head dim 128; forward and backward) are timed with CUDA events, and
   each is priced the way the planner prices it (`cost/compute.py`: FLOPs at the peak, bytes at
   memory bandwidth, plus the per-op floor), once with the measured profile and once with the
   vendor preset.

Prints one JSON line: per op, measured and both predictions; and the layer's total error against
each (`profile_error_pct`, `preset_error_pct`).

3. The whole layer (`titan_autopar/cost/layer_check.py`): its joint forward+backward graph traced and priced node by
   node as the planner prices it (norms, RoPE, activations and casts too, not only the matmuls and
   attention), against the same step run eagerly (`whole_layer` in the JSON line).

    .venv/bin/python benchmarks/gpu/calibrate_and_check.py [--preset h200] [--device cuda]

`--device cpu` runs the same on CPU at a smaller size (a smoke test of the script, not a figure).
About 2 minutes on one H200.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from titan_autopar.cost.compute import op_seconds  # noqa: E402
from titan_autopar.cost.layer_check import whole_layer  # noqa: E402

LAYER = {"tokens": 8192, "dim": 4096, "kv_dim": 1024, "hidden": 14336, "heads": 32, "head_dim": 128}
SMALL = {"tokens": 256, "dim": 256, "kv_dim": 64, "hidden": 768, "heads": 4, "head_dim": 64}


def _time(fn, device: str, reps: int = 10) -> float:
    for _ in range(2):
        fn()
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps


def _predict(hw, flops: float, nbytes: float, attention: bool, itemsize: int = 2) -> float:
    """As `cost/compute.py` prices an op; attention (forward and backward together here) pays
    its whole per-call floor."""
    return op_seconds(flops, nbytes, hw, itemsize, attention, hw.attention_floor)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--preset", default="h200")
    ap.add_argument("--out", default="out/gpu")
    a = ap.parse_args()
    from titan_autopar.cost.hardware import get_hardware

    out = REPO / a.out
    out.mkdir(parents=True, exist_ok=True)
    profile = out / "profile.json"
    n = torch.cuda.device_count() if a.device == "cuda" else 2
    cal = subprocess.run([sys.executable, "-m", "titan_autopar.cli", "calibrate", "--device",
                          a.device, "--nproc", str(max(1, n)), "--out", str(profile)], cwd=REPO)
    if cal.returncode != 0:
        raise SystemExit("calibration failed (its output is above)")
    measured_hw, preset = get_hardware(str(profile)), get_hardware(a.preset)

    L = LAYER if a.device == "cuda" else SMALL
    dev, dt = a.device, torch.bfloat16 if a.device == "cuda" else torch.float32
    T, D = L["tokens"], L["dim"]
    shapes = {"wq": (T, D, D), "wk": (T, D, L["kv_dim"]), "wv": (T, D, L["kv_dim"]),
              "wo": (T, D, D), "w1": (T, D, L["hidden"]), "w3": (T, D, L["hidden"]),
              "w2": (T, L["hidden"], D)}
    rows = {}
    size = torch.finfo(dt).bits // 8
    for name, (m, k, nn) in shapes.items():
        x = torch.randn(m, k, device=dev, dtype=dt)
        w = torch.randn(k, nn, device=dev, dtype=dt)
        g = torch.randn(m, nn, device=dev, dtype=dt)
        calls = {"fwd": (lambda: x @ w, (m, k, nn)), "bwd_input": (lambda: g @ w.t(), (m, nn, k)),
                 "bwd_weight": (lambda: x.t() @ g, (k, m, nn))}
        for part, (fn, (p, q, r)) in calls.items():
            flops, nbytes = 2.0 * p * q * r, size * (p * q + q * r + p * r)
            rows[f"{name}.{part}"] = {"measured_s": _time(fn, dev),
                                      "profile_s": _predict(measured_hw, flops, nbytes, False, size),
                                      "preset_s": _predict(preset, flops, nbytes, False, size)}
    h, d = L["heads"], L["head_dim"]
    q, k, v = (torch.randn(1, h, T, d, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
    go = torch.randn(1, h, T, d, device=dev, dtype=dt)

    def attn():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(o, (q, k, v), go)
    flops = 4.0 * h * T * T * d / 2 * (1 + 2.5)
    nbytes = size * 4 * h * T * d * 3
    rows["attention.fwd+bwd"] = {"measured_s": _time(attn, dev, reps=5),
                                 "profile_s": _predict(measured_hw, flops, nbytes, True, size),
                                 "preset_s": _predict(preset, flops, nbytes, True, size)}
    total = {k: sum(r[k] for r in rows.values()) for k in ("measured_s", "profile_s", "preset_s")}
    layer = whole_layer(dev, dt, L, {"profile": measured_hw, "preset": preset}, _time)
    res = {"benchmark": "gpu_calibrate_and_check", "device": a.device,
           "accelerator": torch.cuda.get_device_name(0) if dev == "cuda" else "cpu",
           "profile": measured_hw.name, "preset": a.preset, "layer": L,
           "layer_measured_s": round(total["measured_s"], 6),
           "layer_profile_s": round(total["profile_s"], 6), "layer_preset_s": round(total["preset_s"], 6),
           "profile_error_pct": round(100 * (total["profile_s"] / total["measured_s"] - 1), 1),
           "preset_error_pct": round(100 * (total["preset_s"] / total["measured_s"] - 1), 1),
           "whole_layer": layer,
           "ops": {k: {kk: round(vv, 7) for kk, vv in r.items()} for k, r in rows.items()}}
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
