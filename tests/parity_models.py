"""Models and the parity check for the multi-process tests of `apply_plan`.

`build(name)` gives (model, reference, global inputs): the model to parallelise and a plain
single-process reference with the same weights -- for TorchTitan models both start on meta and
get their weights from `init_weights` under the same seed, which also checks that a
parallelised model initialises to the single-device parameters. `run_case` applies a plan and
compares output, every gradient (gathered to full; a floating-point input's too), the gradient norm, a no_grad eval forward
and five AdamW steps' losses against the reference, returning the figures as a dict.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor

from titan_autopar import apply_plan
from titan_autopar.apply.init import local_slice
from titan_autopar.apply.interpret import BLOCK_TAG

BATCH, SEQ, DIM = 8, 32, 64
MOE_MODEL = "deepseek_v3"
TIED_MODEL = "qwen3"  # its dense debug flavor ties output.weight to tok_embeddings.weight
MODELS = ("mlp", "attention", "llama3", MOE_MODEL)
# one head and one sequence: nothing to shard but the sequence, so a cp dim runs ring attention
RING_MODEL = "attention_1head"
BLOCKS = ("mlp", "attention", RING_MODEL)  # our own blocks (float inputs), not TorchTitan's
STEPS = 5


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, 2 * DIM)
        self.w2 = nn.Linear(2 * DIM, DIM)

    def forward(self, x):
        return self.w2(F.gelu(self.w1(x)))


class Attention(nn.Module):
    """Causal self-attention with a residual: (batch, seq, dim) -> (batch, seq, dim)."""

    def __init__(self, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, d = x.shape

        def split(t):
            return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.wq(x)), split(self.wk(x)), split(self.wv(x)),
                                           is_causal=True)
        return x + self.wo(y.transpose(1, 2).reshape(b, s, d))


def titan_model(name: str) -> nn.Module:
    """TorchTitan's debug flavor of `name`. MoE experts use the fp32 for-loop path instead of
    the grouped matmul, which computes in bf16 whatever the model's dtype: a data-parallel
    gradient (partial sums over each rank's tokens) then differs from the single-device one by
    bf16 rounding (~5e-3), which would hide what these tests check."""
    import dataclasses

    from torchtitan.protocols.train_spec import get_train_spec

    from titan_autopar.titan.models import build_model

    args = get_train_spec(name).model_args["debugmodel"]
    moe = getattr(args, "moe_args", None)
    if moe is None or not moe.use_grouped_mm:
        return build_model(name, "debugmodel", SEQ)[0]
    saved = args.moe_args
    args.moe_args = dataclasses.replace(moe, use_grouped_mm=False)
    try:
        return build_model(name, "debugmodel", SEQ)[0]
    finally:
        args.moe_args = saved


def _block(name: str) -> nn.Module:
    return {"mlp": MLP, "attention": Attention, RING_MODEL: lambda: Attention(heads=1)}[name]()


def inputs_of(name: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    if name == RING_MODEL:  # 36: even shards on 2 ranks (the balanced ring), odd on 4 (plain)
        return (torch.randn(1, 36, DIM, generator=g),)
    if name in ("mlp", "attention"):
        return (torch.randn(BATCH, SEQ, DIM, generator=g),)
    return (torch.randint(0, 2048, (BATCH, SEQ), generator=g),)


def meta_model(name: str) -> nn.Module:
    if name in BLOCKS:
        with torch.device("meta"):
            return _block(name)
    return titan_model(name)


def build(name: str):
    if name in BLOCKS:
        torch.manual_seed(0)
        ref = _block(name)
        return copy.deepcopy(ref), ref, inputs_of(name)
    return titan_model(name), titan_model(name), inputs_of(name)


def init_titan(model: nn.Module) -> None:
    """TorchTitan's flow: materialise on CPU, then `init_weights` under seed 0."""
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    scale = b.abs().max().item() or 1.0
    return (a - b).abs().max().item() / scale


def _full(local: torch.Tensor, mesh, placements, like: torch.Tensor) -> torch.Tensor:
    return DTensor.from_local(local, mesh, placements, shape=like.shape,
                              stride=like.stride()).full_tensor()


def run_case(name: str, plan, mesh) -> dict:
    """Every rank runs the parallel model and its collectives; the single-process reference is
    run, and compared, on rank 0 alone (the only rank whose figures are written): the others
    run it once, without gradients, for the output's shape."""
    import torch.distributed as dist

    lead = not dist.is_initialized() or dist.get_rank() == 0
    model, ref, inputs = build(name)
    model = apply_plan(model, plan, mesh, progress=lambda s: None)
    res: dict = {"init_equal": True}
    if name not in BLOCKS:
        init_titan(model)
        init_titan(ref)
    # a tied weight stays one Parameter: one name in named_parameters, the same object twice
    tying = getattr(getattr(model, "model_args", None), "enable_weight_tying", False)
    res["tied"] = (model.output.weight is model.tok_embeddings.weight) if tying else None
    res["parameters"] = [len(list(model.named_parameters())), len(list(ref.named_parameters()))]
    full_params = [p.full_tensor() for p in model.parameters()]  # a collective: every rank
    res["init_equal"] = lead and all(torch.equal(p, q) for p, q in zip(full_params, ref.parameters()))
    prog = model.autopar
    local_in = [local_slice(x, mesh, pl) for x, pl in zip(inputs, prog.input_placements)]
    model.eval()
    ref.eval()
    with torch.no_grad():  # inference on the same weights, before any step
        out = model(*local_in)
        r = ref(*inputs)
    res["eval_nograd_rel"] = _rel(_full(out, mesh, prog.output_placement, r), r)
    res["eval_requires_grad"] = out.requires_grad
    model.train()
    ref.train()
    shape_of = r  # the output's global shape, for gathering it on every rank
    weight = torch.randn(r.shape, generator=torch.Generator().manual_seed(2))
    local_weight = local_slice(weight, mesh, prog.output_placement)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    res.update(fwd_rel=[], grad_rel=[], worst_grad=[], loss=[], ref_loss=[])
    # a floating-point input gets its gradient (a pipeline stage sends it to the stage before)
    diff = [i for i, x in enumerate(inputs) if x.dtype.is_floating_point]
    for step in range(STEPS):
        grad_in = step == 0 and bool(diff)
        xs = [x.detach().requires_grad_(grad_in and i in diff) for i, x in enumerate(local_in)]
        rxs = [x.detach().requires_grad_(grad_in and i in diff) for i, x in enumerate(inputs)]
        out = model(*xs)
        (out * local_weight).sum().backward()
        full = _full(out, mesh, prog.output_placement, shape_of)
        grads = [p.grad.full_tensor() for p in model.parameters()]  # every rank
        in_grads = [_full(xs[i].grad, mesh, prog.input_placements[i], rxs[i])
                    for i in diff] if grad_in else []
        if lead:
            r = ref(*rxs)
            rl = (r * weight).sum()
            rl.backward()
            res["fwd_rel"].append(_rel(full, r.detach()))
            errs = {n: _rel(g, q.grad)
                    for (n, _), g, q in zip(model.named_parameters(), grads, ref.parameters())}
            worst = max(errs, key=errs.get)
            res["grad_rel"].append(errs[worst])
            res["worst_grad"].append(worst)
            res["loss"].append((full * weight).sum().item())
            res["ref_loss"].append(rl.item())
            if grad_in:
                res["input_grad_rel"] = max(_rel(g, rxs[i].grad) for g, i in zip(in_grads, diff))
        if step == 0:
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            res["grad_norm"] = norm.item()
            if lead:
                res["ref_grad_norm"] = torch.nn.utils.clip_grad_norm_(ref.parameters(), 1e9).item()
            res["dtensor_grads"] = all(isinstance(p.grad, DTensor) and
                                       p.grad.placements == p.placements
                                       for p in model.parameters())
        opt.step()
        opt.zero_grad()
        if lead:
            ropt.step()
            ropt.zero_grad()
    res["collectives"] = prog.collectives()
    res["mismatches"] = len(prog.local.mismatches)
    tagged = {n.name for n in prog.local.gm.graph.nodes if BLOCK_TAG in n.meta}
    res["recomputed_in_blocks"] = len(tagged & set(prog.split.recomputed))
    res["saved"] = len(prog.split.saved)
    return res


def parity_worker(rank: int, cases: list[tuple[str, str]], plan_dir: str, out_dir: str) -> None:
    """Every rank runs every case; rank 0 writes each case's figures as <model>-<kind>.json."""
    from torch.distributed.device_mesh import init_device_mesh

    from dist_harness import write_result
    from titan_autopar import Plan
    from titan_autopar.titan.cpu import apply_cpu_patches

    apply_cpu_patches(["histc_int", "moe_permutation"])  # TorchTitan's MoE routing on CPU
    meshes = {}
    for name, kind in cases:
        plan = Plan.load(f"{plan_dir}/{name}-{kind}.json")
        key = (tuple(plan.mesh_names), tuple(plan.data["mesh"]["shape"]))
        if key not in meshes:
            meshes[key] = init_device_mesh("cpu", key[1], mesh_dim_names=key[0])
        res = run_case(name, plan, meshes[key])
        if rank == 0:
            write_result(out_dir, f"{name}-{kind}", res)


def mixed_precision_worker(rank: int, plan_path: str, out_dir: str) -> None:
    """llama3 under a bf16 plan on 2 ranks against the single-process model run with its
    parameters cast to bf16 (what FSDP's param_dtype computes); rank 0 writes the figures."""
    from torch.distributed.device_mesh import init_device_mesh

    from dist_harness import write_result
    from titan_autopar import Plan

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp_shard",))
    model, ref, inputs = build("llama3")
    model = apply_plan(model, Plan.load(plan_path), mesh, progress=lambda s: None)
    init_titan(model)
    init_titan(ref)
    prog = model.autopar
    out = model(*[local_slice(x, mesh, pl) for x, pl in zip(inputs, prog.input_placements)])
    cast = {n: p.to(torch.bfloat16) for n, p in ref.named_parameters()}
    r = torch.func.functional_call(ref, {**cast, **dict(ref.named_buffers())}, inputs)
    weight = torch.randn(r.shape, generator=torch.Generator().manual_seed(2))
    (out.float() * local_slice(weight, mesh, prog.output_placement)).sum().backward()
    (r.float() * weight).sum().backward()
    products = [n for n in prog.split.forward.graph.nodes if n.target is torch.ops.aten.mm.default]
    fwd_rel = _rel(_full(out, mesh, prog.output_placement, r).float(), r.float())  # collectives:
    grad_rel = max(_rel(p.grad.full_tensor(), q.grad)                             # every rank
                   for p, q in zip(model.parameters(), ref.parameters()))
    if rank == 0:
        write_result(out_dir, "mixed_precision", {
            "output_dtype": str(out.dtype), "fwd_rel": fwd_rel, "grad_rel": grad_rel,
            "grad_dtypes": sorted({str(p.grad.dtype) for p in model.parameters()}),
            "matmul_dtypes": sorted({str(n.meta["val"].dtype) for n in products}),
        })
