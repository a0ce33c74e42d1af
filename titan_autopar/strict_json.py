"""JSON as this package reads its own files (plans, hardware profiles): strict, and every
failure a `JsonProblem` saying where, never Python's own message.

Refused: text that is not UTF-8 or not JSON, a key twice in one object, NaN and Infinity, a
whole number of more than `MAX_DIGITS` digits (Python's own limit, 4300, would fail with a
message that names no field; `JsonProblem.where` names it) and nesting deeper than Python's
parser goes.
"""

from __future__ import annotations

import json
import re

# no figure in a plan or a profile has more digits (a byte count of an 8B model has 11)
MAX_DIGITS = 100
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class JsonProblem(ValueError):
    """Why a text is not the JSON it should be: `what`, and `where` (a field such as
    "parameters['w'][0]", or "" where unknown)."""

    def __init__(self, what: str, where: str = ""):
        super().__init__(f"{where}: {what}" if where else what)
        self.what, self.where = what, where


class _Long(str):
    """A whole number too long to convert, kept as its digits until its field is found."""


def _pairs(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise JsonProblem(f"key {k!r} appears twice in one object")
        out[k] = v
    return out


def field_name(path: list) -> str:
    """["parameters", "w.b", 0] -> "parameters['w.b'][0]"."""
    out = ""
    for k in path:
        if isinstance(k, int):
            out += f"[{k}]"
        elif _NAME.match(k):
            out += f".{k}" if out else k
        else:
            out += f"[{k!r}]"
    return out


def _find_long(doc) -> tuple[str, _Long] | None:
    stack = [([], doc)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, _Long):
            return field_name(path), v
        if isinstance(v, dict):
            stack.extend((path + [k], x) for k, x in reversed(v.items()))
        elif isinstance(v, list):
            stack.extend((path + [i], x) for i, x in reversed(list(enumerate(v))))
    return None


def loads(raw: bytes | str, noun: str = "file"):
    """The JSON value in `raw`, or JsonProblem; `noun` is what the text should be, for the
    messages ("plan": "NaN is not a number a plan can hold")."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError:
        raise JsonProblem("not UTF-8 text (a binary file?)") from None
    longs = []

    def constant(name):
        raise JsonProblem(f"{name} is not a number a {noun} can hold")

    def whole(s: str):
        if len(s.lstrip("-")) > MAX_DIGITS:
            longs.append(s)
            return _Long(s)
        return int(s)

    try:
        doc = json.loads(text, object_pairs_hook=_pairs, parse_constant=constant,
                         parse_int=whole)
    except json.JSONDecodeError as e:
        raise JsonProblem(f"not JSON ({e})") from None
    except RecursionError:
        raise JsonProblem(f"its JSON is nested deeper than any {noun}'s") from None
    if longs:
        where, s = _find_long(doc) or ("", longs[0])
        raise JsonProblem(f"a whole number of {len(s.lstrip('-'))} digits ({s[:12]}...), longer "
                          f"than any figure a {noun} holds (at most {MAX_DIGITS})", where)
    return doc
