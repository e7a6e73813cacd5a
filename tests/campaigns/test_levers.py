"""scripts/bench/levers/levers.py: rows read from their own folders, paired against the baseline; the page
renders them."""

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
        {"drafter": {"kind": kind, "loss": "kl", "lookup_weight": lookup,
                     kind: {"ttt_steps": ttt} if ttt else {}},
         "train": {"lr": 5e-4}}))
    (folder / "train_summary.json").write_text(json.dumps({"steps": steps, "seconds": 1.5 * steps,
                                                           "samples_seen": 4 * steps}))
    (folder / "data.json").write_text(json.dumps({"train": 1200}))
    times = [0.0, 15.0, 30.0, 90.0]  # 1.5 s per step, and one interval a validation pass stretched
    (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": 10 * (i + 1), "split": "train",
                                                              "time": t}) + "\n"
                                                  for i, t in enumerate(times)))
    for name in evals:
        (folder / f"eval-{name}").mkdir()
        flat = [a for lengths in accepts.values() for a in lengths]
        (folder / f"eval-{name}" / "summary.json").write_text(json.dumps(
            {"tau": sum(flat) / len(flat), "acceptance_by_depth": [0.3, 0.1], "n_prompts": len(accepts),
             "max_new_tokens": 128, "dtype": "bfloat16", "tree": name, "tokens_per_s": 20.0,
             "offset": 80 if name.startswith("choice-") else 0,
             "baseline_tokens_per_s": 25.0 if "fp32" in name else None,
             "step_ms": {"draft": 5.0, "verify": 40.0}}))
        (folder / f"eval-{name}" / "samples.jsonl").write_text(
            "".join(json.dumps({"id": i, "accept_lengths": a}) + "\n" for i, a in accepts.items()))


def test_rows_are_paired_against_the_baseline_and_rendered(tmp_path, monkeypatch):
    base = {f"p{i}": [1, 2, 1, 1] for i in range(8)}
    better = {f"p{i}": [2, 2, 1, 2] for i in range(8)}  # +0.5 tau on every prompt
    fake_row(tmp_path / "eagle3", "eagle3", base, evals=("chain-5", "chain-4-fp32", "choice-dynamic-16"))
    fake_row(tmp_path / "ttt1", "eagle3", better, ttt=1, evals=("chain-5", "choice-dynamic-16"))
    fake_row(tmp_path / "dflash", "dflash", base, evals=("chain-4-fp32",), ttt=None)
    (tmp_path / "epochs3").mkdir()  # not trained yet: named, left out
    monkeypatch.setattr(sys, "argv",
                        ["levers.py", str(tmp_path), "--command", "bash scripts/bench/levers/levers.sh X Y"])
    load_script("levers/levers").main()
    data = json.loads((tmp_path / "levers.json").read_text())
    assert sorted(data["rows"]) == ["dflash", "eagle3", "ttt1"] and data["unfinished"] == ["epochs3"]
    paired = data["rows"]["ttt1"]["paired"]["chain-5"]
    assert paired["delta_tau"] == pytest.approx(0.5) and paired["ci95"] == [pytest.approx(0.5)] * 2
    assert data["rows"]["dflash"]["paired"]["chain-4-fp32"]["delta_tau"] == pytest.approx(0.0)
    assert data["rows"]["ttt1"]["epochs"] == 1.0 and data["rows"]["eagle3"]["ttt_steps"] == 3
    assert data["rows"]["ttt1"]["median_step_seconds"] == 1.5  # not the stretched interval
    page = "\n".join(load_script("levers/page").render_levers(data))
    assert "| ttt1 | TTT 1 |" in page and "0.500 [0.500, 0.500]" in page
    assert "| dflash | dflash |" in page and "0.80" in page  # 20 of plain's 25 tokens/s
    # the choice split: the rows judged on other prompts, paired there too, the prompts named by their offset
    assert data["rows"]["ttt1"]["paired"]["choice-dynamic-16"]["delta_tau"] == pytest.approx(0.5)
    assert ("Spec-Bench's prompts 80–87" in page
            and "| ttt1 | TTT 1 | 1.750 (0.500 [0.500, 0.500]) | — |" in page)



def test_readback_gives_the_baselines_settings_and_the_steps_of_a_wall_clock_row(tmp_path):
    """levers.sh reads these before it trains a row: the baseline's data limit, steps, lr and steps per epoch,
    and the steps a row's seconds per step buy in the baseline's seconds."""
    ours = tmp_path / "peer" / "ours"
    (ours / "features" / "train").mkdir(parents=True)
    (ours / "config.resolved.yaml").write_text(yaml.safe_dump({"data": {"limit": 2000},
                                                                "train": {"lr": 5e-4, "batch_size": 4}}))
    (ours / "train_summary.json").write_text(json.dumps({"steps": 300, "seconds": 600.0}))
    (ours / "features" / "train" / "index.json").write_text(json.dumps({"num_sequences": 1977}))
    row = tmp_path / "ttt1"
    row.mkdir()
    (row / "train_summary.json").write_text(json.dumps({"steps": 300, "seconds": 450.0}))  # 1.5 s a step
    readback = load_script("levers/readback")
    assert readback.baseline(tmp_path / "peer") == "2000 300 0.0005 495"
    assert readback.wall_steps(ours, row) == 400
