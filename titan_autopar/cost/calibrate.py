"""Measure the machine a job runs on, on the job's own ranks, and fit the cost model's figures.

`calibrate(mesh_shape, device)` runs on every rank of an initialised process group (gloo on CPU,
NCCL on CUDA) at once, so each figure is what a rank gets while the others work too (on a CPU
the ranks share cores and memory). Every timing is the slowest rank's, the median of a few
trials. What it measures and what each becomes in `Hardware`:

  matmul       mm at three shape classes per dtype; t = floor + flops / rate fitted by least
               squares -> peak_fp32_flops, peak_bf16_flops (compute_efficiency = 1)
  attention    causal scaled_dot_product_attention forward+backward at three shapes, FLOPs
               counted as `cost/compute.py` counts them; t = floor + flops / rate ->
               attention_flops, attention_floor
  loss         cross-entropy over logits, forward and backward, as TorchTitan's trainer
               computes its loss -> loss_time_per_element
  memory       c = a + b on large tensors (3 x bytes moved) -> hbm_bandwidth
  launch       a one-element add, many times -> launch_overhead (the per-op floor)
  optimizer    AdamW (foreach) step and gradient-norm clipping on DTensor parameters, few
               large and many small -> optimizer_time_per_element, optimizer_time_per_tensor
  collectives  all_gather, reduce_scatter, all_reduce and all_to_all on each mesh dim's group
               over four message sizes; t = latency + bytes x seconds-per-byte fitted per
               (kind, group size) -> collective_fits, and intra/inter_node_* from all_gather
  in a step    a small block stack alone, under FSDP2 on one rank, under FSDP2 on all ranks
               (`cost/calibrate_step.py`) -> collective_step_overhead (seconds per collective
               call beyond its curve), fsdp_group_overhead (FSDP2's runtime per group), and
               under tensor parallelism on one rank -> tp_linear_overhead (DTensor's runtime
               per tensor-parallel linear)
  overlap      an all_reduce issued before a matmul and waited for after it, against the two
               apart -> overlap_efficiency (the share of the shorter one hidden, at most the
               share a small FSDP2 step hid; one rank has no collective to hide, and keeps the
               default)
  layer        one transformer layer's forward+backward (`cost/layer_check.py`), timed and
               priced node by node with the figures above -> compute_scale (measured / priced)
  shared link  all_reduces on two mesh dims at once against one after the other -> recorded
               (measurements.shared_link), not yet priced

`main` is the torchrun entry (`titan-autopar calibrate` launches it); rank 0 writes the profile
through `cost/profile.py`.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import replace

import torch
import torch.distributed as dist

from titan_autopar.cost.calibrate_step import measure_step
from titan_autopar.cost.hardware import Hardware
from titan_autopar.cost.profile import (COLLECTIVES, is_profile_file, round2, this_machine,
                                        write_profile)
from titan_autopar.cost.timing import ALL_GATHER, REDUCE_SCATTER, timed
from titan_autopar.files import check_out_file

SIZES = {"cpu": {"mm": [(256, 256, 256), (512, 256, 768), (512, 512, 1024)],
                 "mm_bf16": [(64, 64, 64), (128, 64, 128), (128, 128, 256)],  # slow on CPUs
                 "attn": [(4, 16, 128, 16), (2, 16, 256, 16), (2, 8, 512, 32)],
                 "loss": [(512, 2048), (1024, 4096)],
                 "mem": 8 << 20, "msg": [16 << 10, 128 << 10, 1 << 20, 4 << 20]},
         "cuda": {"mm": [(2048, 2048, 2048), (8192, 4096, 4096), (8192, 4096, 14336)],
                  "mm_bf16": [(2048, 2048, 2048), (8192, 4096, 4096), (8192, 4096, 14336)],
                  "attn": [(1, 32, 4096, 128), (1, 32, 8192, 128)],
                  "loss": [(8192, 32768), (8192, 65536)],
                  "mem": 256 << 20, "msg": [1 << 20, 16 << 20, 64 << 20, 256 << 20]}}


def fit_line(xs, ts) -> tuple[float, float]:
    """Least-squares t = a + b x with a, b >= 0."""
    n = len(xs)
    mx, mt = sum(xs) / n, sum(ts) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (t - mt) for x, t in zip(xs, ts)) / sxx if sxx else 0.0
    if b <= 0:
        b = max(mt / mx, 1e-30) if mx else 1e-30
        return 0.0, b
    a = mt - b * mx
    if a < 0:  # through the origin
        b = sum(x * t for x, t in zip(xs, ts)) / sum(x * x for x in xs)
        a = 0.0
    return a, b


def _matmul(device, dtype, shapes):
    pts = []
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        t = timed(lambda: torch.mm(a, b), device)
        pts.append({"shape": [m, k, n], "flops": 2.0 * m * k * n, "seconds": t})
    _, spf = fit_line([p["flops"] for p in pts], [p["seconds"] for p in pts])
    return 1.0 / spf, pts


def _attention(device, dtype, shapes):
    import torch.nn.functional as F

    pts = []
    for b, h, s, d in shapes:
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        g = torch.randn(b, h, s, d, device=device, dtype=dtype)

        def step():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            torch.autograd.grad(o, (q, k, v), g)
        flops = 4.0 * b * h * s * s * d / 2 * (1 + 2.5)  # forward + backward, causal
        pts.append({"shape": [b, h, s, d], "flops": flops, "seconds": timed(step, device)})
    floor, spf = fit_line([p["flops"] for p in pts], [p["seconds"] for p in pts])
    return 1.0 / spf, floor, pts


def _loss(device, dtype, shapes):
    """Cross-entropy over [tokens, vocab] logits, forward and backward, as TorchTitan's trainer
    computes its loss on the model's output: seconds per logit element."""
    pts = []
    for n, v in shapes:
        logits = torch.randn(n, v, device=device, dtype=dtype, requires_grad=True)
        labels = torch.randint(0, v, (n,), device=device)

        def step():
            torch.nn.functional.cross_entropy(logits.float(), labels).backward()
        pts.append({"shape": [n, v], "elements": n * v, "seconds": timed(step, device)})
    per = sum(p["elements"] * p["seconds"] for p in pts) / sum(p["elements"] ** 2 for p in pts)
    return per, pts


