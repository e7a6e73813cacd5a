"""scripts/bench/full_recipes/full_recipes.py: pipeline run folders (resolved config, train summary, metrics,
eval summaries) into one campaign JSON, with EAGLE-3's full recipe from a committed engine campaign as the
reference, and its page."""

import json
import sys
from pathlib import Path

import pytest
import yaml
from helpers import load_script

from draftsmith.train.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def fake_run(run: Path, recipe: str, tau: float, overrides: tuple[str, ...] = (),
             selected: dict | None = None) -> None:
    run.mkdir(parents=True)
    (run / "config.resolved.yaml").write_text(yaml.safe_dump(load_config(recipe, list(overrides)).to_dict()))
    (run / "train_summary.json").write_text(json.dumps({"steps": 30, "seconds": 36.0, "samples_seen": 120,
                                                        "assistant_tokens_seen": 9000, "budget": None,
                                                        "selected": selected}))
    lines = [{"step": s, "split": "train", "time": 1000.0 + 1.2 * s} for s in (10, 20, 30)]
    lines.insert(2, {"step": 20, "split": "validation", "expected_tau": 1.3, "expected_tau_serving": 1.31})
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    (run / "eval").mkdir()
    (run / "eval" / "summary.json").write_text(json.dumps({
        "tau": tau, "acceptance_by_depth": [0.3, 0.1, 0.05, 0.0], "n_prompts": 4, "offset": 0,
        "max_new_tokens": 16,
        "dtype": "torch.float32", "tree": "chain-4", "tokens_per_s": 20.0, "speedup": 0.9,
        "greedy_equal_count": 4, "step_ms": {"draft": 10.0, "verify": 80.0, "accept": 1.0}}))


def test_rows_reference_and_page(tmp_path, monkeypatch):
    script = load_script("full_recipes/full_recipes")
    fake_run(tmp_path / "dflash", "smollm2-dflash", 1.2)
    fake_run(tmp_path / "peagle", "smollm2-peagle", 1.3)
    out = tmp_path / "full.json"
    monkeypatch.setattr(sys, "argv", ["full_recipes.py", str(out), f"smollm2-dflash={tmp_path / 'dflash'}",
                                      f"smollm2-peagle={tmp_path / 'peagle'}", "--reference",
                                      f"{ROOT}/docs/results/data/engine-served-goal.json:eagle3-full",
                                      "--note", "n"])
    (tmp_path / "peagle" / "engine").mkdir()  # peagle served by vLLM
    (tmp_path / "peagle" / "engine" / "summary.json").write_text(json.dumps({
        "engine_version": "0.32.0", "num_speculative_tokens": 4, "n_prompts": 2, "tau": 1.31,
        "alpha_by_position": [0.3, 0.01, 0.0, 0.0], "tokens_per_s": 30.0, "baseline_tokens_per_s": 28.0,
        "speedup": 1.07, "greedy_equal": True, "greedy_equal_count": 2, "comparison": {"agree": True},
        "ours": {"tau": 1.31, "alpha_by_position": [0.3, 0.01, 0.0, 0.0], "dtype": "torch.float32"}}))
    script.main()
    data = json.loads(out.read_text())
    dflash, peagle = data["rows"]
    assert "engine" not in dflash and peagle["engine"]["agree"] and peagle["engine"]["ours"]["tau"] == 1.31
    assert (dflash["kind"], peagle["kind"]) == ("dflash", "peagle")
    assert (dflash["median_step_seconds"] == pytest.approx(1.2)
            and dflash["validation"]["expected_tau_serving"] == 1.31)
    assert dflash["evals"]["eval"]["tau"] == 1.2 and data["notes"] == ["n"] and data["host"]["device"]
    assert list(data["reference"]["chains"]) == ["4"]  # only the chain an eval here drafted
    assert data["reference"]["chains"]["4"]["tau"] > 1
    page = "\n".join(load_script("full_recipes/page").render_full_recipes(data))
    assert "| smollm2-peagle | peagle |" in page and "chain-4" in page and "4/4" in page
    assert "| smollm2-peagle | 0.300 / 0.010 / 0.000 / 0.000 | 0.300 / 0.010 / 0.000 / 0.000 | yes |" in page


