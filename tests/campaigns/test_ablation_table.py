"""scripts/bench/ablations/ablation_table.py: the ablation table holds every finished row, whatever rows the
last call trained."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers import load_script


def fake_row(folder: Path, loss: str, tau: float, evals=("eval", "eval-chain-5"), steps: int = 300) -> None:
    """A pipeline run folder as objective_ablation.sh leaves it (only the files the table reads)."""
    folder.mkdir(parents=True)
    (folder / "config.resolved.yaml").write_text(yaml.safe_dump(
        {"drafter": {"kind": "eagle3", "loss": loss}, "train": {}}))
    (folder / "train_summary.json").write_text(json.dumps({"steps": steps, "seconds": 900.0,
                                                           "selected": None}))
    (folder / "metrics.jsonl").write_text(json.dumps({"split": "validation", "acc_top1/step0": 0.4,
                                                      "acc_top1/step1": 0.3, "expected_tau": 1.6,
                                                      "expected_tau_serving": 1.9}) + "\n")
    for name in evals:
        (folder / name).mkdir()
        (folder / name / "summary.json").write_text(json.dumps(
            {"tau": tau, "acceptance_by_depth": [0.4, 0.3], "n_prompts": 24, "max_new_tokens": 128}))


def test_unfinished_rows_are_named_and_left_out(tmp_path, monkeypatch, capsys):
    fake_row(tmp_path / "kl", "kl", 1.50)
    fake_row(tmp_path / "nla", "nla", 1.49)
    fake_row(tmp_path / "lk_hybrid", "lk_hybrid", 1.51, evals=("eval",))  # its chain-5 eval has not run yet
    # tvd: never trained
    monkeypatch.setattr(sys, "argv", ["ablation_table.py", str(tmp_path), "kl", "tvd", "nla", "lk_hybrid",
                                      "--evals", "eval", "eval-chain-5"])
    load_script("ablations/ablation_table").main()
    table = json.loads((tmp_path / "table.json").read_text())
    assert [r["row"] for r in table] == ["kl", "nla"]  # the order asked, finished rows only
    assert [r["eval"]["tau"] for r in table] == [1.50, 1.49]
    assert table[0]["val_top1"] == 0.4 and table[0]["loss"] == "kl"
    assert table[0]["val_top1_ttt"] == [0.4, 0.3]  # every training-time-test step, as README's table shows
    assert (table[0]["val_expected_tau"], table[0]["val_expected_tau_serving"]) == (1.6, 1.9)
    printed = capsys.readouterr().out
    assert "tvd: not finished" in printed and "lk_hybrid: not finished" in printed
    assert "eval-chain-5/summary.json" in printed.split("lk_hybrid: not finished")[1].splitlines()[0]
    assert "warning" not in printed  # same steps, data and prompts: one equal-budget table


def test_rows_from_calls_with_other_budgets_are_warned_about(tmp_path, monkeypatch, capsys):
    fake_row(tmp_path / "kl", "kl", 1.50)
    fake_row(tmp_path / "tvd", "tvd", 1.52, steps=600)  # e.g. a later `STEPS=600 LOSSES=tvd` call
    # a name twice: once
    monkeypatch.setattr(sys, "argv", ["ablation_table.py", str(tmp_path), "kl", "tvd", "kl"])
    load_script("ablations/ablation_table").main()
    assert [r["row"] for r in json.loads((tmp_path / "table.json").read_text())] == ["kl", "tvd"]
    assert "warning: rows differ in train steps: kl 300, tvd 600" in capsys.readouterr().out


def test_no_finished_row_is_an_error_naming_what_a_row_needs(tmp_path, monkeypatch):
    fake_row(tmp_path / "kl", "kl", 1.5, evals=("eval",))
    monkeypatch.setattr(sys, "argv",
                        ["ablation_table.py", str(tmp_path), "kl", "kl", "--evals", "eval", "eval-chain-5"])
    with pytest.raises(SystemExit, match="eval-chain-5/summary.json"):
        load_script("ablations/ablation_table").main()
