"""Which sections and keys a job's TOML may hold, and the line that lets it hold the switch.

TorchTitan reads `[parallelism] auto` and `[auto_parallel]` only through this package's config
module, named in `[job] custom_config_module`; without that line its config manager says
"Invalid field names ... {'auto'}" over three lines, and with a misspelt module it fails on the
import with a traceback. `check_keys(cfg, source)` refuses such a file first, in one line that
says which line to add or what to write: a missing or unimportable config module, an unknown
section or key (with the nearest known name). Every road calls it before any work:
`titan-autopar plan --config` (`titan/job_file.py`), the launcher and `ab` (`titan/launch.py`,
`titan/ab.py`) in the calling process, and each rank of a CPU job (`titan/job_parse.py`).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util

from titan_autopar.titan.config_check import ConfigError

SWITCH_MODULE = "titan_autopar.titan.job_config"
MODULE_LINE = f'custom_config_module = "{SWITCH_MODULE}"'


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that does not exist, or an empty name
        return False


def declared_keys() -> dict[str, set[str]]:
    """Section -> its keys, as TorchTitan's JobConfig merged with this package's declares them."""
    from torchtitan.config import job_config as tt

    from titan_autopar.titan import config_fields as ours

    out = {f.name: {g.name for g in dataclasses.fields(f.type)}
           for f in dataclasses.fields(tt.JobConfig) if dataclasses.is_dataclass(f.type)}
    out["parallelism"] |= {g.name for g in dataclasses.fields(ours.Parallelism)}
    out["auto_parallel"] = {g.name for g in dataclasses.fields(ours.AutoParallel)}
    return out


def _nearest(name: str, known, shown="{}") -> str:
    near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
    if near:
        return f"did you mean {shown.format(near[0])}?"
    return "it knows " + ", ".join(shown.format(k) for k in sorted(known))


def check_keys(cfg: dict, source: str = "the config", module: str | None = None) -> None:
    """`cfg`, a job's TOML tables: its config module and its sections and keys (see the module
    docstring). `module` is a custom_config_module given on the command line, which TorchTitan
    takes before the file's."""
    job = cfg.get("job") if isinstance(cfg.get("job"), dict) else {}
    named = module if module is not None else job.get("custom_config_module", "")
    if not isinstance(named, str):
        raise ConfigError(f"{source}: [job] custom_config_module = {named!r} is not a string: "
                          f"write {MODULE_LINE}")
    par = cfg.get("parallelism") if isinstance(cfg.get("parallelism"), dict) else {}
    if named and not _importable(named):
        raise ConfigError(f"{source}: [job] custom_config_module = {named!r} is not a module "
                          f"Python can import; for the auto switch write {MODULE_LINE}")
    if not named and ("auto" in par or "auto_parallel" in cfg):
        what = "[parallelism] auto" if "auto" in par else "[auto_parallel]"
        raise ConfigError(f"{source}: {what} is read through titan_autopar's config module, which "
                          f"[job] does not name: add the line {MODULE_LINE} under [job]")
    if named and named != SWITCH_MODULE:
        return  # another module may declare sections and keys of its own
    known = declared_keys()
    for section, values in cfg.items():
        if section not in known:
            raise ConfigError(f"{source}: [{section}] is not a section of a TorchTitan job: "
                              f"{_nearest(section, known, '[{}]')}")
        if not isinstance(values, dict):
            continue  # check_section says what a section must be
        for key in values:
            if key not in known[section]:
                raise ConfigError(f"{source}: [{section}] {key} is not a key of [{section}]: "
                                  f"{_nearest(key, known[section])}")
