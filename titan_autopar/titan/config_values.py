"""What a job's values may be, beyond their types: the ranges and choices of the values the
planner and the trainer read, one rule per key, stated once in the tables below.

`check_values(sections, source)` takes a config as `{section: {key: value}}` -- a TOML file's
tables (`titan-autopar plan --config`, which checks only the keys the file gives) or every
field of a parsed TorchTitan JobConfig (a job under the switch, `config_check.check_job_config`)
-- so both roads refuse the same value with the same words: one ConfigError naming
`[section] key`, the value found and what to write instead. `degree_value_problem` is the
rule for one parallelism degree, which the trainer's degree check (`titan/degree_check.py`)
shares.
Values are checked after their types (`config_check.check_section`).
"""

from __future__ import annotations

import math

from titan_autopar.limits import MAX_LOCAL_BATCH, MAX_MEMORY_BUDGET_GIB, MAX_MESH_RANKS, MAX_SEQ_LEN
from titan_autopar.titan.config_check import ConfigError

# (section, key): (lowest, highest, what the number is); a value outside is refused
RANGES = {
    ("training", "seq_len"): (1, MAX_SEQ_LEN, "tokens per sequence"),
    ("training", "local_batch_size"): (1, MAX_LOCAL_BATCH, "sequences per data-parallel rank"),
    ("auto_parallel", "memory_budget_gib"): (0, MAX_MEMORY_BUDGET_GIB,
                                            "GiB per device; 0: the hardware's memory"),
    ("auto_parallel", "time_limit_s"): (0, math.inf, "seconds per integer program; 0: the "
                                        "planner's default, 600"),
}
# parallelism degrees: whole numbers from 1 to MAX_MESH_RANKS (1: that parallelism is off);
# data_parallel_shard_degree may also be -1, the ranks the other degrees leave
DEGREES = ("data_parallel_replicate", "data_parallel_shard", "context_parallel",
           "tensor_parallel", "pipeline_parallel", "expert_parallel", "expert_tensor_parallel")
# (section, key): the values it takes
CHOICES = {
    ("auto_parallel", "solver"): ("highs", "cbc", "joint"),
    ("auto_parallel", "cp_attention"): ("cheapest", "ring"),
    ("auto_parallel", "manual_style"): ("torchtitan_ep", "data_parallel"),
}
CALIBRATE = "calibrate"


def degree_value_problem(key: str, value) -> str | None:
    """None when `value` can be the degree `key` ("tensor_parallel_degree", ...), else what is
    wrong and what to write, after "[parallelism] key = value"."""
    shard = key == "data_parallel_shard_degree"
    if (value == -1 and shard) or 1 <= value <= MAX_MESH_RANKS:
        return None
    what = (f"a whole number from 1 to {MAX_MESH_RANKS}, or -1 for the ranks the other degrees "
            "leave" if shard else f"a whole number from 1 (none of this parallelism) to "
            f"{MAX_MESH_RANKS}")
    fix = f"{key} = {-1 if shard else 1}" if value < 1 else f"{key} = {MAX_MESH_RANKS} or less"
    return f"a degree is {what}; write {fix}"


def _number(x) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)


def _range_problem(key: str, value, low, high, meaning: str) -> str | None:
    if math.isfinite(value) and low <= value <= high:
        return None
    most = f" and at most {_number(high)}" if math.isfinite(high) else ""
    fix = f"{key} = {_number(high)} or less" if value > high else f"{key} = {low}"
    return f"it must be at least {low}{most} ({meaning}); write {fix}"


def _hardware_problem(value: str) -> str | None:
    from titan_autopar.cost.hardware import PRESETS, is_profile_path

    if value == CALIBRATE or value.lower() in PRESETS or (value.strip() and is_profile_path(value)):
        return None
    return (f"unknown hardware: name a preset ({', '.join(sorted(PRESETS))}), a profile file "
            "written by `titan-autopar calibrate` (a path ending in .json), or \"calibrate\"; "
            "write e.g. hardware = \"h100\"")


def check_values(sections: dict, source: str = "the config") -> None:
    """Every value of `sections` that has a rule here (see the module docstring)."""
    for section, values in sections.items():
        if not isinstance(values, dict):
            continue  # a section of the wrong type is check_section's to refuse
        for key, value in values.items():
            problem = None
            if isinstance(value, bool):
                continue
            if (section, key) in RANGES and isinstance(value, (int, float)):
                problem = _range_problem(key, value, *RANGES[section, key])
            elif section == "parallelism" and key.removesuffix("_degree") in DEGREES \
                    and isinstance(value, int):
                problem = degree_value_problem(key, value)
            elif (section, key) in CHOICES and value not in CHOICES[section, key]:
                problem = (f"it must be one of {', '.join(map(repr, CHOICES[section, key]))}; write "
                           f"{key} = \"{CHOICES[section, key][0]}\"")
            elif (section, key) == ("auto_parallel", "hardware") and isinstance(value, str):
                problem = _hardware_problem(value)
            if problem:
                raise ConfigError(f"{source}: [{section}] {key} = {value!r}: {problem}")
