"""Hardware presets and the precision the priced training step runs in.

Owns `Hardware` (peak FLOP/s, HBM bandwidth and capacity, GPUs per node, intra- and inter-node
link bandwidth and latency, how much of compute a collective can hide behind) and `get_hardware`,
which accepts a preset name or a `Hardware`. Figures are per GPU and dense (no sparsity).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

GiB = 1024**3


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_bf16_flops: float  # dense tensor-core FLOP/s
    peak_fp32_flops: float
    hbm_bandwidth: float  # bytes/s
    hbm_bytes: float  # capacity per GPU
    gpus_per_node: int
    intra_node_bandwidth: float  # bytes/s per GPU as a collective sees it (NVLink bus bandwidth)
    inter_node_bandwidth: float  # bytes/s per GPU (one NIC per GPU)
    intra_node_latency: float  # seconds per collective step
    inter_node_latency: float
    compute_efficiency: float = 0.7  # fraction of peak a large matmul reaches
    launch_overhead: float = 5e-6  # seconds per kernel that does work
    overlap_efficiency: float = 0.9  # fraction of compute time parameter collectives can hide behind

    def as_dict(self) -> dict:
        return asdict(self)


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
}


def get_hardware(hw: str | Hardware) -> Hardware:
    if isinstance(hw, Hardware):
        return hw
    key = str(hw).lower()
    if key not in PRESETS:
        raise ValueError(
            f"unknown hardware preset {hw!r}: use one of {', '.join(sorted(PRESETS))}, "
            "or pass a titan_autopar.cost.hardware.Hardware with your own figures"
        )
    return PRESETS[key]
