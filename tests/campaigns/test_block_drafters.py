"""scripts/bench/block_drafters/block_drafters.py: block rows paired against EAGLE-3 and the shipped DFlash,
each `-acc` row against the decay twin it differs from in one lever; the page renders both."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers import load_script

EVALS = ("choice-chain-4", "report-chain-4")


def block_row(folder: Path, kind: str, accepts: dict[str, list[int]], own: dict | None = None) -> None:
    """A block_drafters.sh row folder (the files the collector reads): per prompt id its accept lengths."""
    folder.mkdir(parents=True)
    (folder / "config.resolved.yaml").write_text(yaml.safe_dump(
        {"drafter": {"kind": kind, "loss": "kl", "num_speculative_tokens": 4, "head_decay": 0.8,
                     kind: {"num_layers": 2, **(own or {})}},
         "train": {"lr": 5e-4}, "data": {"limit": 2000}}))
    (folder / "train_summary.json").write_text(json.dumps({"steps": 300, "seconds": 450.0,
                                                           "samples_seen": 1200}))
    (folder / "data.json").write_text(json.dumps({"train": 1200}))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 10, "split": "train", "time": 0.0}) + "\n")
    for name in EVALS:
        (folder / f"eval-{name}").mkdir()
        flat = [a for lengths in accepts.values() for a in lengths]
        (folder / f"eval-{name}" / "summary.json").write_text(json.dumps(
            {"tau": 1 + sum(flat) / len(flat), "acceptance_by_depth": [0.3, 0.1], "n_prompts": len(accepts),
             "max_new_tokens": 128, "dtype": "float32", "tree": "chain-4", "tokens_per_s": 20.0,
             "offset": 80 if name.startswith("choice-") else 0}))
        (folder / f"eval-{name}" / "samples.jsonl").write_text(
            "".join(json.dumps({"id": i, "accept_lengths": a}) + "\n" for i, a in accepts.items()))


def test_each_acceptance_row_is_paired_against_its_decay_twin(tmp_path, monkeypatch):
    lengths = {f"p{i}": [0, 1, 0, 0] for i in range(8)}
    plus = {f"p{i}": [1, 1, 0, 1] for i in range(8)}  # +0.5 accepted per step on every prompt
    block_row(tmp_path / "eagle3", "eagle3", lengths, {"ttt_steps": 3})
    block_row(tmp_path / "eagle3-acc", "eagle3", plus, {"ttt_steps": 3, "step_weights": "acceptance"})
    block_row(tmp_path / "dflash", "dflash", lengths)
    block_row(tmp_path / "dspark", "dspark", lengths, {"markov_rank": 256})
    block_row(tmp_path / "dspark-acc", "dspark", plus, {"markov_rank": 256, "slot_weights": "acceptance"})
    block_row(tmp_path / "eagle3-muon10", "eagle3", lengths, {"ttt_steps": 3})  # a lever of the baseline
    block_row(tmp_path / "eagle3-muon10-nbf", "eagle3", plus, {"ttt_steps": 3, "norm_before_fc": True})
    monkeypatch.setattr(sys, "argv", ["block_drafters.py", str(tmp_path), "--command", "bash X"])
    load_script("block_drafters/block_drafters").main()
    data = json.loads((tmp_path / "block-drafters.json").read_text())
    rows = data["rows"]
    for name, twin in (("eagle3-acc", "eagle3"), ("dspark-acc", "dspark"),
                       ("eagle3-muon10-nbf", "eagle3-muon10")):
        assert rows[name]["paired_twin"]["twin"] == twin
        assert all(rows[name]["paired_twin"][e]["delta_tau"] == pytest.approx(0.5) for e in EVALS)
    # the baseline's own levers are paired against it already (`paired`), not again as a twin
    assert not any("paired_twin" in rows[n] for n in ("eagle3", "dflash", "dspark", "eagle3-muon10"))
    assert rows["dspark-acc"]["paired_dflash"]["choice-chain-4"]["delta_tau"] == pytest.approx(0.5)
    assert data["pick"] == "dspark-acc"  # the block rows only: eagle3-acc is a lever of the baseline
    page = "\n".join(load_script("block_drafters/page").render_block_drafters(data))
    assert "| dspark-acc | dspark | 0.500 [0.500, 0.500] | 0.500 [0.500, 0.500] |" in page
    assert "| eagle3-acc | eagle3 | 0.500 [0.500, 0.500] | 0.500 [0.500, 0.500] |" in page


def test_eagle3_levers_alone_are_paired_against_eagle3_and_named(tmp_path, monkeypatch):
    """The eagle3-ablations page: Muon and the EAGLE-3.1 norms rows, no block row (no pick)."""
    lengths = {f"p{i}": [0, 1, 0, 0] for i in range(8)}
    block_row(tmp_path / "eagle3", "eagle3", lengths, {"ttt_steps": 3})
    block_row(tmp_path / "eagle3-norms", "eagle3", lengths,
              {"ttt_steps": 3, "norm_before_fc": True, "norm_output": True})
    block_row(tmp_path / "eagle3-muon", "eagle3", {f"p{i}": [1, 1, 0, 1] for i in range(8)}, {"ttt_steps": 3})
    cfg = tmp_path / "eagle3-muon" / "config.resolved.yaml"
    cfg.write_text(cfg.read_text().replace("lr: 0.0005", "lr: 0.0005\n  optimizer: muon"))
    monkeypatch.setattr(sys, "argv", ["block_drafters.py", str(tmp_path), "--command", "bash X"])
    load_script("block_drafters/block_drafters").main()
    data = json.loads((tmp_path / "block-drafters.json").read_text())
    assert "pick" not in data and data["rows"]["eagle3-muon"]["shape"]["optimizer"] == "muon"
    assert data["rows"]["eagle3-muon"]["paired"]["report-chain-4"]["delta_tau"] == pytest.approx(0.5)
    page = "\n".join(load_script("block_drafters/page").render_block_drafters(data))
    assert "EAGLE-3, TTT 3, EAGLE-3.1 norms (norm_before_fc, norm_output)" in page
    assert "EAGLE-3, TTT 3, muon" in page
