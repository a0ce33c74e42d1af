"""Hardware presets and the precision the priced training step runs in.

Owns `Hardware` (peak FLOP/s, HBM bandwidth and capacity, GPUs per node, intra- and inter-node
link bandwidth and latency, how much of compute a collective can hide behind, and, when measured,
attention FLOP/s, the optimizer's cost per element and per tensor, fitted collective curves and
what a collective costs inside a training step beyond its curve) and `get_hardware`, which accepts a preset name, a
hardware profile file (`cost/profile.py`, written by `titan-autopar calibrate`) or a `Hardware`.
Figures are per GPU (per rank) and dense (no sparsity).

Which peak prices which dtype: a matmul whose elements take 2 bytes or less (bf16, fp16) is
priced at `peak_bf16_flops`, anything wider (fp32) at `peak_fp32_flops`; both are dense figures,
and for the GPU presets the fp32 one is the plain (non-TF32) CUDA-core peak. A measured profile
sets `compute_efficiency` to 1 and the peaks to the fitted matmul rates of its machine.
"""

from __future__ import annotations

import math
import os
from dataclasses import MISSING, asdict, dataclass, field, fields

GiB = 1024**3


@dataclass(frozen=True)
class Range:
    """The values a figure may take: from `low` (excluded where `low_open`) to `high`."""
    low: float = 0.0
    high: float = math.inf
    low_open: bool = False
    whole: bool = False

    def holds(self, v) -> bool:
        return (math.isfinite(v) and (v > self.low if self.low_open else v >= self.low)
                and v <= self.high and (not self.whole or float(v).is_integer()))

    def __str__(self) -> str:
        kind = "a whole number" if self.whole else "a number"
        text = f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        return text + (f" and <= {self.high:g}" if math.isfinite(self.high) else "")


ABOVE_0 = Range(low_open=True)
AT_LEAST_0 = Range()


