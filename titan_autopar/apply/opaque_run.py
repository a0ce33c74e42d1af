"""Opaque blocks (MoE with data-dependent routing) inside a built program.

The planner sees each MoE block as one `opaque_forward` op and one `opaque_backward` op,
planned data-parallel: a local batch shard in, the block's parameters whole. In the program
they run the block's own eager code on those local tensors: forward calls the block with the
given parameters; backward recomputes that forward and differentiates it with `torch.func.vjp`
(the block's activations are not kept between the two, like activation checkpointing). Buffers
the block updates as it routes (`tokens_per_expert`) see that update once per step: the
recomputation runs on copies of them.

`BlockRunner` does that for one block; a program registers one per block under a name unique
to the program (`bind_name`), so two models in one process never mix.
"""

from __future__ import annotations

import torch

from titan_autopar.graph.opaque import find_moe_blocks, opaque_param_names, register_runner

OPAQUE_OPS = set()
for _name in ("opaque_forward", "opaque_backward"):
    OPAQUE_OPS.add(getattr(torch.ops.titan_autopar, _name).default)


def bind_name(token: str, block_name: str) -> str:
    return f"{token}/{block_name}"


class BlockRunner:
    def __init__(self, block: torch.nn.Module):
        self.block = block
        self.names = opaque_param_names(block)

    def _call(self, x, params):
        return torch.func.functional_call(self.block, dict(zip(self.names, params)), (x,))

    def forward(self, x: torch.Tensor, params: list[torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            return self._call(x, params).clone()

    def backward(self, grad_out, x, params) -> list[torch.Tensor]:
        # torch.func, not torch.autograd: this runs inside a custom op, below autograd. The
        # block's buffers enter as copies, so the recomputation's updates to them are dropped.
        bnames = [n for n, _ in self.block.named_buffers()]
        copies = [b.clone() for _, b in self.block.named_buffers()]
        n = len(params)

        def block(x, *rest):
            state = dict(zip(self.names, rest[:n])) | dict(zip(bnames, rest[n:]))
            return torch.func.functional_call(self.block, state, (x,))

        _, vjp = torch.func.vjp(block, x, *params, *copies)
        return list(vjp(grad_out)[: 1 + n])


def register_blocks(model: torch.nn.Module, token: str) -> list[BlockRunner]:
    """One runner per opaque block of `model`; the caller keeps them alive."""
    runners = []
    for name, block in find_moe_blocks(model):
        r = BlockRunner(block)
        register_runner(bind_name(token, name), r)
        runners.append(r)
    return runners
