"""Tests for titan_autopar.graph.opaque: MoE blocks as opaque ops in joint traces."""

from __future__ import annotations

import copy
import dataclasses
import importlib

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from titan_autopar.graph.opaque import (
    is_moe_block,
    opaque_moe_blocks,
    opaque_param_names,
)

OPAQUE_FWD = torch.ops.titan_autopar.opaque_forward.default
OPAQUE_BWD = torch.ops.titan_autopar.opaque_backward.default

BATCH, SEQ = 2, 256


@dataclasses.dataclass(frozen=True)
class Case:
    package: str
    args_dict: str
    model_cls: str
    flavor: str
    moe_names: tuple[str, ...]  # what the debug flavor is known to contain


CASES = [
    Case(
        "torchtitan.models.deepseek_v3",
        "deepseekv3_args",
        "DeepSeekV3Model",
        "debugmodel",
        tuple(f"layers.{i}.moe" for i in range(1, 6)),  # n_dense_layers=1
    ),
    Case(
        "torchtitan.models.qwen3",
        "qwen3_args",
        "Qwen3Model",
        "debugmodel_moe",
        tuple(f"layers.{i}.moe" for i in range(8)),
    ),
    Case(
        "torchtitan.models.llama4",
        "llama4_args",
        "Transformer",
        "debugmodel",
        ("layers.1.moe", "layers.3.moe", "layers.5.moe"),  # interleave step 2
    ),
]


def _build(case: Case):
    pkg = importlib.import_module(case.package)
    args = copy.deepcopy(getattr(pkg, case.args_dict)[case.flavor])
    args.max_seq_len = SEQ
    # torchtitan 0.2.2: DeepSeekV3 reads `model_args.moe_impl`, which only
    # update_from_config(job_config) sets; the dataclass field is
    # `expert_parallel_comm_backend`.
    if case.model_cls == "DeepSeekV3Model" and not hasattr(args, "moe_impl"):
        args.moe_impl = args.expert_parallel_comm_backend
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = getattr(pkg, case.model_cls)(args)
        tokens = torch.randint(0, args.vocab_size, (BATCH, SEQ))
        tangent = torch.empty(BATCH, SEQ, args.vocab_size)
    return model, tokens, tangent


def _trace(model, tokens, tangent):
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())

    def joint(params, buffers, tokens, tangent):
        out = torch.func.functional_call(model, {**params, **buffers}, (tokens,))
        return out, torch.autograd.grad(out, list(params.values()), tangent)

    return make_fx(joint, tracing_mode="fake")(params, buffers, tokens, tangent)


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c.package.split('.')[-1]}:{c.flavor}")
def traced(request):
    case = request.param
    model, tokens, tangent = _build(case)
    with opaque_moe_blocks(model) as names:
        gm = _trace(model, tokens, tangent)
    return case, model, names, gm


def _calls(gm, target):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]


def test_yielded_names_are_the_moe_modules(traced):
    case, model, names, _ = traced
    from torchtitan.models.moe import MoE

    expected = [n for n, m in model.named_modules() if isinstance(m, MoE)]
    assert names == expected
    assert names == list(case.moe_names)
    # instance forwards restored, class untouched
    for n in names:
        assert "forward" not in model.get_submodule(n).__dict__


def test_one_forward_and_one_backward_node_per_block(traced):
    _, model, names, gm = traced
    fwd, bwd = _calls(gm, OPAQUE_FWD), _calls(gm, OPAQUE_BWD)
    assert len(fwd) == len(bwd) == len(names)
    assert [n.args[2] for n in fwd] == names  # forward in layer order
    assert [n.args[3] for n in bwd] == names[::-1]  # backward in reverse
    # routing ops are gone from the graph
    targets = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not {t for t in targets if "histc" in t or "grouped_mm" in t or "argsort" in t or "sort" in t}


def test_opaque_nodes_take_block_params_in_named_parameters_order(traced):
    _, model, names, gm = traced
    param_names = [n for n, _ in model.named_parameters()]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # pytree flattening of the params dict keeps insertion order
    ph_to_param = dict(zip(placeholders[: len(param_names)], param_names))
    for fwd, bwd, qname in zip(_calls(gm, OPAQUE_FWD), reversed(_calls(gm, OPAQUE_BWD)), names):
        block = model.get_submodule(qname)
        expected = [f"{qname}.{p}" for p in opaque_param_names(block)]
        assert len(expected) >= 4  # experts.w1/w2/w3 + router.gate.weight
        assert [ph_to_param[p] for p in fwd.args[1]] == expected
        assert [ph_to_param[p] for p in bwd.args[2]] == expected
        # output shaped like the input; backward consumes the forward input
        assert fwd.meta["val"].shape == fwd.args[0].meta["val"].shape == (BATCH, SEQ, model.norm.weight.shape[0])
        assert bwd.args[1] is fwd.args[0]
        vals = bwd.meta["val"]
        assert len(vals) == 1 + len(expected)
        assert vals[0].shape == fwd.args[0].meta["val"].shape
        for v, pn in zip(vals[1:], expected):
            assert v.shape == model.get_parameter(pn).shape


