"""A TorchTitan job config's values checked against their declared types, before any work.

TorchTitan 0.2.2 hands TOML values to its config dataclasses unchecked: `auto = "false"` (a
non-empty string, so true) would turn the planner on, and `local_batch_size = "two"` fails deep
inside the trainer. This module owns `read_toml` (a TOML file, with errors that name the file
and line) and the checks: `check_section` takes one section's values against the dataclass that
declares them, `check_job_config` walks a whole parsed JobConfig and then checks its values'
ranges (`titan/config_values.py`). Each raises `ConfigError` naming `[section] key`, the value
found and what is wanted.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from pathlib import Path


class ConfigError(ValueError):
    """A job config value that cannot be used, with what to write instead."""


def read_toml(path: str | Path) -> dict:
    """The TOML file at `path` as a dict; a missing file, a folder or a syntax error is a
    ConfigError naming the file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"no config file at {path}")
    if not path.is_file():
        raise ConfigError(f"{path} is not a file: give a TorchTitan TOML config")
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not valid TOML: not UTF-8 text") from None


def _describe(t) -> str:
    origin = typing.get_origin(t)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(t))
    if origin in (typing.Union, types.UnionType):
        return " or ".join("nothing" if a is type(None) else _describe(a) for a in typing.get_args(t))
    if origin is list:
        (inner,) = typing.get_args(t) or (typing.Any,)
        return f"a list of {_describe(inner)}"
    return {bool: "true or false", int: "a whole number", float: "a number",
            str: "a string"}.get(t, getattr(t, "__name__", str(t)))


def _fits(value, t) -> bool:
    origin = typing.get_origin(t)
    if t is typing.Any or isinstance(t, str):
        return True
    if origin is typing.Literal:
        return value in typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in typing.get_args(t))
    if t is type(None):
        return value is None
    if origin is list:
        args = typing.get_args(t)
        return isinstance(value, list) and (not args or all(_fits(v, args[0]) for v in value))
    if t is bool:
        return isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if t is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(t, type):
        return isinstance(value, t)
    return True


def check_section(section: str, values: dict, cls, source: str = "the config") -> None:
    """Each value in `values` (one TOML section) against its field's type in dataclass `cls`."""
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: [{section}] must be a table of keys, not "
                          f"{type(values).__name__} {values!r}")
    types_ = {f.name: f.type for f in dataclasses.fields(cls)}
    for key, value in values.items():
        want = types_.get(key)
        if want is None or dataclasses.is_dataclass(want):
            continue  # unknown keys are TorchTitan's to report
        if not _fits(value, want):
            raise ConfigError(f"{source}: [{section}] {key} = {value!r} is not {_describe(want)}: "
                              f"write {key} = <{_describe(want)}>")


def check_job_config(job_config, source: str = "the config") -> None:
    """Every section of a parsed TorchTitan JobConfig (merged with this package's sections):
    each value's type, then its range (`config_values.check_values`, as `plan --config`)."""
    from titan_autopar.titan.config_values import check_values

    sections = {}
    for f in dataclasses.fields(job_config):
        section = getattr(job_config, f.name)
        if dataclasses.is_dataclass(section):
            values = {g.name: getattr(section, g.name) for g in dataclasses.fields(section)}
            check_section(f.name, values, type(section), source)
            sections[f.name] = values
    check_values(sections, source)
