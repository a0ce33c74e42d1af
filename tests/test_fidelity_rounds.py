"""benchmarks/fidelity.py's figures when a run fails, and when auto runs a recipe's program: a
failed run loses its round, not its arm; the ratio within a round pairs only rounds where both
arms ran; a config where a recipe failed in every round has no best recipe; auto run as the
recipe counts as that recipe only where its logs show the recipe's program."""

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


def _log(losses, as_recipe=True, ranks=2):
    lines = []
    for r in range(ranks):
        if as_recipe:
            lines.append(f"[rank{r}]:[titan_autopar] the plan gains less than the prices resolve "
                         f"over the fsdp recipe: {fidelity.RUNS_AS_RECIPE} (FSDP2's runtime)")
        lines += [f"[rank{r}]:[titan] step: {s}  loss: {v:.5f}  tps: 500" for s, v in losses.items()]
    return "\n".join(lines) + "\n"


def _folder(tmp_path, auto_logs, fsdp_logs):
    for arm, logs in (("auto", auto_logs), ("fsdp", fsdp_logs)):
        for i, text in enumerate(logs):
            (tmp_path / "c" / arm).mkdir(parents=True, exist_ok=True)
            (tmp_path / "c" / arm / f"round{i + 1}.log").write_text(text)
    return tmp_path / "c"


def test_auto_run_as_the_recipe_is_one_program_only_when_its_logs_say_so(tmp_path, capsys):
    losses = {1: 8.20371, 2: 7.98545, 3: 7.54244}
    recipe = [_log(losses, as_recipe=False)] * 3
    # round 2 ran under load: the same program measured 0.91x in it, 0.94x at the median
    auto = fidelity.arm_row([(1.0, 470.0), (1.1, 430.0), (1.0, 500.0)], [])
    fsdp = fidelity.arm_row([(1.0, 500.0), (1.0, 470.0), (1.0, 530.0)], [])
    auto["runs_as_recipe"] = "fsdp"
    tp = fidelity.arm_row([(0.9, 260.0)] * 3, [])
    arms = {"fsdp": fsdp, "fsdp_tp": tp, "auto": auto}
    assert fidelity.same_program(_folder(tmp_path / "a", [_log(losses)] * 3, recipe), arms, "fsdp")
    # a loss one digit apart, or a run that did not say it ran the recipe: not one program
    other = {**losses, 3: 7.54245}
    assert not fidelity.same_program(
        _folder(tmp_path / "b", [_log(losses), _log(other), _log(losses)], recipe), arms, "fsdp")
    assert not fidelity.same_program(
        _folder(tmp_path / "c", [_log(losses), _log(losses, as_recipe=False), _log(losses)],
                recipe), arms, "fsdp")

    rows = [_row("c", auto, fsdp, tp)]
    fidelity.report(rows, tmp_path / "profile.json", tmp_path / "a")
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["auto_over_best_recipe"] == {"c": 1.0}
    assert res["same_program_as_measured"] == {"c": 0.94}
    fidelity.report(rows, tmp_path / "profile.json", tmp_path / "b")
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["auto_over_best_recipe"] == {"c": 0.94} and res["same_program_as_measured"] == {}