def test_one_gradient_output_per_parameter(traced):
    _, model, names, gm = traced
    params = list(model.named_parameters())
    (outputs,) = [n for n in gm.graph.nodes if n.op == "output"]
    flat = outputs.args[0]
    assert len(flat) == 1 + len(params)
    vocab = model.output.weight.shape[0]
    assert flat[0].meta["val"].shape == (BATCH, SEQ, vocab)
    for node, (pname, p) in zip(flat[1:], params):
        assert node.meta["val"].shape == p.shape, pname
        assert node.meta["val"].dtype == p.dtype, pname

    # every MoE parameter gradient is getitem(opaque_backward, 1 + index)
    grad_of = {pname: node for node, (pname, _) in zip(flat[1:], params)}
    n_moe_params = 0
    for bwd in _calls(gm, OPAQUE_BWD):
        qname = bwd.args[3]
        for i, pn in enumerate(opaque_param_names(model.get_submodule(qname))):
            g = grad_of[f"{qname}.{pn}"]
            assert g.target.__name__ == "getitem" and g.args == (bwd, 1 + i)
            n_moe_params += 1
    assert n_moe_params == sum(
        len(opaque_param_names(model.get_submodule(n))) for n in names
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.package.split(".")[-1])
def test_tracing_without_opaque_blocks_fails_in_routing(case):
    model, tokens, tangent = _build(case)
    # TokenChoiceTopKRouter calls torch.histc on int64 expert indices; the
    # CPU kernel (also run for fake tensors) rejects int64.
    with pytest.raises(RuntimeError, match=r"histogram_cpu.*int64"):
        _trace(model, tokens, tangent)


# --------------------------------------------------------------------------
# Small modules: detection, nesting, restore on error, real-tensor behaviour
# --------------------------------------------------------------------------


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.zeros(4))

    def forward(self, x):
        return x + self.b


class MoE(nn.Module):  # not torchtitan's: matched by class name only
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(2, 4))
        self.gate = nn.Linear(4, 2, bias=False)
        self.inner = Inner()

    def forward(self, x):
        return x + self.inner(x)


class NestedMoE(MoE):  # subclass of a class named MoE
    pass


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.block = MoE()
        self.block.sub = NestedMoE()  # nested: covered by the outer block
        self.other = NestedMoE()

    def forward(self, x):
        return self.other(self.block(self.pre(x)))


def test_toy_detection_order_and_param_names():
    toy = Toy()
    assert is_moe_block(toy.block) and is_moe_block(toy.other) and not is_moe_block(toy.pre)
    assert opaque_param_names(toy.block) == [
        "w", "gate.weight", "inner.b", "sub.w", "sub.gate.weight", "sub.inner.b",
    ]
    with opaque_moe_blocks(toy) as names:
        assert names == ["block", "other"]
        assert "forward" in toy.block.__dict__ and "forward" not in toy.block.sub.__dict__
        with pytest.raises(NotImplementedError, match="only inside a program built by apply_plan"):
            toy(torch.randn(3, 4))
        with pytest.raises(TypeError, match="exactly one tensor"):
            toy.block(torch.randn(3, 4), torch.randn(3, 4))
    assert "forward" not in toy.block.__dict__ and "forward" not in toy.other.__dict__
    assert toy(torch.randn(3, 4)).shape == (3, 4)  # original forward back


def test_restores_on_error_and_keeps_preexisting_instance_forward():
    toy = Toy()
    custom = lambda x: x * 2  # noqa: E731
    toy.other.forward = custom
    with pytest.raises(ValueError):
        with opaque_moe_blocks(toy):
            assert toy.other.forward is not custom
            raise ValueError("boom")
    assert toy.other.forward is custom
    assert "forward" not in toy.block.__dict__
    assert type(toy.block).forward is MoE.forward


def test_toy_joint_trace_real_inputs():
    toy = Toy()
    x = torch.randn(3, 4)
    params = dict(toy.named_parameters())

    def joint(params, x):
        out = torch.func.functional_call(toy, params, (x,))
        return out, torch.autograd.grad(out, list(params.values()), torch.ones_like(out))

    with opaque_moe_blocks(toy):
        gm = make_fx(joint, tracing_mode="fake")(params, x)
    assert len(_calls(gm, OPAQUE_FWD)) == 2 and len(_calls(gm, OPAQUE_BWD)) == 2
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    assert [n.meta["val"].shape for n in out.args[0][1:]] == [p.shape for p in params.values()]
