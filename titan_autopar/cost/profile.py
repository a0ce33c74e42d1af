"""Hardware profile files: measured figures of one machine, as the cost model reads them.

A profile is a JSON file written by `titan-autopar calibrate` (see `cost/calibrate.py`) and read
wherever a hardware preset name is accepted (`--hardware PATH`, `[auto_parallel] hardware =
"PATH"`). Its fields, schema version 1:

    format        "titan_autopar.hardware_profile"
    version       1
    name          a label, e.g. "cpu-gloo-4x1t"
    measured_on   {fingerprint, device, backend, world_size, local_world_size, threads, torch,
                   machine, cpu, accelerator, date}: the machine it describes
    hardware      every field of `cost.hardware.Hardware` (FLOP/s, bytes/s, seconds), as priced
    measurements  the raw points behind each fitted figure (matmul, attention, memory,
                  launch, collectives, overlap, shared links), for a person to check the fits

`hardware_from_profile` checks the file field by field (each figure against the range stated
beside its field of `Hardware`) and says which field is wrong and how to make a new one;
`machine_description` names the machine a job runs on, so a job refuses a profile measured
elsewhere (a stale profile) instead of pricing the wrong machine. Figures are rounded to two
significant digits when written, so two calibrations of one machine usually give the same
profile, and then the same plan.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
from dataclasses import fields
from pathlib import Path

from titan_autopar import strict_json
from titan_autopar.cost.hardware import Hardware
from titan_autopar.files import read_capped, write_atomic

FORMAT, VERSION = "titan_autopar.hardware_profile", 1
COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")


class ProfileError(ValueError):
    """A hardware profile that cannot be used, with what to do about it."""


def round2(x: float) -> float:
    """Two significant digits: measurements differ run to run in the third."""
    if not x or not math.isfinite(x):
        return float(x)
    return float(f"{x:.2g}")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_description(device: str, backend: str, world_size: int, local_world_size: int,
                        threads: int) -> dict:
    """What a profile is valid for: the processor (or accelerator), how many ranks share the
    machine and the threads each runs, the communication backend and torch's version."""
    import torch

    accel = ""
    if device == "cuda" and torch.cuda.is_available():
        accel = torch.cuda.get_device_name(0)
    d = {"device": device, "backend": backend, "world_size": int(world_size),
         "local_world_size": int(local_world_size), "threads": int(threads),
         "torch": torch.__version__.split("+")[0], "machine": platform.machine(),
         "cpu": _cpu_name(), "cpu_count": os.cpu_count() or 0, "accelerator": accel}
    d["fingerprint"] = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    return d


def this_machine(device: str) -> dict:
    """`machine_description` of the calling rank's machine and rank layout: the process group's
    size and backend, torchrun's LOCAL_WORLD_SIZE, this process's threads."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    backend = dist.get_backend() if dist.is_initialized() else ("nccl" if device == "cuda" else "gloo")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return machine_description(device, backend, world, local, torch.get_num_threads())


def write_profile(path, name: str, measured_on: dict, hardware: Hardware, measurements: dict) -> Path:
    """Write the profile to a temporary name and rename it, so a reader never sees half."""
    hw = hardware.as_dict()
    hw["collective_fits"] = [list(f) for f in hardware.collective_fits]
    doc = {"format": FORMAT, "version": VERSION, "name": name, "measured_on": measured_on,
           "hardware": hw, "measurements": measurements}
    return write_atomic(path, json.dumps(doc, indent=1) + "\n")


def _suggest(path) -> str:
    """A profile file name to write for `path`: a file in it where `path` is a folder."""
    try:
        return str(Path(path) / "profile.json") if Path(path).is_dir() else str(path)
    except (OSError, ValueError):
        return "profile.json"


def is_profile_file(path) -> bool:
    """True if `path` holds a hardware profile this version loads (every field checks)."""
    try:
        hardware_from_profile(path)
        return True
    except ProfileError:
        return False


def _fail(path, field: str, why: str, fix: str = "") -> None:
    fix = fix or ("make a new one with `titan-autopar calibrate --out " + _suggest(path) + "`")
    raise ProfileError(f"hardware profile {path}: {field} {why}; {fix}")


def read_profile(path) -> dict:
    """The profile's JSON, checked; raises ProfileError naming the field."""
    raw = read_capped(path, name=f"hardware profile {path}", what="a hardware profile",
                      error=ProfileError, fix="give a preset name (h100, h200, a100, b200, cpu) "
                      f"or a file written by `titan-autopar calibrate --out {_suggest(path)}`")
    try:
        doc = strict_json.loads(raw, "hardware profile")
    except strict_json.JsonProblem as e:
        if e.where:
            _fail(path, e.where, f"holds {e.what}")
        _fail(path, "the file", f"is {e.what}" if e.what.startswith("not ") else
              f"is not a profile: {e.what}")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        _fail(path, "format", f"is {doc.get('format') if isinstance(doc, dict) else doc!r:.60}, "
              f"not {FORMAT!r}: this is not a hardware profile")
    if doc.get("version") != VERSION:
        _fail(path, "version", f"is {doc.get('version')!r}; this titan_autopar reads version "
              f"{VERSION} (the profile is stale)")
    for key in ("name", "measured_on", "hardware"):
        if key not in doc:
            _fail(path, key, "is missing")
    if not isinstance(doc["name"], str) or not doc["name"]:
        _fail(path, "name", "must be a non-empty string")
    if not isinstance(doc["measured_on"], dict) or "fingerprint" not in doc["measured_on"]:
        _fail(path, "measured_on.fingerprint", "is missing")
    return doc


