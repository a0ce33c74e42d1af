"""The `titan-autopar` command: plan a TorchTitan model, explain and diff the saved plans."""

from __future__ import annotations

import json
import subprocess
import sys

from titan_autopar.cli import main, parse_mesh

import pytest


def test_plan_explain_diff(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    common = ["plan", "--model", "llama3", "--flavor", "debugmodel", "--hardware", "h100",
              "--seq-len", "128", "--local-batch-size", "1"]
    assert main(common + ["--mesh", "dp_shard=4", "--out", str(a)]) == 0
    out = capsys.readouterr().out
    assert "[trace]" in out and "[solve]" in out and "wrote" in out  # progress by phase
    assert main(common + ["--mesh", "dp_shard=2,tp=2", "--out", str(b)]) == 0
    capsys.readouterr()
    plan = json.loads(a.read_text())
    assert plan["mesh"] == {"names": ["dp_shard"], "shape": [4], "crosses_nodes": [False]}
    assert len(plan["parameters"]) == 57
    assert main(["explain", str(a)]) == 0
    text = capsys.readouterr().out
    assert "layers.0 (x6" in text and "Expert recipe fsdp" in text
    assert main(["diff", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "fingerprint mesh" in text
    # a reader that stops early (`| head -1`) ends the command quietly
    cut = subprocess.run(f"{sys.executable} -m titan_autopar.cli diff {a} {b} | head -1",
                         shell=True, capture_output=True, text=True, timeout=300)
    assert cut.stdout.splitlines() == text.splitlines()[:1] and cut.stderr == "", cut.stderr


def test_bad_input_is_a_clear_error(tmp_path, capsys):
    assert main(["plan", "--model", "llama3", "--flavor", "nope", "--out", str(tmp_path / "x.json")]) == 2
    assert "debugmodel" in capsys.readouterr().err  # lists the flavors there are
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["explain", str(bad)]) == 2
    assert "not a titan_autopar plan" in capsys.readouterr().err
    with pytest.raises(ValueError, match="name=size"):
        parse_mesh("dp_shard:8")
