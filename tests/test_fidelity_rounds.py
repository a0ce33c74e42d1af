"""benchmarks/fidelity.py's figures when a run fails: the run loses its round, not its arm; the
ratio within a round pairs only rounds where both arms ran; a config where a recipe failed in
every round has no best recipe, and says so instead of comparing auto with the other one."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "fidelity.py"
_spec = importlib.util.spec_from_file_location("fidelity", _PATH)
fidelity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fidelity)

FAILED = {"round": 2, "returncode": 1, "error": "Fatal Python error: Aborted",
          "log": "c/fsdp/round2.log"}


def test_a_failed_run_loses_its_round_not_its_arm():
    r = fidelity.arm_row([(0.90, 600.0), None, (0.95, 580.0)], [FAILED])
    assert r["ok"] and r["failed_rounds"] == [FAILED]
    assert r["measured_runs_tps"] == [600.0, None, 580.0]
    assert r["measured_step_s"] == 0.925 and r["measured_tps"] == 590.0
    assert r["spread_pct"] == pytest.approx(100 * 0.05 / 0.925, abs=0.05)
    gone = fidelity.arm_row([None, None, None], [FAILED, {**FAILED, "round": 3}])
    assert not gone["ok"] and gone["error"] == "Fatal Python error: Aborted"


def test_the_ratio_pairs_only_rounds_where_both_ran():
    auto = fidelity.arm_row([(0.8, 600.0), None, (0.9, 580.0)], [FAILED])
    fsdp = fidelity.arm_row([(1.0, 500.0), (1.0, 520.0), (0.8, 600.0)], [])
    # rounds 1 and 3 pair up: 1.2 and 0.967; the ratio of the medians would say 590 / 520
    assert fidelity.paired_ratio(auto, fsdp) == pytest.approx((1.2 + 580 / 600) / 2)


def _row(config, auto, fsdp, fsdp_tp):
    return {"config": config, "tokens_per_rank": 512,
            "arms": {"fsdp": fsdp, "fsdp_tp": fsdp_tp, "auto": auto}}


def test_a_recipe_that_never_ran_leaves_no_best_recipe(capsys, tmp_path):
    ran = fidelity.arm_row([(1.0, 500.0), (1.0, 500.0), (1.0, 500.0)], [])
    tp = fidelity.arm_row([(0.9, 280.0), (0.9, 280.0), (0.9, 280.0)], [])
    auto = fidelity.arm_row([(0.9, 560.0), (0.9, 550.0), (0.9, 540.0)], [])
    never = fidelity.arm_row([None, None, None], [{**FAILED, "round": 1}, FAILED])
    rows = [_row("both_ran", auto, ran, tp), _row("fsdp_failed", auto, never, tp)]
    fidelity.report(rows, tmp_path / "profile.json")
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # auto over fsdp where both ran (1.12, 1.10, 1.08); not auto over fsdp_tp where fsdp failed
    assert res["auto_over_best_recipe"] == {"both_ran": 1.1}
    assert res["configs_recipe_failed"] == ["fsdp_failed"]
    assert res["arms_failed"] == ["fsdp_failed/fsdp"]
    assert res["rounds_failed"] == ["fsdp_failed/fsdp/round1", "fsdp_failed/fsdp/round2"]
