"""scripts/bench/levers.py: rows read from their own folders, paired against the baseline; the page renders them."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers import load_script


def fake_row(folder: Path, kind: str, accepts: dict[str, list[int]], evals=("chain-5",), steps: int = 300,
             ttt: int | None = 3, lookup: float = 1.0) -> None:
    """A levers.sh row folder (only the files the collector reads): per prompt id its accept lengths."""
    folder.mkdir(parents=True)
    (folder / "config.resolved.yaml").write_text(yaml.safe_dump(
        {"drafter": {"kind": kind, "loss": "kl", "lookup_weight": lookup, kind: {"ttt_steps": ttt} if ttt else {}},
         "train": {"lr": 5e-4}}))
    (folder / "train_summary.json").write_text(json.dumps({"steps": steps, "seconds": 1.5 * steps,
                                                           "samples_seen": 4 * steps}))
    (folder / "data.json").write_text(json.dumps({"train": 1200}))
    times = [0.0, 15.0, 30.0, 90.0]  # 1.5 s per step, and one interval a validation pass stretched
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": 10 * (i + 1), "split": "train", "time": t}) + "\n"
                                                  for i, t in enumerate(times)))
    for name in evals:
        (folder / f"eval-{name}").mkdir()
        flat = [a for lengths in accepts.values() for a in lengths]
        (folder / f"eval-{name}" / "summary.json").write_text(json.dumps(
            {"tau": sum(flat) / len(flat), "acceptance_by_depth": [0.3, 0.1], "n_prompts": len(accepts),
             "max_new_tokens": 128, "dtype": "bfloat16", "tree": name, "tokens_per_s": 20.0,
             "offset": 80 if name.startswith("choice-") else 0,
             "baseline_tokens_per_s": 25.0 if "fp32" in name else None, "step_ms": {"draft": 5.0, "verify": 40.0}}))
        (folder / f"eval-{name}" / "samples.jsonl").write_text(
            "".join(json.dumps({"id": i, "accept_lengths": a}) + "\n" for i, a in accepts.items()))


def test_rows_are_paired_against_the_baseline_and_rendered(tmp_path, monkeypatch):
    base = {f"p{i}": [1, 2, 1, 1] for i in range(8)}
    better = {f"p{i}": [2, 2, 1, 2] for i in range(8)}  # +0.5 tau on every prompt
    fake_row(tmp_path / "eagle3", "eagle3", base, evals=("chain-5", "chain-4-fp32", "choice-dynamic-16"))
    fake_row(tmp_path / "ttt1", "eagle3", better, ttt=1, evals=("chain-5", "choice-dynamic-16"))
    fake_row(tmp_path / "dflash", "dflash", base, evals=("chain-4-fp32",), ttt=None)
    (tmp_path / "epochs3").mkdir()  # not trained yet: named, left out
    monkeypatch.setattr(sys, "argv", ["levers.py", str(tmp_path), "--command", "bash scripts/bench/levers.sh X Y"])
    load_script("levers").main()
    data = json.loads((tmp_path / "levers.json").read_text())
    assert sorted(data["rows"]) == ["dflash", "eagle3", "ttt1"] and data["unfinished"] == ["epochs3"]
    paired = data["rows"]["ttt1"]["paired"]["chain-5"]
    assert paired["delta_tau"] == pytest.approx(0.5) and paired["ci95"] == [pytest.approx(0.5)] * 2
    assert data["rows"]["dflash"]["paired"]["chain-4-fp32"]["delta_tau"] == pytest.approx(0.0)
    assert data["rows"]["ttt1"]["epochs"] == 1.0 and data["rows"]["eagle3"]["ttt_steps"] == 3
    assert data["rows"]["ttt1"]["median_step_seconds"] == 1.5  # not the stretched interval
    page = "\n".join(load_script("results_pages").render_levers(data))
    assert "| ttt1 | TTT 1 |" in page and "0.500 [0.500, 0.500]" in page
    assert "| dflash | dflash |" in page and "0.80" in page  # 20 of plain's 25 tokens/s
    # the choice split: the rows judged on other prompts, paired there too, the prompts named by their offset
    assert data["rows"]["ttt1"]["paired"]["choice-dynamic-16"]["delta_tau"] == pytest.approx(0.5)
    assert "Spec-Bench's prompts 80–87" in page and "| ttt1 | TTT 1 | 1.750 (0.500 [0.500, 0.500]) | — |" in page


def test_the_validation_gap_page_renders_both_splits_and_the_ratios():
    """scripts/bench/validation_gap.py's JSON -> its page: per row the measured τ beside the estimate on each split."""
    est = lambda tree, chain: {"sequences": 160, "tokens": 19000, "expected_tau_serving": tree,  # noqa: E731
                               "expected_tau_joint": chain}
    row = {"steps": 300, "logged": {"expected_tau_serving": 1.878},
           "held_out": est(1.875, 1.551), "eval_distribution": est(1.52, 1.23),
           "measured": {"dynamic-16": {"tau": 1.4745, "prompts": 40, "dtype": "bfloat16"},
                        "chain-5": {"tau": 1.2193, "prompts": 40, "dtype": "bfloat16"}},
           "ratio": {"held_out": {"dynamic-16": 1.2716, "chain-5": 1.272},
                     "eval_distribution": {"dynamic-16": 1.0309, "chain-5": 1.0088}}}
    page = "\n".join(load_script("results_pages").render_validation_gap(
        {"data": "/tmp/x/regenerated-validation.jsonl", "data_line": "160/160 records kept", "notes": [],
         "rows": {"eagle3": row}}))
    assert "| eagle3 | 300 | 1.474 | 1.875 (1.272) | 1.520 (1.031) | 1.219 | 1.551 (1.272) | 1.230 (1.009) |" in page
    assert "within 0.003 τ" in page and "160 conversations (19,000 answer tokens)" in page
