"""Flex attention in traces: TorchTitan's `FlexAttentionWrapper` as one op each way.

Flavors with `attn_type = "flex"` (DeepSeek-V3 16B and 671B, some Llama 4 flavors) call
`flex_attention` with a `BlockMask` built per batch from the tokens (block-causal: causal within
each document). The mask is data, and flex attention is a higher-order op DTensor has no rule
for. While `flex_as_ops(model)` is active, each wrapper instance's forward calls
`titan_autopar::masked_attention(q, k, v, scale)` instead -- its gradient is
`titan_autopar::masked_attention_backward` -- and `flex_kwargs(model)` gives the model the
placeholder mask its attention modules assert on. The planner prices the op as causal attention
(a block-causal mask does no more work) and may shard it on the batch or the heads
(`strategy/rules.py`).

Planning only: a program that runs flex attention needs the per-batch masks as an input, which
`apply_plan` refuses with a message (`flex_modules`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

NAMESPACE = "titan_autopar"


@torch.library.custom_op(f"{NAMESPACE}::masked_attention", mutates_args=())
def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     scale: float) -> torch.Tensor:
    raise NotImplementedError("masked attention is traced for planning only")


@masked_attention.register_fake
def _fake(q, k, v, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


@torch.library.custom_op(f"{NAMESPACE}::masked_attention_backward", mutates_args=())
def masked_attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                              v: torch.Tensor, scale: float) -> list[torch.Tensor]:
    raise NotImplementedError("masked attention is traced for planning only")


@masked_attention_backward.register_fake
def _fake_backward(grad, q, k, v, scale):
    return [q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)]


def _setup(ctx, inputs, output):
    q, k, v, scale = inputs
    ctx.save_for_backward(q, k, v)
    ctx.scale = scale


def _backward(ctx, grad):
    q, k, v = ctx.saved_tensors
    gq, gk, gv = torch.ops.titan_autopar.masked_attention_backward(grad, q, k, v, ctx.scale)
    return gq, gk, gv, None


masked_attention.register_autograd(_backward, setup_context=_setup)

FORWARD = torch.ops.titan_autopar.masked_attention.default
BACKWARD = torch.ops.titan_autopar.masked_attention_backward.default


def flex_modules(model: nn.Module) -> list[str]:
    """Qualified names of TorchTitan's flex attention wrappers in `model`."""
    return [n for n, m in model.named_modules() if type(m).__name__ == "FlexAttentionWrapper"]


def flex_kwargs(model: nn.Module) -> dict:
    """Keyword arguments a flex-attention model's forward needs in a trace: a placeholder
    `BlockMask` (its contents are never read: the attention ops above stand in for it)."""
    if not flex_modules(model):
        return {}
    from torch.nn.attention.flex_attention import BlockMask

    mask = BlockMask.from_kv_blocks(torch.ones(1, 1, 1, dtype=torch.int32),
                                    torch.zeros(1, 1, 1, 1, dtype=torch.int32))
    return {"attention_masks": mask}


def _as_op(qname: str):
    def forward(q, k, v, *, block_mask=None, scale=None, score_mod=None, return_lse=False,
                enable_gqa=False):
        if return_lse or score_mod is not None:
            raise NotImplementedError(f"{qname}: flex attention with return_lse or score_mod is "
                                      "not planned yet")
        if enable_gqa and k.shape[1] != q.shape[1]:  # grouped heads: each kv head serves a group
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        s = float(scale) if scale is not None else q.shape[-1] ** -0.5
        return torch.ops.titan_autopar.masked_attention(q, k, v, s)

    return forward


@contextlib.contextmanager
def flex_as_ops(model: nn.Module) -> Iterator[list[str]]:
    """While active, every flex attention wrapper of `model` runs as the ops above."""
    names = flex_modules(model)
    saved = []
    try:
        for n in names:
            m = model.get_submodule(n)
            saved.append((m, m.__dict__.get("forward")))
            m.forward = _as_op(n)
        yield names
    finally:
        for m, prev in reversed(saved):
            if prev is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = prev
