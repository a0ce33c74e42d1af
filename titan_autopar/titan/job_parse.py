"""A TorchTitan job's command line read as its trainer reads it, checked before any work.

`check_job_file(path, args)` reads the TOML a job names and checks its config module, sections
and keys (`config_keys.check_keys`; `args` may name the module, as TorchTitan allows), with the
file's own TOML errors: the launcher and `ab` call it before they start any rank.
`parse_job(args)` is what each rank of a CPU job runs first: the file checked so, then
TorchTitan's ConfigManager on the same command line, then every value of the JobConfig it
returns, type and range (`config_check.check_job_config`: the same rules `titan-autopar plan
--config` applies to the file). Each refusal is one ConfigError naming the file and
`[section] key`.
"""

from __future__ import annotations

from pathlib import Path

from titan_autopar.titan.config_check import check_job_config, read_toml
from titan_autopar.titan.config_keys import check_keys

_FILE = ("--job.config_file", "--job.config-file")
_MODULE = ("--job.custom_config_module", "--job.custom-config-module")


def _flag(args, names) -> str | None:
    """The value of the first of `names` on the command line (`--x v` or `--x=v`), as
    TorchTitan's ConfigManager finds it."""
    args = list(args)
    for i, a in enumerate(args):
        key = a.split("=")[0]
        if key in names:
            return a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else None)
    return None


def check_job_file(path: str | Path, args=()) -> dict:
    """The job file's tables, its module, sections and keys checked (see the module docstring)."""
    cfg = read_toml(path)
    check_keys(cfg, str(path), _flag(args, _MODULE))
    return cfg


def parse_job(args):
    """The JobConfig TorchTitan's trainer will run, checked (see the module docstring)."""
    from torchtitan.config import ConfigManager

    path = _flag(args, _FILE)
    if path is not None:
        check_job_file(path, args)
    config = ConfigManager().parse_args(list(args))
    check_job_config(config, config.job.config_file or "the config")
    return config
