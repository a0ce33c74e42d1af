"""Roofline compute prices of graph nodes.

Owns `node_flops` (matmuls and attention; 0 for everything else; manual regions are priced by
`cost/regions.py`), `op_seconds` (the price of given FLOPs and bytes) and
`compute_time`: the time one rank spends on a node whose work is split `split` ways
(the product of the mesh dims on which the node's strategy is not all-Replicate), as the larger
of its FLOPs at `compute_efficiency` of peak (the bf16 peak for elements of 2 bytes or less, the
fp32 peak otherwise; attention at the measured `attention_flops`, plus its measured per-call
`attention_floor`, where a profile has them) and
its memory traffic at HBM bandwidth, plus a launch floor, times the measured `compute_scale` (a
whole layer's time over the sum of its ops' prices, `cost/layer_check.py`). Views and other
aliasing ops are free.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from titan_autopar.cost.hardware import Hardware

aten = torch.ops.aten

FREE_OPS = {
    aten.view.default, aten._unsafe_view.default, aten.t.default, aten.transpose.int,
    aten.permute.default, aten.expand.default, aten.detach.default, aten.alias.default,
    aten.slice.Tensor, aten.select.int, aten.unsqueeze.default, aten.squeeze.dim,
    aten.squeeze.default, aten.squeeze.dims, aten.view_as_real.default,
    aten.view_as_complex.default, aten._conj.default, aten.split.Tensor,
    aten.split_with_sizes.default, aten.unbind.int, aten.as_strided.default,
    aten.lift_fresh_copy.default, operator.getitem,
}
VIEW_OPS = FREE_OPS - {aten.lift_fresh_copy.default, operator.getitem}


def _shape(n) -> tuple[int, ...]:
    v = n.meta.get("val") if isinstance(n, fx.Node) else n
    return tuple(v.shape) if isinstance(v, torch.Tensor) else ()


def node_flops(node: fx.Node) -> float:
    t = node.target
    a = node.args
    if t is aten.mm.default:
        (m, k), (_, n) = _shape(a[0]), _shape(a[1])
        return 2.0 * m * k * n
    if t is aten.addmm.default:
        (m, k), (_, n) = _shape(a[1]), _shape(a[2])
        return 2.0 * m * k * n
    if t is aten.bmm.default:
        (b, m, k), (_, _, n) = _shape(a[0]), _shape(a[1])
        return 2.0 * b * m * k * n
    name = getattr(t, "__name__", str(t))
    if "masked_attention" in name:  # flex attention, block-causal: priced as causal
        backward = "backward" in name
        q, k, v = (_shape(x) for x in (a[1:4] if backward else a[0:3]))
        b, h, s, dq = q
        f = 2.0 * b * h * s * k[2] * (dq + v[3]) / 2
        return f * (2.5 if backward else 1.0)
    if "scaled_dot_product" in name:
        causal = bool(node.kwargs.get("is_causal", False))
        if "backward" in name:
            q, k = _shape(a[1]), _shape(a[2])
            causal = causal or (len(a) > 7 and bool(a[7]))
            mult = 2.5
        else:
            q, k = _shape(a[0]), _shape(a[1])
            causal = causal or (len(a) > 4 and bool(a[4]))
            mult = 1.0
        b, h, s, d = q
        f = 4.0 * b * h * s * k[2] * d * mult
        return f / 2 if causal else f
    return 0.0


def is_attention(node: fx.Node) -> bool:
    name = getattr(node.target, "__name__", str(node.target))
    return "scaled_dot_product" in name or "masked_attention" in name


def compute_time(
    node: fx.Node, split: int, local_bytes: float, hw: Hardware, itemsize: int
) -> float:
    """One rank's time for `node`: its work split `split` ways and `local_bytes` of traffic."""
    if node.target in FREE_OPS or node.op != "call_function":
        return 0.0
    attention = is_attention(node)
    # the floor is shared as the FLOPs are (backward 2.5x the forward)
    floor = hw.attention_floor * (2.5 if "backward" in str(node.target) else 1.0) / 3.5 \
        if attention else 0.0
    return op_seconds(node_flops(node) / split, local_bytes, hw, itemsize, attention, floor)


def op_seconds(flops: float, local_bytes: float, hw: Hardware, itemsize: int,
               attention: bool = False, floor: float = 0.0) -> float:
    """The roofline price of `flops` and `local_bytes` on one rank; an attention op pays `floor`
    seconds of the measured per-call floor, where the profile measured attention."""
    peak = hw.peak_bf16_flops if itemsize <= 2 else hw.peak_fp32_flops
    rate = peak * hw.compute_efficiency
    if hw.attention_flops and attention:
        rate = hw.attention_flops  # measured, in the dtype the profile's machine trains in
    else:
        floor = 0.0
    t_flops = floor + flops / rate
    t_mem = local_bytes / hw.hbm_bandwidth
    return (hw.launch_overhead + max(t_flops, t_mem)) * hw.compute_scale
