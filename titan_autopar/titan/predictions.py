"""The plan's predictions in TensorBoard, beside what TorchTitan measures.

TorchTitan's metric logger writes `time_metrics/end_to_end(s)` and `memory/max_reserved(GiB)`
to `<dump_folder>/<save_tb_folder>/<date-time>/` on one rank (rank 0, or with pp the first
rank of the last stage). It exists before the parallelize step runs, so that rank adds, to the
same run folder, `time_metrics/predicted_step(s)` and `memory/predicted_peak(GiB)` from its
plan (a pipeline stage's plan predicts that stage; the tags then name it: `.../pp1/...`). The
prediction is written at the first and the last step so it draws a line across the measured
curve. Predictions are for the plan's hardware preset, not for the machine the job runs on.
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

STEP_TAG, MEMORY_TAG = "time_metrics/predicted_step(s)", "memory/predicted_peak(GiB)"


def tensorboard_run(job_config) -> Path | None:
    """The run folder TorchTitan's TensorBoard logger opened for this job (the newest)."""
    root = Path(job_config.job.dump_folder) / job_config.metrics.save_tb_folder
    runs = [p for p in root.glob("*") if p.is_dir()] if root.is_dir() else []
    return max(runs, key=lambda p: p.stat().st_mtime) if runs else None


def write_predictions(plan, parallel_dims, job_config, stage: str = "") -> Path | None:
    """Add the plan's predicted step time and peak memory to this job's TensorBoard run, on
    the rank that logs metrics; returns the folder written, or None."""
    from torchtitan.components.metrics import _get_metrics_rank  # where TorchTitan logs

    m = job_config.metrics
    me = dist.get_rank() if dist.is_initialized() else 0
    if not m.enable_tensorboard or m.save_for_all_ranks or me != _get_metrics_rank(parallel_dims, job_config):
        return None
    run = tensorboard_run(job_config)
    if run is None:
        return None
    from torch.utils.tensorboard import SummaryWriter

    pred = plan.predicted_run(job_config.auto_parallel.recipe_runtime)
    sub = f"/{stage}" if stage else ""
    writer = SummaryWriter(str(run), filename_suffix=".titan_autopar")
    for step in sorted({1, max(1, job_config.training.steps)}):
        writer.add_scalar(STEP_TAG.replace("/", f"{sub}/", 1), pred["step_time_s"], step)
        writer.add_scalar(MEMORY_TAG.replace("/", f"{sub}/", 1), pred["peak_memory_gib"], step)
    writer.close()
    return run
