"""One whole transformer layer, forward and backward, priced node by node and timed.

The layer is written in plain PyTorch as TorchTitan's llama3 writes it (RMSNorm, complex RoPE,
grouped-query causal SDPA, SwiGLU feed-forward, two residuals), so the check needs no TorchTitan.
Its joint forward+backward graph is traced with `make_fx` on fake tensors, and every node is priced
the way the planner prices an unsharded node (`cost/compute.compute_time` with split 1 and the
node's input and output bytes as its traffic). The same step then runs eagerly and is timed.
`whole_layer(device, dtype, sizes, hardwares, time_fn)` returns the measured seconds, each
hardware's priced seconds, and the split of the price into matmuls and attention against
everything else (norms, RoPE, activations, casts: the ops priced at memory bandwidth plus the
per-op floor).

`cost/calibrate.py` runs it on every rank at `LAYER[device]` and keeps measured / priced as
`Hardware.compute_scale`: what a real layer's ops cost beyond the sum of their micro-benchmarked
prices (layouts, caches, the dispatch of many small ops). `benchmarks/gpu/calibrate_and_check.py`
runs it at Llama3-8B's size against a profile and a preset.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

from titan_autopar.cost.compute import compute_time, node_flops


# the llama3 debug model's layer on CPU ranks (two sequences of 256 tokens); half of a Llama3-8B
# layer's tokens on a GPU (the one-GPU check prices 8192)
LAYER = {"cpu": {"tokens": 512, "dim": 256, "kv_dim": 256, "hidden": 768, "heads": 16,
                 "head_dim": 16},
         "cuda": {"tokens": 4096, "dim": 4096, "kv_dim": 1024, "hidden": 14336, "heads": 32,
                  "head_dim": 128}}


def _rms(x, w, eps=1e-5):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


def _rope(x, freqs):
    xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs).flatten(3).type_as(x)


def _layer(x, freqs, p, L):
    b, s, _ = x.shape
    h, kvh, d = L["heads"], L["kv_dim"] // L["head_dim"], L["head_dim"]
    y = _rms(x, p["attn_norm"])
    q = (y @ p["wq"]).view(b, s, h, d)
    k = (y @ p["wk"]).view(b, s, kvh, d)
    v = (y @ p["wv"]).view(b, s, kvh, d)
    q, k = _rope(q, freqs), _rope(k, freqs)
    k = k.repeat_interleave(h // kvh, dim=2)
    v = v.repeat_interleave(h // kvh, dim=2)
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=True)
    x = x + o.transpose(1, 2).reshape(b, s, h * d) @ p["wo"]
    y = _rms(x, p["ffn_norm"])
    return x + (F.silu(y @ p["w1"]) * (y @ p["w3"])) @ p["w2"]


def _inputs(device, dtype, L):
    T, D, kv, H, d = L["tokens"], L["dim"], L["kv_dim"], L["hidden"], L["head_dim"]
    shapes = {"wq": (D, D), "wk": (D, kv), "wv": (D, kv), "wo": (D, D), "w1": (D, H),
              "w3": (D, H), "w2": (H, D)}
    p = {n: (torch.randn(*s, device=device, dtype=dtype) / s[0] ** 0.5).requires_grad_()
         for n, s in shapes.items()}
    p["attn_norm"] = torch.ones(D, device=device, dtype=dtype, requires_grad=True)
    p["ffn_norm"] = torch.ones(D, device=device, dtype=dtype, requires_grad=True)
    x = torch.randn(1, T, D, device=device, dtype=dtype, requires_grad=True)
    ang = torch.outer(torch.arange(T, device=device).float(),
                      1.0 / 10000 ** (torch.arange(0, d, 2, device=device).float() / d))
    freqs = torch.polar(torch.ones_like(ang), ang).view(1, T, 1, d // 2)
    g = torch.randn(1, T, D, device=device, dtype=dtype)
    return x, freqs, p, g


def _bytes(v) -> float:
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, (list, tuple)):
        return sum(_bytes(u) for u in v)
    return 0.0


def _priced(graph, hw) -> tuple[float, float]:
    """(matmul and attention seconds, all other seconds) of one unsharded rank."""
    heavy = rest = 0.0
    for n in graph.nodes:
        if n.op != "call_function":
            continue
        traffic = _bytes(n.meta.get("val")) + sum(
            _bytes(a.meta.get("val")) for a in n.all_input_nodes)
        first = next((a.meta["val"] for a in (n, *n.all_input_nodes)
                      if isinstance(a.meta.get("val"), torch.Tensor)), None)
        size = first.element_size() if first is not None else 2
        t = compute_time(n, 1, traffic, hw, size)
        if node_flops(n):
            heavy += t
        else:
            rest += t
    return heavy, rest


def whole_layer(device: str, dtype, L: dict, hardwares: dict, time_fn) -> dict:
    x, freqs, p, g = _inputs(device, dtype, L)
    names = list(p)

    def step(x, freqs, g, *ws):
        out = _layer(x, freqs, dict(zip(names, ws)), L)
        return torch.autograd.grad(out, (x, *ws), g)
    graph = make_fx(step, tracing_mode="fake")(x, freqs, g, *p.values()).graph
    res = {"nodes": sum(1 for n in graph.nodes if n.op == "call_function"),
           "measured_s": time_fn(lambda: step(x, freqs, g, *p.values()), device)}
    for key, hw in hardwares.items():
        heavy, rest = _priced(graph, hw)
        res[f"{key}_s"] = heavy + rest
        res[f"{key}_matmul_attention_s"] = heavy
        res[f"{key}_other_s"] = rest
        res[f"{key}_error_pct"] = round(100 * ((heavy + rest) / res["measured_s"] - 1), 1)
    return {k: (round(v, 7) if isinstance(v, float) else v) for k, v in res.items()}