def hardware_from_profile(path) -> Hardware:
    """The `Hardware` a profile describes; `profile` names the file and its machine."""
    doc = read_profile(path)
    hw = doc["hardware"]
    if not isinstance(hw, dict):
        _fail(path, "hardware", "must be an object of the cost model's figures")
    known = {f.name: f for f in fields(Hardware)}
    kwargs = {}
    for k, v in hw.items():
        if k not in known:
            _fail(path, f"hardware.{k}", f"is not a figure the cost model knows ({', '.join(known)})")
        if k in ("name", "profile"):
            continue
        if k == "collective_fits":
            kwargs[k] = _fits(path, v)
            continue
        problem = Hardware.problem(k, v)  # each figure's range, stated beside its field
        if problem:
            _fail(path, f"hardware.{k}", problem)
        kwargs[k] = int(v) if k == "gpus_per_node" else float(v)
    for k in ("peak_bf16_flops", "peak_fp32_flops", "hbm_bandwidth", "hbm_bytes", "gpus_per_node",
              "intra_node_bandwidth", "inter_node_bandwidth", "intra_node_latency",
              "inter_node_latency"):
        if k not in kwargs:
            _fail(path, f"hardware.{k}", "is missing")
    fp = doc["measured_on"]["fingerprint"]
    return Hardware(name=doc["name"], profile=f"{Path(path).name}#{fp}", **kwargs)


def _fits(path, v) -> tuple:
    if not isinstance(v, list):
        _fail(path, "hardware.collective_fits", "must be a list of [kind, group size, latency s, "
              "seconds per byte]")
    out = []
    for i, f in enumerate(v):
        ok = (isinstance(f, list) and len(f) == 4 and f[0] in COLLECTIVES
              and isinstance(f[1], int) and f[1] >= 2
              and all(isinstance(x, (int, float)) and not isinstance(x, bool)
                      and math.isfinite(x) and x >= 0 for x in f[2:]))
        if not ok:
            _fail(path, f"hardware.collective_fits[{i}]", f"is {f!r}: expected [one of "
                  f"{', '.join(COLLECTIVES)}, group size >= 2, latency s >= 0, seconds per byte >= 0]")
        out.append((f[0], int(f[1]), float(f[2]), float(f[3])))
    return tuple(sorted(out))


def check_machine(path, here: dict) -> None:
    """Refuse a profile measured on another machine (or rank layout) than `here` describes."""
    doc = read_profile(path)
    there = doc["measured_on"]
    if there.get("fingerprint") == here["fingerprint"]:
        return
    diff = [f"{k}: profile {there.get(k)!r}, this job {here[k]!r}"
            for k in here if k not in ("fingerprint",) and there.get(k) != here[k]]
    raise ProfileError(
        f"hardware profile {path} was measured on another machine or rank layout "
        f"({'; '.join(diff) or 'fingerprint differs'}): calibrate this one with "
        f"`titan-autopar calibrate --nproc {here['local_world_size']} --out {path}`, or set "
        f"[auto_parallel] hardware = \"calibrate\"")


def cache_dir() -> Path:
    """Where `hardware = "calibrate"` keeps profiles, one per machine fingerprint; a
    TITAN_AUTOPAR_CACHE that is not a folder is refused, naming it."""
    env = os.environ.get("TITAN_AUTOPAR_CACHE")
    if env:
        if Path(env).exists() and not Path(env).is_dir():
            raise ProfileError(f"TITAN_AUTOPAR_CACHE={env} is a file, not a folder: "
                               "hardware = \"calibrate\" keeps its profiles in that folder; "
                               "point TITAN_AUTOPAR_CACHE at a folder, or unset it")
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "titan_autopar"


def cache_write_problem(path: Path) -> str | None:
    """None when the profile `path` (under `cache_dir()`) can be written, else why not: checked
    before measuring, so a calibration is never lost to a cache it cannot be kept in."""
    import tempfile

    folder = next((p for p in path.parents if p.exists()), None)
    try:
        if folder is None or not folder.is_dir():
            raise NotADirectoryError(f"{folder} is not a folder")
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".titan_autopar_probe.")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        return (f"the profile cache {path.parent} cannot be written ({e.strerror or e}): set "
                "TITAN_AUTOPAR_CACHE to a folder you can write, or give a profile file or a "
                "preset as [auto_parallel] hardware")
    return None


# what `cost/calibrate.py` measures, counted: a cached profile from a calibration that measured
# less (2: the optimizer per tensor and collectives inside a step; 3: DTensor's runtime under
# tensor parallelism) is measured again
MEASURES = 3


def cached_profile_path(fingerprint: str) -> Path:
    return cache_dir() / "profiles" / f"{fingerprint}.m{MEASURES}.json"
