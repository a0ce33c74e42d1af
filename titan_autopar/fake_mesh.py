"""`fake_mesh`: a DeviceMesh of simulated ranks, for planning without a cluster.

torch's fake process group stands in for every rank in this one process: collectives return at
once and move nothing, which is all planning needs (it reads the mesh's names and sizes and
builds DTensor placements on it). The CLI, the degree search, the tests and the benchmarks plan
on it; a real job plans on its own mesh.
"""

from __future__ import annotations

import math

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.testing._internal.distributed.fake_pg import FakeStore


def fake_mesh(names, sizes) -> DeviceMesh:
    """A DeviceMesh of prod(sizes) simulated ranks (torch's fake process group), dims named
    `names`; any process group this process had is replaced."""
    world = math.prod(sizes)
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    return init_device_mesh("cpu", tuple(sizes), mesh_dim_names=tuple(names))
