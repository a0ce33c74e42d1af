"""TorchTitan's own trainer on CPU ranks with gloo: every CPU patch, and the torchrun entry point.

    torchrun --nproc_per_node=4 -m titan_autopar.titan.cpu --job.config_file X.toml [overrides]

applies the patches, registers the tiny dataset (`titan.data`), builds the tiny assets the job
names, then runs `torchtitan.train.main(Trainer)` on the same command line, and ends a rank that
trained with `os._exit(0)` (`_leave`). Nothing else in this
package patches torch or TorchTitan. `apply_cpu_patches` refuses to run where CUDA is available,
so none of this is ever active on a GPU run. Each patch is the smallest change that made
TorchTitan 0.2.2 / torch 2.13 train on CPU, and each was seen to be needed (see `PATCHES`).
"""

from __future__ import annotations

import importlib
import os
import platform
import resource
import sys
from types import SimpleNamespace

import torch

_MARK = "__titan_autopar_cpu__"


class _CpuDeviceModule:
    """torch.cpu plus the device-module calls TorchTitan makes that torch.cpu lacks."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    def current_device(self) -> int:  # barrier(device_ids=[current_device()]) needs an int
        return 0

    def get_device_name(self, device=None) -> str:
        return f"cpu ({platform.processor() or platform.machine()})"

    def get_device_properties(self, device=None):
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return SimpleNamespace(name=self.get_device_name(), total_memory=pages * page_size)

    def memory_stats(self, device=None) -> dict:
        # no allocator statistics on CPU: report the process's peak resident set (Linux: KiB)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {"active_bytes.all.peak": peak, "reserved_bytes.all.peak": peak,
                "num_alloc_retries": 0, "num_ooms": 0}

    def reset_peak_memory_stats(self, device=None) -> None:
        pass

    def empty_cache(self) -> None:
        pass


def _patch_device_type() -> None:
    """TorchTitan reads its device type once, at import: make it "cpu" (else "cuda", set_device
    dies), with `_CpuDeviceModule` as its device module. torch itself is left as it was."""
    loaded = sys.modules.get("torchtitan.tools.utils")
    if loaded is not None:
        if loaded.device_type != "cpu":
            raise RuntimeError(
                "torchtitan was imported before apply_cpu_patches(), so it already chose device "
                f"type {loaded.device_type!r}: call apply_cpu_patches() before importing "
                "torchtitan (python -m titan_autopar.titan.cpu does)")
        return
    cpu_module = _CpuDeviceModule()
    get_type, get_module = torch._utils._get_available_device_type, torch._utils._get_device_module
    torch._utils._get_available_device_type = lambda: "cpu"
    torch._utils._get_device_module = (
        lambda device_type: cpu_module if device_type == "cpu" else get_module(device_type))
    try:  # torchtitan.tools.utils keeps the names it imported; torch gets its own back
        importlib.import_module("torchtitan.tools.utils")
    finally:
        torch._utils._get_available_device_type, torch._utils._get_device_module = (
            get_type, get_module)


def _patch_fsdp_sum_reduction() -> None:
    """gloo has no AVG/PREMUL_SUM; torchtitan's FSDP2 set-up makes reduce-scatter use them, so
    CPU gradients reduce with SUM and divide afterwards (FSDP2's own force-sum path)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll

    orig = coll._get_gradient_divide_factors
    if getattr(orig, _MARK, False):
        return

    def divide_factors(rs_group, ar_group, reduce_dtype, device_type="", factor=None,
                       force_sum_reduction_for_comms=False):
        force = force_sum_reduction_for_comms or device_type == "cpu"
        return orig(rs_group, ar_group, reduce_dtype, device_type, factor, force)

    setattr(divide_factors, _MARK, True)
    coll._get_gradient_divide_factors = divide_factors


def _patch_histc_int() -> None:
    """MoE routing counts tokens per expert with torch.histc on int64, which has no CPU kernel:
    count in float32 and return the input's dtype (integer CPU inputs only, which raised)."""
    orig = torch.histc
    if getattr(orig, _MARK, False):
        return

    def histc(input, bins=100, min=0, max=0, *, out=None):
        if out is None and input.device.type == "cpu" and not input.is_floating_point():
            return orig(input.float(), bins=bins, min=min, max=max).to(input.dtype)
        return orig(input, bins=bins, min=min, max=max, out=out)

    setattr(histc, _MARK, True)
    torch.histc = histc


def _patch_moe_permutation() -> None:
    """MoE token permutation always launches a triton GPU kernel; torchtitan ships a CPU version
    behind `use_cpu=True`: take it for CPU tensors."""
    moe_utils = importlib.import_module("torchtitan.models.moe.utils")
    orig = moe_utils.generate_permute_indices
    if getattr(orig, _MARK, False):
        return

    def generate_permute_indices(tokens_per_expert_group, *args, use_cpu=False, **kwargs):
        use_cpu = use_cpu or tokens_per_expert_group.device.type == "cpu"
        return orig(tokens_per_expert_group, *args, use_cpu=use_cpu, **kwargs)

    setattr(generate_permute_indices, _MARK, True)
    moe_utils.generate_permute_indices = generate_permute_indices


def _patch_cp_cpu_attention() -> None:
    """TorchTitan's CP recipe routes attention on sequence-sharded DTensors to torch's ring
    attention, which knows the GPU kernels only (flash, efficient, cudnn); on CPU, SDPA runs
    `_scaled_dot_product_flash_attention_for_cpu`. Hand the CPU kernel (forward and backward)
    to the same templated ring, with its own argument names, while TorchTitan's CP dispatcher
    is on. Under auto = true nothing here runs: the plan's ring is titan_autopar's own."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp

    aten = torch.ops.aten
    fwd = aten._scaled_dot_product_flash_attention_for_cpu.default
    bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
    if fwd in cp.custom_ops:
        return

    def arg(args, kwargs, i, name, default):
        return args[i] if len(args) > i else kwargs.get(name, default)

    def wrap(local, like, shape):
        stride = torch.empty(shape, device="meta").stride()
        return DTensor.from_local(local, like.device_mesh, like.placements, run_check=False,
                                  shape=torch.Size(shape), stride=stride)

    def forward(op_call, args, kwargs):
        q, k, v = args[:3]
        out, lse, *_ = cp._templated_ring_attention(
            q.device_mesh.get_group(), 2, fwd, query=q.to_local(), key=k.to_local(),
            value=v.to_local(), is_causal=arg(args, kwargs, 4, "is_causal", False),
            dropout_p=arg(args, kwargs, 3, "dropout_p", 0.0), scale=kwargs.get("scale"))
        return (wrap(out, q, (*q.shape[:-1], v.shape[-1])), wrap(lse, q, tuple(q.shape[:-1])))

    def backward(op_call, args, kwargs):
        grad, q, k, v, out, lse = args[:6]
        dq, dk, dv, *_ = cp._templated_ring_attention_backward(
            q.device_mesh.get_group(), 2, bwd, grad_out=grad.to_local(), grad_out_name="grad_out",
            query=q.to_local(), key=k.to_local(), value=v.to_local(), out=out.to_local(),
            logsumexp=lse.to_local(), is_causal=arg(args, kwargs, 7, "is_causal", False),
            dropout_p=arg(args, kwargs, 6, "dropout_p", 0.0), scale=kwargs.get("scale"))
        return (wrap(dq, q, tuple(q.shape)), wrap(dk, k, tuple(k.shape)),
                wrap(dv, v, tuple(v.shape)))

    cp.custom_ops[fwd] = forward  # merged into DTensor's handlers when CP is enabled
    cp.custom_ops[bwd] = backward


def _patch_profiler_activities() -> None:
    """TorchTitan's `[profiling] enable_profiling` asks torch's profiler for CPU and the GPU's
    activity, which is None without a GPU; drop the None so that CPU ranks write their traces."""
    import torchtitan.tools.profiling as titan_profiling

    profile = torch.profiler.profile
    if getattr(titan_profiling.torch.profiler, _MARK, False):
        return

    class _CpuProfile(profile):
        def __init__(self, *args, activities=None, **kwargs):
            if activities is not None:
                activities = [a for a in activities if a is not None]
            super().__init__(*args, activities=activities, **kwargs)

    class _TorchSeenByProfiling:  # torch, with the profiler above: only that module sees it
        profiler = SimpleNamespace(profile=_CpuProfile, schedule=torch.profiler.schedule,
                                   ProfilerActivity=torch.profiler.ProfilerActivity,
                                   **{_MARK: True})

        def __getattr__(self, name):
            return getattr(torch, name)

    titan_profiling.torch = _TorchSeenByProfiling()


# name -> patch, with what a 4-rank run does without it. The device type goes first: torchtitan
# fixes its device type when first imported (moe_permutation imports it).
PATCHES = {
    # AttributeError: module 'torch._C' has no attribute '_cuda_setDevice' (Trainer.__init__)
    "device_type": _patch_device_type,
    # RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo (first backward)
    "fsdp_sum_reduction": _patch_fsdp_sum_reduction,
    # NotImplementedError: "histogram_cpu" not implemented for 'Long' (any MoE model)
    "histc_int": _patch_histc_int,
    # RuntimeError: 0 active drivers (triton; MoE with expert_parallel_degree > 1 only)
    "moe_permutation": _patch_moe_permutation,
    # NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default
    # does not have a sharding strategy registered (the recipe with context_parallel_degree > 1)
    "cp_cpu_attention": _patch_cp_cpu_attention,
    # TypeError: Expected ProfilerActivity or dict, got <class 'NoneType'> ([profiling]
    # enable_profiling = true)
    "profiler_activities": _patch_profiler_activities,
}


def apply_cpu_patches(names=None) -> None:
    """Apply the CPU patches (all, or those in `names`); idempotent. Refuses where CUDA is
    available: a GPU run must use TorchTitan unpatched."""
    if torch.cuda.is_available():
        raise RuntimeError(
            "CUDA is available: refusing to apply titan_autopar's CPU patches. Run "
            "`torchrun -m torchtitan.train` directly on GPUs.")
    names = list(PATCHES) if names is None else list(names)
    unknown = [n for n in names if n not in PATCHES]
    if unknown:
        raise ValueError(f"unknown CPU patch(es) {unknown}; known: {', '.join(PATCHES)}")
    for name in PATCHES:  # in PATCHES' order, whatever the order of `names`
        if name in names:
            PATCHES[name]()


def main() -> None:
    """Entry point: patch, register the tiny dataset, build its assets, run TorchTitan's trainer
    on `sys.argv[1:]` (TorchTitan's config manager reads the command line itself). A config or
    plan error (a ValueError: it says what to change) ends the rank with that message and exit
    code 2, not a traceback; TITAN_AUTOPAR_TRACEBACK=1 shows the traceback too. A rank whose
    training finished leaves through `_leave`."""
    apply_cpu_patches()
    from titan_autopar.titan.data import prepare_job_assets, register_dataset
    from titan_autopar.titan.job_parse import parse_job

    try:
        register_dataset()
        config = parse_job(sys.argv[1:])  # the file's keys, TorchTitan's parse, every value
        prepare_job_assets(config)
        import torchtitan.train

        torchtitan.train.main(torchtitan.train.Trainer)
    except ValueError as e:
        if os.environ.get("TITAN_AUTOPAR_TRACEBACK"):
            raise
        print(f"titan_autopar: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    _leave()


def _leave() -> None:
    """End a rank whose training finished without the interpreter's teardown. TorchTitan's main
    has closed the trainer (checkpointer, metrics) and destroyed the process group, but device
    meshes keep gloo's process group alive, and freeing it in the teardown can race its
    threads and abort a rank whose work is done ("terminate called without an active
    exception"), which fails the whole torchrun: seen in the test harness, which ends its ranks
    the same way (tests/dist_harness.py). Two of 72 trainer runs of benchmarks/fidelity.py (one
    of them the plain FSDP recipe) aborted with "Fatal Python error: Aborted"; fidelity keeps
    each run's log, to tell whether such an abort came at exit."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
