"""Plan files mutated at random: each mutant either loads (and then explains, and -- checked on
every 4th -- survives a save and reload with the same explanation) or is refused with a PlanError naming the file.
Never another exception. Mutations: drop, duplicate or retype a field; change a number, a
placement or a name; truncate the text; flip bytes; repeat a key. Seeded, so a failure
reproduces; the counts are printed."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from conftest import tiny_llama
from titan_autopar import Plan, plan_model
from titan_autopar.fake_mesh import fake_mesh
from titan_autopar.plan import PlanError

MUTANTS = 2500
PLACEMENTS = ["R", "P", "S(0)", "S(1)", "S(9)", "S(999)", "S(-1)", "S(01)", "X", "", "r", "S(1.5)",
              "Shard(0)"]
VALUES = [None, True, False, 0, -1, 1, 2**70, 3.5, -0.0, 1e308, "", "x", "\x1b[2J", "\u202e",
          [], [1], {}, {"a": 1}, ["R", "R"]]


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("fuzz") / "plan.json"
    mesh = fake_mesh(("dp_shard", "tp"), (2, 2))
    plan_model(tiny_llama(dim=64, layers=1, seq=16, n_heads=4), mesh,
               (torch.zeros(2, 16, dtype=torch.long),), progress=lambda s: None).save(path)
    return path, json.loads(path.read_text())


def _paths(obj, prefix=()):
    """Every (path, value) in a JSON value, containers included."""
    yield prefix, obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _parent(d, path):
    for k in path[:-1]:
        d = d[k]
    return d


class Sites:
    """Where in the original plan each kind of mutation can strike (found once)."""

    def __init__(self, data: dict):
        every = list(_paths(data))
        self.all = [p for p, _ in every if p]
        self.numbers = [p for p, v in every if isinstance(v, (int, float)) and not isinstance(v, bool)]
        self.placements = [p for p, v in every if isinstance(v, str)
                           and (v in ("R", "P") or v.startswith("S("))]
        self.strings = [p for p, v in every if isinstance(v, str)]


def mutate(rng: random.Random, sites: Sites, text: str) -> tuple[str, str]:
    """(mutation name, mutated file text)."""
    kind = rng.choice(["drop", "duplicate", "retype", "number", "placement", "name", "truncate",
                       "bytes", "repeat_key", "swap"])
    if kind == "truncate":
        return kind, text[: rng.randrange(len(text))]
    if kind == "bytes":
        b = bytearray(text.encode())
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return kind, b.decode("latin-1")
    if kind == "repeat_key":
        i = text.index('"', rng.randrange(len(text) // 2))
        j = text.index('"', i + 1)
        key = text[i:j + 1]
        return kind, text.replace("{", "{" + key + ": 1, ", 1) if rng.random() < 0.5 else \
            text[:i] + key + ": 0, " + text[i:]
    d = json.loads(text)
    path = rng.choice(sites.all)
    parent, key = _parent(d, path), path[-1]
    value = parent[key]
    if kind == "drop":
        del parent[key]
    elif kind == "duplicate":
        if isinstance(parent, list):
            parent.insert(key, value)
        else:
            parent[f"{key}_copy" if rng.random() < 0.5 else key] = value
    elif kind == "retype":
        parent[key] = rng.choice(VALUES)
    elif kind == "number":
        p = rng.choice(sites.numbers)
        v = _parent(d, p)[p[-1]]
        _parent(d, p)[p[-1]] = rng.choice([0, -v, v * 1000, v + 1, 2**53 + 1, float(v) / 3])
    elif kind == "placement":
        p = rng.choice(sites.placements)
        _parent(d, p)[p[-1]] = rng.choice(PLACEMENTS)
    elif kind == "name":
        p = rng.choice(sites.strings)
        _parent(d, p)[p[-1]] = rng.choice(["", "\x1b]0;pwned\x07", "layers.99.x", "é" * 50,
                                           _parent(d, p)[p[-1]] + "\n"])
    elif kind == "swap" and isinstance(parent, dict):
        other = rng.choice(list(parent))
        parent[key], parent[other] = parent[other], parent[key]
    return kind, json.dumps(d, separators=rng.choice([(",", ":"), (", ", ": ")]))


def test_mutated_plans_load_or_say_why(original, tmp_path):
    path, data = original
    text = path.read_text()
    reference = Plan.load(path).explain()
    rng = random.Random(0)
    sites = Sites(data)
    counts = {"loaded": 0, "refused": 0}
    failures = []
    for i in range(MUTANTS):
        kind, mutant = mutate(rng, sites, text)
        f = tmp_path / "mutant.json"
        f.write_bytes(mutant.encode("utf-8", "surrogateescape") if kind != "bytes"
                      else mutant.encode("latin-1"))
        try:
            plan = Plan.load(f)
            shown = plan.explain()
            if counts["loaded"] % 4 == 0:  # (a save syncs the disk: every 4th is enough)
                plan.save(tmp_path / "again.json")
                again = Plan.load(tmp_path / "again.json").explain()
                assert again == shown, "explanation changed across save and load"
            assert "\x1b" not in shown and "\x07" not in shown, "control character printed"
            if mutant.strip() == text.strip():
                assert shown == reference
            counts["loaded"] += 1
        except PlanError as e:
            if str(f) not in str(e):
                failures.append(f"#{i} {kind}: the error does not name the file: {e}")
            counts["refused"] += 1
        except Exception as e:  # noqa: BLE001 - exactly what this test hunts
            failures.append(f"#{i} {kind}: {type(e).__name__}: {e}")
    print(f"{MUTANTS} mutants: {counts['loaded']} loaded and explained, {counts['refused']} "
          "refused with a PlanError")
    assert not failures, "\n".join(failures[:20])
    assert counts["loaded"] > 100 and counts["refused"] > 1000, counts
