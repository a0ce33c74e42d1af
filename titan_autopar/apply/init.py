"""Weight initialisation of a parallelised model that equals the single-device one.

DTensor's own random ops draw each shard from the generator independently (on CPU the shards
do not even differ), so `init_weights` on DTensor parameters would not give the full tensor a
single device gives for the same seed. While `single_device_random(mesh)` is active, every
in-place random op on a DTensor (normal_, uniform_, ...) instead draws the *full* tensor from
the default generator, exactly as one device would, and keeps this rank's slice. The cost is one
full-sized temporary per initialised tensor; the generator state is first made equal on all
ranks (rank 0's), so replicated parameters agree even without a seed.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

RANDOM_INPLACE = {
    aten.normal_, aten.uniform_, aten.bernoulli_, aten.exponential_, aten.geometric_,
    aten.log_normal_, aten.cauchy_, aten.random_,
}


def local_slice(full: torch.Tensor, mesh, placements) -> torch.Tensor:
    """This rank's piece of `full` under `placements` (no communication)."""
    shape, offset = compute_local_shape_and_global_offset(full.shape, mesh, placements)
    index = tuple(slice(o, o + s) for o, s in zip(offset, shape))
    return full[index]


class _FullTensorRandom(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        target = args[0] if args else None
        if func.overloadpacket in RANDOM_INPLACE and isinstance(target, DTensor):
            local = target._local_tensor
            full = torch.empty(target.shape, dtype=local.dtype, device=local.device)
            func(full, *args[1:], **kwargs)
            local.copy_(local_slice(full, target.device_mesh, target.placements))
            return target
        return func(*args, **kwargs)


def _sync_generators(device: torch.device) -> None:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    states = [torch.get_rng_state()]
    if device.type == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    dist.broadcast_object_list(states, src=0)
    torch.set_rng_state(states[0])
    if device.type == "cuda":
        torch.cuda.set_rng_state(states[1], device)


@contextlib.contextmanager
def single_device_random(device: torch.device | str = "cpu"):
    """Random fills of DTensors give the single-device full tensor, sliced to this rank."""
    _sync_generators(torch.device(device))
    with _FullTensorRandom():
        yield


def wrap_init_weights(model: torch.nn.Module) -> None:
    """Make `model.init_weights` (TorchTitan's initialiser, if the model has one) run under
    `single_device_random`, on the device its parameters live on."""
    init = getattr(model, "init_weights", None)
    if init is None or getattr(init, "_single_device_random", False):
        return

    @functools.wraps(init)
    def init_weights(*args, **kwargs):
        p = next(model.parameters(), None)
        dev = p.device if p is not None else torch.device("cpu")
        with single_device_random(dev):
            return init(*args, **kwargs)

    init_weights._single_device_random = True
    model.init_weights = init_weights