def test_evals_with_the_same_settings_share_a_table(tmp_path, monkeypatch):
    script = load_script("full_recipes/full_recipes")
    fake_run(tmp_path / "dflash", "smollm2-dflash", 1.2)
    fake_run(tmp_path / "peagle", "smollm2-peagle", 1.3)
    # the same settings, another folder
    (tmp_path / "dflash" / "eval").rename(tmp_path / "dflash" / "eval-fp32")
    out = tmp_path / "full.json"
    monkeypatch.setattr(sys, "argv", ["full_recipes.py", str(out), f"d={tmp_path / 'dflash'}",
                                      f"p={tmp_path / 'peagle'}", "--evals", "eval", "eval-fp32"])
    script.main()
    data = json.loads(out.read_text())
    assert list(data["rows"][0]["evals"]) == ["eval-fp32"] and list(data["rows"][1]["evals"]) == ["eval"]
    page = load_script("full_recipes/page").render_full_recipes(data)
    assert sum(line.startswith("**4 Spec-Bench prompts") for line in page) == 1
    assert (any(line.startswith("| d | chain-4 |") for line in page)
            and any(line.startswith("| p |") for line in page))


def test_an_unfinished_run_is_named(tmp_path, monkeypatch):
    script = load_script("full_recipes/full_recipes")
    fake_run(tmp_path / "dflash", "smollm2-dflash", 1.2)
    (tmp_path / "dflash" / "eval" / "summary.json").unlink()
    monkeypatch.setattr(sys, "argv",
                        ["full_recipes.py", str(tmp_path / "o.json"), f"d={tmp_path / 'dflash'}"])
    with pytest.raises(SystemExit, match="has none of eval/summary.json"):
        script.main()


def test_a_run_judged_twice_the_same_way_shows_once(tmp_path, monkeypatch):
    """The pipeline's own eval and a rerun with the timing baselines, same prompts, dtype and tree: the first
    in --evals order is kept and the other named; another tree of the same run is a row of its own (the
    twin)."""
    script = load_script("full_recipes/full_recipes")
    fake_run(tmp_path / "peagle", "smollm2-peagle", 1.3)
    run = tmp_path / "peagle"
    again = json.loads((run / "eval" / "summary.json").read_text())
    (run / "eval-timed").mkdir()
    (run / "eval-timed" / "summary.json").write_text(json.dumps({**again, "speedup": 0.8}))
    (run / "eval-chain3").mkdir()
    (run / "eval-chain3" / "summary.json").write_text(json.dumps({**again, "tree": "chain-3"}))
    out = tmp_path / "full.json"
    monkeypatch.setattr(sys, "argv",
                        ["full_recipes.py", str(out), f"p={run}", "--evals", "eval-timed", "eval",
                                      "eval-chain3"])
    script.main()
    row = json.loads(out.read_text())["rows"][0]
    assert (list(row["evals"]) == ["eval-timed", "eval-chain3"]
            and row["evals"]["eval-timed"]["speedup"] == 0.8)
    assert row["evals_same_as"] == {"eval": "eval-timed"}


