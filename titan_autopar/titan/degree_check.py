"""A job whose parallelism degrees do not fit its ranks stops with what to change.

TorchTitan 0.2.2 checks `dp_replicate * dp_shard * cp * tp * pp == world size` with a bare
assert deep in its trainer, and a degree of 0 with a bare assert. `install_degree_check()`
(called when the config module is imported, so for every job that names
`titan_autopar.titan.job_config`) runs our check first and raises `DegreeError`: a degree that
no job can have, as `plan --config` words it (`config_values.degree_value_problem`), or one
paragraph naming each degree, the rank count and the values that would fit;
TorchTitan's own validation then runs unchanged.
"""

from __future__ import annotations

_MARK = "_titan_autopar_degree_check"


class DegreeError(ValueError):
    """The config's degrees do not multiply to the number of ranks."""


def degree_problem(world: int, dp_replicate: int, dp_shard: int, cp: int, tp: int,
                   pp: int, ep: int = 1, etp: int = 1) -> str | None:
    """None when the degrees fit `world` ranks, else the paragraph to show."""
    from titan_autopar.titan.config_values import degree_value_problem

    given = {"data_parallel_replicate": dp_replicate, "data_parallel_shard": dp_shard,
             "context_parallel": cp, "tensor_parallel": tp, "pipeline_parallel": pp,
             "expert_parallel": ep, "expert_tensor_parallel": etp}
    for name, value in given.items():  # each degree on its own first: 0 would divide by zero
        problem = degree_value_problem(f"{name}_degree", value)
        if problem:
            return f"[parallelism] {name}_degree = {value}: {problem}"
    others = dp_replicate * cp * tp * pp
    shard = world // others if dp_shard == -1 else dp_shard
    if min(dp_replicate, cp, tp, pp) >= 1 and shard >= 1 and others * shard == world:
        if ep > 1 and (shard * cp * tp) % (ep * etp):
            return (f"expert_parallel_degree ({ep}) x expert_tensor_parallel_degree ({etp}) must "
                    f"divide data_parallel_shard_degree ({shard}) x context_parallel_degree ({cp}) "
                    f"x tensor_parallel_degree ({tp}) = {shard * cp * tp}: the expert ranks are "
                    "carved out of those. Choose an expert_parallel_degree that divides "
                    f"{shard * cp * tp // etp}.")
        return None
    what = (f"[parallelism] degrees: data_parallel_replicate_degree ({dp_replicate}) x "
            f"data_parallel_shard_degree ({dp_shard}) x context_parallel_degree ({cp}) x "
            f"tensor_parallel_degree ({tp}) x pipeline_parallel_degree ({pp})")
    if dp_shard == -1:
        what += f" leave {world} / {others} ranks for data_parallel_shard_degree = -1"
    else:
        what += f" = {others * max(dp_shard, 0)}"
    fix = []
    if others >= 1 and world % others == 0:
        fix.append(f"set data_parallel_shard_degree = {world // others} (or -1 to take the "
                   "remaining ranks)")
    else:
        fix.append(f"choose replicate, context, tensor and pipeline degrees whose product "
                   f"divides {world}")
    fix.append(f"or launch {others * max(dp_shard, 1)} ranks (torchrun --nproc_per_node x nodes)")
    return (f"{what}, but the job has {world} ranks: the degrees must multiply to the number of "
            f"ranks. Change them: {'; '.join(fix)}.")


def install_degree_check() -> None:
    from torchtitan.distributed.parallel_dims import ParallelDims

    original = ParallelDims._validate
    if getattr(original, _MARK, False):
        return

    def _validate(self):
        problem = degree_problem(self.world_size, self.dp_replicate, self.dp_shard, self.cp,
                                 self.tp, self.pp, self.ep, self.etp)
        if problem:
            raise DegreeError(problem)
        return original(self)

    setattr(_validate, _MARK, True)
    ParallelDims._validate = _validate
