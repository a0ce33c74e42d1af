"""Real multi-process runs for tests: gloo on CPU, one spawned process per rank.

`run_ranks(fn, world_size, *args)` starts `world_size` processes, each with a gloo process
group, calls `fn(rank, *args)` in each and re-raises the first failure with its traceback. A
rank that finished leaves with `os._exit(0)`, past the interpreter's teardown (see `_entry`).
Workers report numbers by writing JSON (rank 0) into a directory the test then reads.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn, world_size: int, port: int, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Done, results written: leave without the interpreter's teardown. Objects such as device
    # meshes keep gloo's process group alive past destroy_process_group, and its threads can
    # still hold tensors when the interpreter frees them, which aborts the rank ("terminate
    # called without an active exception"; seen once in a suite, on rank 0 of a ring-attention
    # parity run after its figures were written). That is a torch teardown race, not a result.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_ranks(fn, world_size: int, *args) -> None:
    mp.start_processes(_entry, args=(fn, world_size, _free_port(), args), nprocs=world_size,
                       start_method="spawn")


def write_result(out_dir, name: str, data) -> None:
    Path(out_dir, f"{name}.json").write_text(json.dumps(data, indent=1))


def read_result(out_dir, name: str):
    return json.loads(Path(out_dir, f"{name}.json").read_text())
