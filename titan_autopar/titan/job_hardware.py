"""The hardware a TorchTitan job under auto is priced for: a preset, a profile, or "calibrate".

`[auto_parallel] hardware` takes a preset name (h100, h200, a100, b200, cpu), the path of a
profile written by `titan-autopar calibrate`, or "calibrate". A profile must describe the
machine the job runs on (`cost/profile.py check_machine`): one measured elsewhere, or with
another number of ranks, is refused with what differs. "calibrate" measures the job's own ranks
at start (`cost/calibrate.py`, about 35 s on CPU ranks) and keeps the profile in the cache folder
by machine fingerprint, so the next job on the same machine reads it instead; every rank takes
part in the measurement, rank 0 writes the file. A cache that cannot hold the file (a
TITAN_AUTOPAR_CACHE that is a file, a folder that cannot be written) is refused before measuring. Either way the plan records which profile
priced it (`hardware.profile`).
"""

from __future__ import annotations

import logging

import torch.distributed as dist

from titan_autopar.cost.hardware import is_profile_path
from titan_autopar.cost.profile import (ProfileError, cache_write_problem, cached_profile_path,
                                        check_machine, is_profile_file, this_machine)
from titan_autopar.files import check_out_file

CALIBRATE = "calibrate"


def job_device() -> str:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return "cuda"
    return "cpu"


def resolve_hardware(job_config, log: logging.Logger | None = None) -> str:
    """The preset name or profile path this job is priced with; sets it on `job_config` so the
    planner, replay checks and predictions all read the same one. Every rank calls this."""
    log = log or logging.getLogger("titan_autopar")
    ap = job_config.auto_parallel
    hw = str(ap.hardware)
    if hw != CALIBRATE and not is_profile_path(hw):
        return hw
    device = job_device()
    me = this_machine(device)
    if hw != CALIBRATE:
        try:
            check_machine(hw, me)
        except ProfileError as e:
            raise ProfileError(f"[auto_parallel] hardware = {hw!r}: {e}") from None
        return hw
    path = cached_profile_path(me["fingerprint"])  # a TITAN_AUTOPAR_CACHE file is refused here
    # a folder, device or pipe in the cache would be refused after the measuring, not before
    check_out_file(path, label=f"the profile cache's {path}", what="a hardware profile",
                   ours=is_profile_file, force=True, example="profile.json")
    have = [path.is_file(), None]
    if not have[0] and (not dist.is_initialized() or dist.get_rank() == 0):
        have[1] = cache_write_problem(path)  # rank 0 writes it: checked before measuring
    if dist.is_initialized():  # rank 0's answer for all, so every rank measures or none does
        dist.broadcast_object_list(have, src=0)
    if have[1]:
        raise ProfileError(f"[auto_parallel] hardware = \"calibrate\": {have[1]}")
    if have[0]:
        log.info(f"[titan_autopar] hardware: the profile calibrated on this machine, {path}")
    else:
        from titan_autopar.cost.calibrate import calibrate_and_write

        log.info(f"[titan_autopar] hardware = \"calibrate\": measuring this job's "
                 f"{me['world_size']} ranks (once per machine; kept in {path})")
        say = (lambda s: log.info(f"[titan_autopar] calibrate: {s}")) \
            if (not dist.is_initialized() or dist.get_rank() == 0) else None
        world = me["world_size"]
        calibrate_and_write(path, (world,), device, say)
    ap.hardware = str(path)
    return ap.hardware
