"""scripts/bench/ablations/curve_table.py: the τ-vs-data curve is read from the run folders, whatever sizes
the last call ran."""

import json
import math
import sys
from pathlib import Path

import pytest
import yaml
from helpers import load_script


def fake_run(folder: Path, limit, tau_tree: float, tau_chain: float, evals=("eval", "eval-chain-5")) -> None:
    """A pipeline run folder as data_curve.sh leaves it (only the files the table reads)."""
    folder.mkdir(parents=True)
    (folder / "config.resolved.yaml").write_text(yaml.safe_dump({"data": {"limit": limit},
                                                                 "train": {"epochs": 1.0}}))
    (folder / "train_summary.json").write_text(json.dumps({"steps": 10, "seconds": 30.0,
                                                           "selected": {"by": "last"}}))
    (folder / "metrics.jsonl").write_text(json.dumps({"split": "validation", "acc_top1/step0": 0.4,
                                                      "acc_top1/step1": 0.3, "expected_tau_serving": 1.9})
                                          + "\n")
    for name, tau in zip(evals, (tau_tree, tau_chain)):
        (folder / name).mkdir()
        (folder / name / "summary.json").write_text(json.dumps(
            {"tau": tau, "acceptance_by_depth": [0.4, 0.3], "n_prompts": 40, "max_new_tokens": 128}))


def test_every_finished_size_is_a_row_and_an_unfinished_one_is_named(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    fake_run(tmp_path / "n2000", 2000, 1.60, 1.30)
    fake_run(tmp_path / "n1000", 1000, 1.50, 1.20)
    fake_run(tmp_path / "nall", None, 1.90, 1.50)
    fake_run(tmp_path / "n4000", 4000, 1.7, 1.4, evals=("eval",))  # its chain-5 eval has not run yet
    monkeypatch.setattr(sys, "argv", ["curve_table.py", str(tmp_path)])
    load_script("ablations/curve_table").main()
    table = json.loads((tmp_path / "curve.json").read_text())
    # sorted by size; all = both vendored sets
    assert [r["answers"] for r in table["rows"]] == [1000, 2000, 12_889]
    assert table["unfinished"] == ["n4000"]
    assert [r["dynamic-16"]["tau"] for r in table["rows"]] == [1.50, 1.60, 1.90]
    assert table["rows"][0]["val_top1_ttt"] == [0.4, 0.3]
    # least squares of τ on log10(answers), computed here independently
    xs = [math.log10(n) for n in (1000, 2000, 12_889)]
    ys = [1.20, 1.30, 1.50]
    mx, my = sum(xs) / 3, sum(ys) / 3
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    assert table["fit"]["chain-5"]["tau_per_decade"] == pytest.approx(slope, abs=1e-4)
    assert (tmp_path / "curve.png").stat().st_size > 0


def test_no_finished_size_is_an_error_naming_what_a_size_needs(tmp_path, monkeypatch):
    fake_run(tmp_path / "n1000", 1000, 1.5, 1.2, evals=("eval",))
    monkeypatch.setattr(sys, "argv", ["curve_table.py", str(tmp_path)])
    with pytest.raises(SystemExit, match="eval-chain-5"):
        load_script("ablations/curve_table").main()