def _figure(default=MISSING, within: Range = AT_LEAST_0):
    """A figure's field, its range beside it (`Hardware.problem` reads it)."""
    return field(default=default, metadata={"range": within})


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_bf16_flops: float = _figure(within=ABOVE_0)  # dense tensor-core FLOP/s
    peak_fp32_flops: float = _figure(within=ABOVE_0)
    hbm_bandwidth: float = _figure(within=ABOVE_0)  # bytes/s
    hbm_bytes: float = _figure(within=ABOVE_0)  # capacity per GPU
    gpus_per_node: int = _figure(within=Range(1, whole=True))
    # bytes/s per GPU as a collective sees it (NVLink bus bandwidth)
    intra_node_bandwidth: float = _figure(within=ABOVE_0)
    inter_node_bandwidth: float = _figure(within=ABOVE_0)  # bytes/s per GPU (one NIC per GPU)
    intra_node_latency: float = _figure()  # seconds per collective step
    inter_node_latency: float = _figure()
    # fraction of peak a large matmul reaches
    compute_efficiency: float = _figure(0.7, Range(0, 1, low_open=True))
    launch_overhead: float = _figure(5e-6)  # seconds per kernel that does work
    # fraction of compute time parameter collectives can hide behind
    overlap_efficiency: float = _figure(0.9, Range(0, 1))
    attention_flops: float = _figure(0.0)  # measured attention FLOP/s (0: priced as a matmul)
    # a whole transformer layer's measured time over the sum of its ops' prices (cost/layer_check.py):
    # multiplies every op's price; 1 (the presets): not measured
    compute_scale: float = _figure(1.0, ABOVE_0)
    # measured seconds per attention call (forward and backward together) beyond its FLOPs at
    # attention_flops: the fit's intercept, shared 1 : 2.5 between forward and backward
    attention_floor: float = _figure(0.0)
    # seconds per element of the model's output of the trainer's loss (cross-entropy, forward and
    # backward), as measured; 0 (the GPU presets): not priced
    loss_time_per_element: float = _figure(0.0)
    # seconds per parameter element of one rank's optimizer step (AdamW, foreach) and gradient
    # clipping, as measured; 0 (the GPU presets): not priced
    optimizer_time_per_element: float = _figure(0.0)
    optimizer_time_per_tensor: float = _figure(0.0)  # seconds per parameter tensor of the same step
    # seconds each collective call costs inside a training step beyond its clean measured time
    # (ranks arriving apart, compute and communication sharing cores: `cost/calibrate_step.py`);
    # priced as part of a collective's latency; 0 (the GPU presets): not priced
    collective_step_overhead: float = _figure(0.0)
    # seconds per FSDP2 parameter group per step of TorchTitan's recipes' runtime (hooks, copies
    # into and out of the gathered buffers), beyond compute and collectives: measured; prices the
    # recipes only (auto's plans run their own program); 0 (the GPU presets): not priced
    fsdp_group_overhead: float = _figure(0.0)
    # seconds per tensor-parallel linear per step of DTensor's runtime under TorchTitan's TP plans
    # (forward and backward), beyond compute and collectives: measured; prices the fsdp_tp recipe
    # only, once per matrix of the model; 0 (the GPU presets): not priced
    tp_linear_overhead: float = _figure(0.0)
    # measured collective curves: (kind, group size, latency s, seconds per byte of the tensor
    # as the collective sees it); a (kind, size) pair listed here replaces the formula
    collective_fits: tuple = ()
    profile: str = ""  # the profile file this came from and its machine's fingerprint

    @staticmethod
    def problem(name: str, value) -> str | None:
        """None when `value` is in figure `name`'s range, else "must be <range>, found <value>"."""
        within = next(f.metadata["range"] for f in fields(Hardware) if f.name == name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not within.holds(value):
            return f"must be {within}, found {value!r}"
        return None

    @staticmethod
    def figures() -> tuple[str, ...]:
        """The fields that carry a range: every number of the cost model."""
        return tuple(f.name for f in fields(Hardware) if "range" in f.metadata)

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def optimizer_seconds(self) -> float:
        """One rank's optimizer step and gradient clipping, per local parameter element: priced
        where measured (profiles, the cpu preset). On a GPU it is a few ms of a step of
        hundreds, and pricing it in every program made some MoE programs on 4-D meshes far
        slower to solve (qwen3 debug on 2x2x2x2: 28 s without, over 600 s with)."""
        return self.optimizer_time_per_element


PRESETS: dict[str, Hardware] = {
    "h100": Hardware(
        name="h100",
        peak_bf16_flops=989e12,
        peak_fp32_flops=67e12,
        hbm_bandwidth=3.35e12,
        hbm_bytes=80 * GiB,
        gpus_per_node=8,
        intra_node_bandwidth=360e9,
        inter_node_bandwidth=50e9,
        intra_node_latency=4e-6,
        inter_node_latency=12e-6,
    ),
    "h200": Hardware(
        name="h200",
        peak_bf16_flops=989e12,
        peak_fp32_flops=67e12,
        hbm_bandwidth=4.8e12,
        hbm_bytes=141e9,
        gpus_per_node=8,
        intra_node_bandwidth=360e9,
        inter_node_bandwidth=50e9,
        intra_node_latency=4e-6,
        inter_node_latency=12e-6,
    ),
    "a100": Hardware(
        name="a100",
        peak_bf16_flops=312e12,
        peak_fp32_flops=19.5e12,
        hbm_bandwidth=2.04e12,
        hbm_bytes=80 * GiB,
        gpus_per_node=8,
        intra_node_bandwidth=240e9,
        inter_node_bandwidth=25e9,
        intra_node_latency=5e-6,
        inter_node_latency=15e-6,
    ),
    "b200": Hardware(
        name="b200",
        peak_bf16_flops=2250e12,
        peak_fp32_flops=75e12,
        hbm_bandwidth=8.0e12,
        hbm_bytes=180e9,
        gpus_per_node=8,
        intra_node_bandwidth=720e9,
        inter_node_bandwidth=50e9,
        intra_node_latency=3e-6,
        inter_node_latency=10e-6,
    ),
    # CPU ranks over gloo, one thread each, four ranks on two cores: rounded from
    # `titan-autopar calibrate --nproc 4` on the development machines; the fallback where no
    # profile of the machine itself is at hand (calibrate it: `hardware = "calibrate"`)
    "cpu": Hardware(
        name="cpu",
        peak_bf16_flops=0.6e9,
        peak_fp32_flops=30e9,
        hbm_bandwidth=5e9,
        hbm_bytes=6e9,
        gpus_per_node=4,
        intra_node_bandwidth=0.5e9,
        inter_node_bandwidth=0.5e9,
        intra_node_latency=1.5e-3,
        inter_node_latency=1.5e-3,
        compute_efficiency=1.0,
        launch_overhead=4.3e-6,
        overlap_efficiency=0.0,
        attention_flops=9e9,
        attention_floor=5e-3,
        loss_time_per_element=9e-9,
        optimizer_time_per_element=1.8e-8,
        optimizer_time_per_tensor=2.5e-4,
        collective_step_overhead=5e-3,
        fsdp_group_overhead=7.5e-3,
        tp_linear_overhead=2e-3,
    ),
}


def is_profile_path(hw) -> bool:
    """A hardware name that names a file (a profile) rather than a preset."""
    s = str(hw)
    return s.endswith(".json") or "/" in s or os.sep in s


def check_figures(hw: Hardware) -> Hardware:
    """`hw` if every figure is in its range, else a ValueError naming the first that is not."""
    for name in Hardware.figures():
        problem = Hardware.problem(name, getattr(hw, name))
        if problem:
            raise ValueError(f"hardware {hw.name!r}: {name} {problem}: give every figure in its "
                             "range (see titan_autopar.cost.hardware.Hardware)")
    return hw


def get_hardware(hw: str | Hardware) -> Hardware:
    if isinstance(hw, Hardware):
        return check_figures(hw)
    if is_profile_path(hw):
        from titan_autopar.cost.profile import hardware_from_profile

        return hardware_from_profile(hw)
    key = str(hw).lower()
    if key not in PRESETS:
        raise ValueError(
            f"unknown hardware preset {hw!r}: use one of {', '.join(sorted(PRESETS))}, a "
            "profile file written by `titan-autopar calibrate --out profile.json`, or pass a "
            "titan_autopar.cost.hardware.Hardware with your own figures"
        )
    return PRESETS[key]
