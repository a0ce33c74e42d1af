"""`titan-autopar ab --rounds`: arms take turns to go first, each run has its own folder, and
the figures are medians over rounds, auto over the recipe the median of within-round ratios."""

from __future__ import annotations

import json

import pytest

from titan_autopar.titan.ab import (RESULT_KEYS, arm_folder, auto_over_recipe, fresh_folder,
                                    over_rounds, round_order, table)


def _arm(tps: list[float], steps: list[float], mem: list[float]) -> dict:
    return over_rounds([{"tokens_per_s_per_rank": t, "step_time_s": s, "peak_memory_gib": m,
                         "final_loss": 5.00627} for t, s, m in zip(tps, steps, mem)])


def test_arms_alternate_and_each_run_has_its_own_folder():
    assert [round_order(r) for r in range(3)] == [("auto", "recipe"), ("recipe", "auto"),
                                                  ("auto", "recipe")]
    assert [arm_folder("auto", r) for r in range(3)] == ["auto", "auto_round2", "auto_round3"]


def test_figures_are_medians_and_the_ratio_is_taken_within_rounds():
    # round 2 ran under load: both arms slow. The ratio within each round is 1.1, 1.1, 0.9.
    auto = _arm([550, 220, 450], [0.93, 2.33, 1.14], [0.8, 0.82, 0.8])
    recipe = _arm([500, 200, 500], [1.02, 2.56, 1.02], [0.75, 0.75, 0.75])
    assert auto["tokens_per_s_per_rank"] == 450 and recipe["tokens_per_s_per_rank"] == 500
    assert auto["step_time_s"] == 1.14 and auto["peak_memory_gib"] == 0.82
    assert auto["rounds_spread_pct"] == pytest.approx(100 * (2.33 - 0.93) / 1.14, abs=0.05)
    # the ratio of the medians would say 0.9; two of three rounds say 1.1
    assert auto_over_recipe(auto, recipe) == 1.1
    result = {"rounds": 3, "auto": auto, "recipe": recipe, "auto_over_recipe": 1.1,
              "loss": {"auto": {1: 8.0}, "recipe": {1: 8.0}},
              "predicted": {"hardware": "cpu", "auto_step_time_s": 1.0,
                            "auto_peak_memory_gib": 0.1, "recipes_step_time_s": {"fsdp": 1.1}}}
    text = table(result)
    assert "spread over rounds" in text and "1.100x" in text and "median over 3 rounds" in text


def test_one_round_keeps_its_own_figures():
    auto = _arm([508], [1.0079], [0.8])
    recipe = _arm([545], [0.9394], [0.75])
    assert auto["step_time_s"] == 1.0079 and auto_over_recipe(auto, recipe) == round(508 / 545, 3)


def test_an_earlier_ab_with_rounds_is_cleared_and_nothing_else(tmp_path):
    out = tmp_path / "ab"
    for name in ("seed", "auto", "recipe", "auto_round2", "recipe_round2"):
        (out / name).mkdir(parents=True)
    (out / "ab.json").write_text(json.dumps(dict.fromkeys(RESULT_KEYS)))  # its keys, as run_ab writes
    said = []
    fresh_folder(out, said.append)
    assert list(out.iterdir()) == [] and "cleared" in said[0]
    (out / "auto_round2x").mkdir()
    with pytest.raises(ValueError, match="auto_round2x"):
        fresh_folder(out)


def test_rank_zeros_step_lines_are_read():
    """TorchTitan's step lines as its trainer prints them (colours, torchrun's rank prefix):
    rank 0's are read, every other rank's passed over."""
    from titan_autopar.titan.ab import step_figures

    line = ("[rank{r}]:[titan] 2026-12-07 23:38:40,101 - root - INFO - \x1b[31mstep:  {s}  "
            "\x1b[32mloss:  {loss}  \x1b[33mgrad_norm:  1.2345  \x1b[34mmemory:  0.42GiB(1.05%)  "
            "\x1b[34mtps: 1,234  \x1b[36mtflops: 0.01  \x1b[35mmfu: 0.00%\x1b[39m")
    out = "\n".join([line.format(r=0, s=1, loss="8.03391"), line.format(r=1, s=1, loss="9.0"),
                     "[rank0]:[titan] ... - root - INFO - Saving a full checkpoint at step 2",
                     line.format(r=0, s=2, loss="7.79958")])
    assert step_figures(out) == {1: {"loss": 8.03391, "memory_gib": 0.42, "tps": 1234.0},
                                 2: {"loss": 7.79958, "memory_gib": 0.42, "tps": 1234.0}}
