"""Stamped joint graphs (`graph/stamp.py`) against whole traces: node for node the same graph, and
the same plan, for the shipped models whose blocks are alike; a whole trace for the others."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import titan_autopar.graph.stamp as stamp
from conftest import tiny_llama
from titan_autopar import plan_model
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.graph.manual import resolve_all
from titan_autopar.graph.stamp import trace_step
from titan_autopar.graph.trace import trace_joint
from titan_autopar.titan.models import build_model

QUIET = dict(progress=lambda s: None)
SEQ = 64


def described(jg) -> list[tuple]:
    """Every node as name, op, target, arguments by name, and output shapes, dtypes, strides."""
    def arg(x):
        if isinstance(x, torch.fx.Node):
            return ("node", x.name)
        if isinstance(x, (list, tuple)):
            return tuple(arg(y) for y in x)
        if isinstance(x, dict):
            return tuple(sorted((k, arg(v)) for k, v in x.items()))
        return repr(x)

    def val(v):
        if isinstance(v, torch.Tensor):
            return (tuple(v.shape), v.dtype, tuple(v.stride()))
        if isinstance(v, (list, tuple)):
            return tuple(val(y) for y in v)
        return repr(v)

    return [(n.name, n.op, str(n.target), arg(n.args), arg(n.kwargs), val(n.meta.get("val")))
            for n in jg.gm.graph.nodes]


def both(model, dtype=None, mesh=("dp_shard", 2)):
    tokens = (torch.zeros(2, SEQ, dtype=torch.long),)
    manual = resolve_all(model, (mesh[0],), (mesh[1],))
    return trace_step(model, tokens, dtype, manual), trace_joint(model, tokens, dtype, manual)


# (model, flavor, stamped?) -- the debug flavors TorchTitan ships
MODELS = [
    ("llama3", "debugmodel", True),
    ("qwen3", "debugmodel", True),
    ("deepseek_v3", "debugmodel", False),  # its first block is dense, the rest MoE
    ("llama4", "debugmodel", False),  # every fourth block without rotary embeddings
]


@pytest.mark.parametrize("name, flavor, stamped", MODELS, ids=[m[0] for m in MODELS])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16], ids=["fp32", "bf16"])
def test_the_stamped_graph_is_the_whole_trace(name, flavor, stamped, dtype):
    model, _ = build_model(name, flavor, SEQ)
    fast, whole = both(model, dtype)
    assert (fast.traced_blocks == stamp.TRACED) is stamped, fast.stamp_note
    if stamped:
        assert fast.traced_nodes < len(whole.gm.graph.nodes)
    assert described(fast) == described(whole)
    assert [(b.name, b.fwd, b.bwd, b.signature) for b in fast.blocks] == \
        [(b.name, b.fwd, b.bwd, b.signature) for b in whole.blocks]
    assert fast.param_names == whole.param_names and fast.buffer_names == whole.buffer_names
    assert {k: v.name for k, v in fast.grad_nodes.items()} == \
        {k: v.name for k, v in whole.grad_nodes.items()}
    assert fast.output_value.name == whole.output_value.name
    assert fast.tangent_node.name == whole.tangent_node.name


def test_a_plan_from_a_stamped_graph_is_the_whole_traces(monkeypatch):
    model = tiny_llama(dim=64, layers=6, seq=32, n_heads=4)
    mesh = fake_mesh(("dp_shard", "tp"), (2, 2))
    tokens = (torch.zeros(4, 32, dtype=torch.long),)
    fast = plan_model(model, mesh, tokens, **QUIET)
    monkeypatch.setattr(stamp, "MIN_BLOCKS", 10**6)  # every model traced whole
    whole = plan_model(model, mesh, tokens, **QUIET)
    assert fast.to_json() == whole.to_json()


class Block(nn.Module):
    def __init__(self, i: int):
        super().__init__()
        self.i = i
        self.lin = nn.Linear(16, 16)

    def forward(self, x, first=None):
        return self.lin(x if first is None else x + first).relu()


class Scaled(Block):
    """A block whose forward reads where it stands: every third scales its output."""

    def forward(self, x, first=None):
        y = super().forward(x)
        return y * 2 if self.i % 3 == 2 else y


class Deep(nn.Module):
    """A stack of blocks."""

    def __init__(self, n: int, block=Block):
        super().__init__()
        self.layers = nn.ModuleList(block(i) for i in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Counted(Deep):
    """Blocks that are alike, in a model whose forward reads how many there are."""

    def forward(self, x):
        return super().forward(x) / len(self.layers)


class Residual(Deep):
    """Every block after the first also reads the first block's output (a value residual)."""

    def forward(self, x):
        first = None
        for layer in self.layers:
            x = layer(x, first)
            first = x if first is None else first
        return x


@pytest.mark.parametrize("model, why", [
    (Deep(6, Scaled), "block 2 runs other ops than block 1"),
    (Counted(6), "the ops after the blocks depend on the number of blocks"),
    (Residual(6), "block 2 runs other ops than block 1"),
    (Deep(4), "4 blocks"),
], ids=["by-position", "reads-depth", "value-residual", "too-few"])
def test_a_model_that_cannot_be_stamped_is_traced_whole(model, why):
    """Each would give a wrong graph if stamped from its first four blocks."""
    inputs = (torch.zeros(8, 16),)
    fast, whole = trace_step(model, inputs), trace_joint(model, inputs)
    assert fast.traced_blocks is None
    assert why in fast.stamp_note
    assert described(fast) == described(whole)


def test_a_plain_stack_is_stamped():
    model = Deep(7)
    inputs = (torch.zeros(8, 16),)
    fast, whole = trace_step(model, inputs), trace_joint(model, inputs)
    assert fast.traced_blocks == stamp.TRACED, fast.stamp_note
    assert described(fast) == described(whole)