def test_an_offline_recipe_beside_the_recipe_it_replaces(tmp_path, monkeypatch):
    """The eagle3-recipe page: a run from offline features, its kept checkpoint's estimate over the τ its
    pipeline eval measured, and the reference named as what it is to the row (not 'equal training budget')."""
    script = load_script("full_recipes/full_recipes")
    fake_run(tmp_path / "e3", "smollm2-eagle3", 1.6,
             ("extract.enabled=true", "train.epochs=3", "train.max_minutes=null"),
             {"by": "expected_tau", "step": 20, "expected_tau": 1.76, "metric": "expected_tau_serving"})
    out = tmp_path / "e3.json"
    monkeypatch.setattr(sys, "argv",
                        ["full_recipes.py", str(out), f"smollm2-eagle3={tmp_path / 'e3'}", "--reference",
                                      f"{ROOT}/docs/results/data/engine-served-goal.json:eagle3-full",
                                      "--reference-label", "The 0.7-epoch recipe it replaces"])
    script.main()
    data = json.loads(out.read_text())
    row = data["rows"][0]
    assert (row["features"], row["epochs_asked"], row["selected"]["step"]) == ("offline", 3.0, 20)
    page = "\n".join(load_script("full_recipes/page").render_full_recipes(data))
    assert "| smollm2-eagle3 | eagle3 | AdamW 0.0005 | offline | 3.0 | 30 (" in page
    assert "| 20 | 1.760 | 1.100 |" in page  # kept step, its estimate, estimate / measured 1.76 / 1.6
    # its cost: training's 36 s; no shard recorded extraction's, and the page says it is left out
    assert row["cost"]["wall_hours"] == 0.01 and row["cost"]["extract"] == "none"
    assert " + extract | 20 |" in page
    assert "The 0.7-epoch recipe it replaces: `eagle3-full`" in page and "equal training budget" not in page


def test_a_row_carried_from_an_earlier_page(tmp_path, monkeypatch):
    """NAME=EARLIER.json#RECIPE: a committed page's row (its run folder gone) beside a run here, named with
    its host and date, its cost kept as its own host recorded; the optimiser column shows each row's (`–` for
    a row collected before it was recorded). The twin: a recipe the file lacks is an error naming what it
    has."""
    script = load_script("full_recipes/full_recipes")
    fake_run(tmp_path / "muon", "smollm2-eagle3", 1.9, ("train.optimizer=muon", "train.muon_lr=5e-3"))
    earlier = tmp_path / "earlier.json"
    old = {"recipe": "smollm2-eagle3", "kind": "eagle3", "lr": 5e-4, "train_steps": 30, "train_seconds": 30.0,
           "epochs_asked": 3.0, "max_minutes": None, "features": "offline", "cost": None,
           "selected": {"step": 30, "expected_tau": 2.4},
           "evals": {"eval": {"tau": 2.43, "acceptance_by_depth": [0.6], "n_prompts": 4, "offset": 0,
                              "max_new_tokens": 16, "dtype": "torch.float32", "tree": "chain-4",
                              "tokens_per_s": 20.0, "speedup": 1.1, "greedy_equal_count": 4,
                              "step_ms": None}}}
    earlier.write_text(json.dumps({"host": {"device": "cpu: Intel Xeon", "date": "2026-12-05 10:00"},
                                   "rows": [old]}))
    out = tmp_path / "o.json"
    monkeypatch.setattr(sys, "argv", ["full_recipes.py", str(out), f"muon={tmp_path / 'muon'}",
                                      f"adamw={earlier}#smollm2-eagle3"])
    script.main()
    data = json.loads(out.read_text())
    muon, adamw = data["rows"]
    assert muon["optimizer"] == "muon" and muon["muon_lr"] == 5e-3 and muon["cost"]
    assert adamw["carried"] == {"source": str(earlier), "recipe": "smollm2-eagle3",
                                "date": "2026-12-05 10:00", "device": "cpu: Intel Xeon"}
    assert adamw["cost"] is None
    page = "\n".join(load_script("full_recipes/page").render_full_recipes(data))
    assert "| muon | eagle3 | Muon 0.005 (AdamW 0.0005 on the rest) |" in page
    assert "| adamw | eagle3 | – |" in page and "cpu: Intel Xeon, 2026-12-05" in page
    assert "| adamw | chain-4 | 2.430 |" in page and "| muon | chain-4 | 1.900 |" in page
    monkeypatch.setattr(sys, "argv", ["full_recipes.py", str(out), f"adamw={earlier}#smollm2-dflash"])
    with pytest.raises(SystemExit, match="has no row 'smollm2-dflash'"):
        script.main()