def _memory(device, nbytes):
    n = nbytes // 4
    a, b, c = (torch.ones(n, device=device) for _ in range(3))
    t = timed(lambda: torch.add(a, b, out=c), device, reps=5)
    return 3 * n * 4 / t, {"bytes_moved": 3 * n * 4, "seconds": t}


def _launch(device):
    a, b, c = (torch.ones(1, device=device) for _ in range(3))
    reps = 2000

    def many():
        for _ in range(reps):
            torch.add(a, b, out=c)
    return timed(many, device, reps=1) / reps


def _optimizer(device, nbytes):
    """AdamW (foreach, as TorchTitan's configs) and clip_grad_norm_ on DTensor parameters sharded
    over every rank, as both TorchTitan's recipes and auto's plans hold them: 8 large tensors,
    then 64 small ones. Each tensor costs DTensor dispatch and a foreach slot, each element its
    arithmetic: t = per tensor x tensors + per element x local elements, solved from the two."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    world = dist.get_world_size()
    mesh = init_device_mesh(device, (world,))
    pts = []
    for count, numel in ((8, nbytes // 4 // 8), (64, 1024 * world)):
        numel = max(world, numel // world * world)
        ps = []
        for _ in range(count):
            p = torch.nn.Parameter(distribute_tensor(torch.randn(numel, device=device), mesh, [Shard(0)]))
            p.grad = distribute_tensor(torch.randn(numel, device=device), mesh, [Shard(0)])
            ps.append(p)
        opt = torch.optim.AdamW(ps, lr=1e-4, foreach=True)

        def step():
            torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=True)
            opt.step()
        pts.append({"tensors": count, "local_elements": count * numel // world,
                    "seconds": timed(step, device)})
    (n1, e1, t1), (n2, e2, t2) = ((p["tensors"], p["local_elements"], p["seconds"]) for p in pts)
    per_element = max(0.0, (t1 * n2 - t2 * n1) / (e1 * n2 - e2 * n1))
    per_tensor = max(0.0, (t2 - per_element * e2) / n2)
    return per_element, per_tensor, pts


def _collective(kind, group, k, nbytes, device):
    n = max(k, nbytes // 4 // k * k)
    if kind == "all_gather":
        inp, out = torch.ones(n // k, device=device), torch.empty(n, device=device)
        fn = lambda: ALL_GATHER(out, inp, group=group)  # noqa: E731
    elif kind == "reduce_scatter":
        inp, out = torch.ones(n, device=device), torch.empty(n // k, device=device)
        fn = lambda: REDUCE_SCATTER(out, inp, group=group)  # noqa: E731
    elif kind == "all_reduce":
        buf = torch.ones(n, device=device)
        fn = lambda: dist.all_reduce(buf, group=group)  # noqa: E731
    else:  # all_to_all of a tensor whose full size is n, each rank holding n / k
        inp, out = torch.ones(n // k, device=device), torch.empty(n // k, device=device)
        fn = lambda: dist.all_to_all_single(out, inp, group=group)  # noqa: E731
    return n * 4, timed(fn, device, group=group)


def _overlap(device, group, nbytes, shape):
    buf = torch.ones(nbytes // 4, device=device)
    a = torch.randn(shape[0], shape[1], device=device)
    b = torch.randn(shape[1], shape[2], device=device)
    t_comm = timed(lambda: dist.all_reduce(buf, group=group), device)
    t_comp = timed(lambda: torch.mm(a, b), device)

    def both():
        w = dist.all_reduce(buf, group=group, async_op=True)
        torch.mm(a, b)
        w.wait()
    t_both = timed(both, device)
    hidden = max(0.0, t_comm + t_comp - t_both) / min(t_comm, t_comp)
    return min(1.0, hidden), {"comm_s": t_comm, "compute_s": t_comp, "both_s": t_both}


def _shared_link(device, g0, g1, nbytes):
    b0, b1 = torch.ones(nbytes // 4, device=device), torch.ones(nbytes // 4, device=device)
    t0 = timed(lambda: dist.all_reduce(b0, group=g0), device)
    t1 = timed(lambda: dist.all_reduce(b1, group=g1), device)

    def both():
        w0 = dist.all_reduce(b0, group=g0, async_op=True)
        w1 = dist.all_reduce(b1, group=g1, async_op=True)
        w0.wait()
        w1.wait()
    tb = timed(both, device)
    # 1.0: the two dims take turns on one link; max/sum: they run side by side
    return {"dim0_s": t0, "dim1_s": t1, "together_s": tb, "together_over_sum": tb / (t0 + t1)}


def calibrate(mesh_shape: tuple[int, ...], device: str, say=None) -> tuple[Hardware, dict]:
    """Every rank calls this at once; returns the fitted Hardware and the raw points."""
    from torch.distributed.device_mesh import init_device_mesh

    say = say or (lambda s: None)
    sz = SIZES["cuda" if device == "cuda" else "cpu"]
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    meas: dict = {}
    say("matmul fp32 and bf16")
    fp32, meas["matmul_float32"] = _matmul(device, torch.float32, sz["mm"])
    bf16, meas["matmul_bfloat16"] = _matmul(device, torch.bfloat16, sz["mm_bf16"])
    say("attention")
    train_dtype = torch.float32 if device != "cuda" else torch.bfloat16
    attn, attn_floor, meas["attention_float32"] = _attention(device, train_dtype, sz["attn"])
    say("the loss")
    loss, meas["loss"] = _loss(device, train_dtype, sz["loss"])
    say("memory bandwidth and the per-op floor")
    bw, meas["memory"] = _memory(device, sz["mem"])
    launch = _launch(device)
    meas["launch_s"] = launch
    say("optimizer step")
    opt, opt_tensor, meas["optimizer"] = _optimizer(device, sz["mem"])
    fits, meas["collectives"] = [], {}
    mesh = init_device_mesh(device, tuple(mesh_shape)) if len(mesh_shape) > 1 else None
    groups = {world: dist.group.WORLD} if world > 1 else {}
    for d, k in enumerate(mesh_shape):
        if k > 1 and k not in groups:
            groups[k] = mesh.get_group(d) if mesh is not None else dist.group.WORLD
    for k, g in sorted(groups.items()):
        say(f"collectives on groups of {k}")
        for kind in COLLECTIVES:
            pts = [_collective(kind, g, k, m, device) for m in sz["msg"]]
            lat, spb = fit_line([b for b, _ in pts], [t for _, t in pts])
            fits.append((kind, k, round2(lat), round2(spb)))
            meas["collectives"][f"{kind}/{k}"] = [{"bytes": b, "seconds": t} for b, t in pts]
    ov = Hardware.overlap_efficiency  # one rank has no collective to hide: keep the default
    if world > 1:
        say("overlap of a collective with compute")
        ov, meas["overlap"] = _overlap(device, dist.group.WORLD, sz["msg"][-1], sz["mm"][-1])
    if mesh is not None and len(mesh_shape) >= 2 and min(mesh_shape[:2]) > 1:
        meas["shared_link"] = _shared_link(device, mesh.get_group(0), mesh.get_group(1),
                                           sz["msg"][-1])
    say("a small training step: alone, under FSDP2 on one rank, on all ranks")

    in_step, fsdp_group, tp_linear, meas["collectives_in_step"] = measure_step(
        device, {(kind, k): (lat, spb) for kind, k, lat, spb in fits})
    if "hidden_share" in meas["collectives_in_step"]:  # what a step hid caps what one pair did
        ov = min(ov, meas["collectives_in_step"]["hidden_share"])
    ag = [f for f in fits if f[0] == "all_gather"]
    big = max(ag, key=lambda f: f[1]) if ag else None
    link_bw = ((big[1] - 1) / big[1] / big[3]) if big and big[3] else bw
    link_lat = (big[2] / max(1, math.ceil(math.log2(big[1])))) if big else 0.0
    if device == "cuda":
        mem_bytes = torch.cuda.get_device_properties(0).total_memory
    else:
        mem_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / max(1, local)
    hw = Hardware(
        name="", peak_bf16_flops=round2(bf16), peak_fp32_flops=round2(fp32),
        hbm_bandwidth=round2(bw), hbm_bytes=round2(mem_bytes), gpus_per_node=local,
        intra_node_bandwidth=round2(link_bw), inter_node_bandwidth=round2(link_bw),
        intra_node_latency=round2(link_lat), inter_node_latency=round2(link_lat),
        compute_efficiency=1.0, launch_overhead=round2(launch), overlap_efficiency=round2(ov),
        attention_flops=round2(attn), attention_floor=round2(attn_floor),
        loss_time_per_element=round2(loss), optimizer_time_per_element=round2(opt),
        optimizer_time_per_tensor=round2(opt_tensor), collective_step_overhead=round2(in_step),
        fsdp_group_overhead=round2(fsdp_group), tp_linear_overhead=round2(tp_linear),
        collective_fits=tuple(sorted(fits)))
    say("a whole transformer layer, timed against its priced ops")
    from titan_autopar.cost.layer_check import LAYER, whole_layer

    layer = whole_layer(device, train_dtype, LAYER["cuda" if device == "cuda" else "cpu"],
                        {"priced": hw}, timed)
    meas["layer"] = layer
    hw = replace(hw, compute_scale=round2(layer["measured_s"] / layer["priced_s"]))
    return hw, meas


def profile_name(device: str, backend: str, world: int, threads: int) -> str:
    return f"{device}-{backend}-{world}x{threads}t" if device != "cuda" else f"cuda-{backend}-{world}"


def calibrate_and_write(out, mesh_shape, device: str, say=None):
    """Calibrate on every rank; rank 0 writes the profile. Returns the Hardware."""
    on = this_machine(device)
    hw, meas = calibrate(mesh_shape, device, say)
    name = profile_name(device, on["backend"], on["world_size"], on["threads"])
    hw = replace(hw, name=name)
    if dist.get_rank() == 0:
        on["date"] = time.strftime("%Y-%m-%d")
        write_profile(out, name, on, hw, meas)
    dist.barrier()
    return hw


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m titan_autopar.cost.calibrate")
    ap.add_argument("--out", required=True)
    ap.add_argument("--mesh", default="", help="sizes of the mesh dims to measure, e.g. 2,2")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--force", action="store_true",
                    help="replace --out even if it exists and is not a hardware profile")
    a = ap.parse_args(argv)
    try:  # before any rank measures anything
        check_out_file(a.out, label=f"--out {a.out}", what="a hardware profile",
                       ours=is_profile_file, force=a.force, example="profile.json")
    except ValueError as e:
        raise SystemExit(f"{ap.prog}: {e}") from None
    backend = "nccl" if a.device == "cuda" else "gloo"
    if a.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        dist.init_process_group(backend, device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group(backend)
    world = dist.get_world_size()
    shape = tuple(int(x) for x in a.mesh.split(",")) if a.mesh else (world,)
    if math.prod(shape) != world:
        raise SystemExit(f"--mesh {a.mesh} has {math.prod(shape)} ranks, not {world}")
    me = dist.get_rank()
    t0 = time.perf_counter()
    say = (lambda s: print(f"[calibrate {time.perf_counter() - t0:5.1f}s] {s}", flush=True)) \
        if me == 0 else None
    hw = calibrate_and_write(a.out, shape, a.device, say)
    if me == 0:
        print(f"[calibrate] wrote {a.out}: {hw.name}, matmul fp32 {hw.peak_fp32_flops / 1e9:.3g} "
              f"GFLOP/s, bf16 {hw.peak_bf16_flops / 1e9:.3g} GFLOP/s per rank, memory "
              f"{hw.hbm_bandwidth / 1e9:.3g} GB/s, per-op floor {hw.launch_overhead * 1e6:.3g} us, "
              f"overlap {hw.overlap_efficiency:.2g}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
