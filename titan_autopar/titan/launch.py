"""Launch TorchTitan training on CPU ranks (or this node's GPUs) as a subprocess, and read back
what it measured.

Owns `launch`: torchrun over `python -m titan_autopar.titan.cpu` (see `titan.cpu`) with
OMP_NUM_THREADS=1, every rank's output tagged "[rankN]:", captured and optionally streamed; and
`calibrate_command`, the same torchrun over `titan_autopar.cost.calibrate` (what `titan-autopar
calibrate` and `ab` run to measure the ranks); the readers of a finished run: `parse_losses`
(step -> loss from TorchTitan's log lines) and
`tensorboard_scalars` (step -> value from the run's TensorBoard event files), and `failed_rank_lines`
(what the rank that failed first printed, instead of torchrun's summary). For tests and the A/B
command; a person can run the same command line by hand (`torchrun_command`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

LOSS_TAG = "loss_metrics/global_avg_loss"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"^(?:\[rank(\d+)\]:)?.*\bstep:\s*(\d+)\s+loss:\s*(\S+)")
_ROOT_CAUSE = re.compile(r"Root Cause.*?\n.*?rank\s*:\s*(\d+)", re.S)
_RANK_LINE = re.compile(r"^\[rank(\d+)\]:(.*)$")


ENTRY = {"cpu": "titan_autopar.titan.cpu", "cuda": "torchtitan.train"}


def torchrun_command(config: str | os.PathLike, nproc: int, extra_args=(),
                     log_dir: str | None = None, device: str = "cpu") -> list[str]:
    """The command line `launch` runs: torchrun, one process per rank, on a free port;
    torchrun keeps its per-rank log copies in `log_dir` (default: a new temporary folder). CPU
    ranks run through `titan.cpu`; GPUs through TorchTitan's own `torchtitan.train`."""
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    logs = ["--log-dir", log_dir] if log_dir else []
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", "--role", "rank", "--tee", "3", *logs,
            "-m", ENTRY[device], "--job.config_file", str(config), *extra_args]


def calibrate_command(nproc: int, out: str | os.PathLike, device: str = "cpu",
                      mesh: str = "", force: bool = False) -> tuple[list[str], dict]:
    """(command, environment) that measures `nproc` ranks of this machine as the jobs run them
    (CPU ranks with one thread each) and writes the profile to `out` (`force`: even over a
    file that is not a profile)."""
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", "-m", "titan_autopar.cost.calibrate", "--out", str(out),
           "--device", device] + (["--mesh", mesh] if mesh else []) + (["--force"] if force else [])
    env = dict(os.environ)
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # as the CPU jobs run: one thread per rank
    return cmd, env


def launch(config: str | os.PathLike, nproc: int = 4, extra_args=(), env=None, *,
           cwd: str | os.PathLike | None = None, stream: bool = True,
           timeout: float | None = None, on_line=None, device: str = "cpu") -> subprocess.CompletedProcess:
    """Train with TorchTitan on `nproc` CPU ranks; returns the finished process, output in
    `.stdout` (stderr merged). `extra_args` are TorchTitan overrides ("--training.steps", "5");
    `env` adds to this process's environment. Past `timeout` seconds the whole run is stopped
    and TimeoutError says so, with the last lines it printed. `on_line(line, popen)` sees each
    line as it is printed (a fault-injection test kills a rank from there). The config's module,
sections and keys are checked here first (`job_parse.check_job_file`), so a file TorchTitan
would refuse on every rank is refused once, in one line."""
    if not Path(cwd or ".", config).is_file():
        raise FileNotFoundError(f"no TorchTitan config at {config} (relative to {cwd or '.'})")
    from titan_autopar.titan.job_parse import check_job_file

    check_job_file(Path(cwd or ".", config), extra_args)  # before any rank starts
    with tempfile.TemporaryDirectory(prefix="titan_autopar_torchrun_") as log_dir:
        cmd = torchrun_command(config, nproc, extra_args, log_dir=log_dir, device=device)
        one_thread = {"OMP_NUM_THREADS": "1"} if device == "cpu" else {}
        run_env = {**os.environ, **one_thread, **(env or {})}
        return _run(cmd, cwd, run_env, stream, timeout, on_line)


def _run(cmd, cwd, env, stream, timeout, on_line=None) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if on_line is not None:
                on_line(line, proc)
            if stream:
                sys.stdout.write(line)
                sys.stdout.flush()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        reader.join(timeout=10)
        raise TimeoutError(f"training did not finish in {timeout} s: {' '.join(cmd)}\n"
                           + "".join(lines[-40:])) from None
    except BaseException:  # interrupted: leave no ranks behind
        _stop(proc)
        raise
    reader.join()
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), None)


def _stop(proc: subprocess.Popen) -> None:
    """Stop torchrun and the ranks it started (its own process group), politely first."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def parse_losses(output: str, rank: int = 0) -> dict[int, float]:
    """step -> loss from TorchTitan's "step: N  loss: X" lines, as printed by `rank` (lines
    without a rank tag count for any rank). Non-finite losses are kept (nan, inf)."""
    losses: dict[int, float] = {}
    for line in output.splitlines():
        m = _STEP.match(_ANSI.sub("", line))
        if m and (m.group(1) is None or int(m.group(1)) == rank):
            losses.setdefault(int(m.group(2)), float(m.group(3)))
    return losses


def tensorboard_scalars(folder: str | os.PathLike, tag: str = LOSS_TAG) -> dict[int, float]:
    """step -> value of scalar `tag` in the TensorBoard event files under `folder` (a run's
    dump folder, or its tb/ folder); the newest event file wins where steps repeat."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(Path(folder).rglob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"no TensorBoard event files under {folder}: was "
                                "[metrics] enable_tensorboard set?")
    values: dict[int, float] = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        if tag in acc.Tags().get("scalars", []):
            values.update({e.step: e.value for e in acc.Scalars(tag)})
    return values



def failed_rank_lines(output: str, last: int = 30) -> str:
    """The last lines that the rank torchrun names as the root cause printed (its traceback and
    error), without the "[rankN]:" tags; where no rank is named, the lines of the first rank that
    printed a traceback or error, else the run's last lines."""
    lines = [_ANSI.sub("", x) for x in output.splitlines()]
    by_rank: dict[int, list[str]] = {}
    for line in lines:
        m = _RANK_LINE.match(line)
        if m:
            by_rank.setdefault(int(m.group(1)), []).append(m.group(2))
    m = _ROOT_CAUSE.search("\n".join(lines))
    rank = int(m.group(1)) if m else None
    if rank not in by_rank:
        rank = next((r for r, ls in sorted(by_rank.items())
                     if any("Traceback" in x or "Error" in x for x in ls)), None)
    if rank is None:
        return "\n".join(lines[-last:])
    return f"rank {rank}:\n" + "\n".join(by_rank[rank][-last:])
