"""`draftsmith bench` on a tiny target: the fall-back decision from a stubbed calibration (no real timing
is asserted), a fallen-back configuration is the plain loop's own tally (no second timing), the CLI
writes bench.json, one JSON per configuration, the peers and the PNGs, and `write_report` links its
PNGs under one table; the comparison table claims greedy equality in fp32 only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import build_tiny_model_dir

from draftsmith.distill.loading import ModelConfig
from draftsmith.eval.decode.decoder import SpeculativeDecoder
from draftsmith.eval.measure import bench as bench_module
from draftsmith.eval.measure.bench import BenchConfig, Calibration, drafter_label, fallback_reason, run_bench
from draftsmith.eval.measure.plots import write_report
from draftsmith.eval.measure.report import format_table, summary_row
from draftsmith.eval.serving import decide
from draftsmith.heads.registry import DrafterConfig
from draftsmith.train.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models run fastest on one thread


def test_fallback_reason_from_the_calibration():
    slow = Calibration(speculative_tokens_per_s=80.0, plain_tokens_per_s=100.0, tau=1.4, new_tokens=64)
    reason = fallback_reason(slow, batch_size=16)
    assert reason and "batch 16" in reason and "80.0 tok/s" in reason and "×0.80" in reason
    fast = Calibration(speculative_tokens_per_s=150.0, plain_tokens_per_s=100.0, tau=2.0, new_tokens=64)
    assert fallback_reason(fast, 4) is None
    assert fallback_reason(fast, 4, margin=0.6) is not None  # not faster by the required margin
    tie = Calibration(100.0, 100.0, 1.0, 64)
    assert fallback_reason(tie, 1) is not None  # a tie is not worth the drafting


@pytest.mark.parametrize("speculative_wins", [False, True])
def test_fallen_back_configuration_decodes_plainly(tiny_llama_dir, tmp_path, monkeypatch, speculative_wins):
    rate = 200.0 if speculative_wins else 50.0
    monkeypatch.setattr(bench_module, "calibrate",
                        lambda *a, **k: Calibration(rate, 100.0, 1.7, 32, [0.5, 0.4]))
    speculative_calls, generate = [], SpeculativeDecoder.generate_batch

    def counted(self, prompts, max_new, *args, **kwargs):
        # a timed batch (warm-up: 8 tokens, calibration: stubbed)
        if self.source is not None and max_new == 9:
            speculative_calls.append(len(prompts))
        return generate(self, prompts, max_new, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate_batch", counted)
    cfg = BenchConfig(batch_sizes=[2], temperatures=[0.0], prompts="mt-bench", limit=2, max_new_tokens=9,
                      dtype="float32", peers=False, out=str(tmp_path / "bench"))
    # drafts itself
    drafter = DrafterConfig(kind="draft-lm", path=str(tiny_llama_dir), num_speculative_tokens=3)
    bench = run_bench([decide(ModelConfig(target=str(tiny_llama_dir), device="cpu"), drafter)], cfg,
                      progress=False)
    (c,) = bench["configs"]
    assert c["fell_back"] is not speculative_wins and c["equal_to_plain"] == 2
    assert speculative_calls == ([2] if speculative_wins else [])  # the one timed batch of 2, or not decoded
    assert c["calibration"]["speedup"] == rate / 100.0
    if speculative_wins:
        assert c["fallback_reason"] is None and c["tau"] > 1.5 and c["acceptance_by_depth"][0] == 1.0
    else:  # it is the plain loop: reported from the plain tally, not decoded and timed a second time
        assert ("calibration at batch 2" in c["fallback_reason"] and c["tau"] == 1.0
                and c["acceptance_by_depth"] == [])
        assert c["speedup"] == 1.0 and c["tokens_per_s"] == c["baseline_tokens_per_s"]
        assert c["speedup_by_batch"] == [1.0]


def test_drafter_labels_name_the_run():
    taken: set[str] = set()
    names = [drafter_label(DrafterConfig(kind=k, path=p), taken) for k, p in (
        ("prompt-lookup", None), ("eagle3", "runs/eagle3/drafter"), ("draft-lm", "runs/draft/export/hf"),
        ("draft-lm", "my drafts/v2"), ("draft-lm", "other/draft/export/hf"))]
    assert names == ["prompt-lookup", "eagle3", "draft-hf", "v2", "draft-hf-2"]


def test_tables_name_a_drafter_by_kind_and_run_never_by_path():
    from draftsmith.eval.measure.evaluate import drafter_title
    from draftsmith.heads.runtime.tree import serving_tree

    named = [drafter_title(DrafterConfig(kind=k, path=p), name) for k, p, name in (
        ("prompt-lookup", None, "prompt-lookup"), ("eagle3", "/tmp/tmp.x1/eagle3-quick/drafter", "eagle3"),
        ("draft-lm", "runs/draft/export/hf", "draft-lm"), ("medusa", "runs/m/drafter", "medusa+lookup"),
        ("medusa", "runs/m/drafter", "none"))]
    assert named == ["prompt lookup", "EAGLE-3 · eagle3-quick", "draft LM · draft (hf export)",
                     "Medusa + lookup · m", "plain decoding · m"]
    assert not any("/" in n for n in named)
    tree_file = Path(__file__).resolve().parents[2] / "configs" / "trees" / "medusa-k4-default.json"
    assert (serving_tree(DrafterConfig(kind="medusa", tree=str(tree_file)), None,
                         "chain-3").label == "medusa-k4-default")


def test_cli_bench_writes_json_plots_and_peers(tiny_llama_dir, tmp_path):
    draft_dir = build_tiny_model_dir(tmp_path, "llama", layers=1, seed=7)
    out = tmp_path / "bench"
    code = main(["bench", "--target", str(tiny_llama_dir), "--drafter", "prompt-lookup", "--drafter",
                 str(draft_dir), "--batch-sizes", "1,2", "--temperatures", "0,1.0", "--prompts", "mt-bench",
                 "--limit", "2", "--max-new-tokens", "8", "--dtype", "float32", "--calibration-tokens", "4",
                 "--out", str(out), "log.progress=false", "model.device=cpu"])
    assert code == 0
    bench = json.loads((out / "bench.json").read_text())
    assert len(bench["configs"]) == 2 * 2 * 2 and len(list((out / "configs").glob("*.json"))) == 8
    assert bench["machine"]["device"].startswith("cpu")
    for c in bench["configs"]:
        assert c["speedup"] and c["baseline_tokens_per_s"] and c["hf_generate_tokens_per_s"]
        assert isinstance(c["fell_back"], bool) and c["calibration"] is not None
        assert c["equal_to_plain"] == (2 if c["temperature"] == 0 else None)
        assert set(c["baseline_step_ms"]) == {"draft", "verify", "accept"}  # measured split of a step's time
        assert set(c["step_ms"]) == {"draft", "verify", "accept"} and c["step_ms"]["verify"] > 0
    label = draft_dir.name
    peers = {(p["peer"], p["batch_size"], p["temperature"]) for p in bench["peers"]}
    for t in (0.0, 1.0):
        assert {("hf-generate", 1, t), ("hf-prompt-lookup", 1, t), (f"hf-assisted-{label}", 1, t),
                ("hf-generate", 2, t), ("draftsmith-plain", 2, t)} <= peers
    assert ("hf-prompt-lookup", 2, 0.0) not in peers  # HF assisted decoding is batch-1 only
    for png in ("acceptance_by_depth", "tau_by_category", "speedup_vs_batch"):
        assert (out / f"{png}.png").stat().st_size > 1000


def test_bench_flags_are_checked(tiny_llama_dir, tmp_path, capsys):
    code = main(["bench", "--target", str(tiny_llama_dir), "--drafter", "prompt-lookup", "--batch-sizes",
                 "1,x", "--out", str(tmp_path)])
    assert code == 2 and "--batch-sizes takes comma-separated numbers" in capsys.readouterr().err


def test_write_report_links_pngs_under_one_table(tmp_path):
    summaries = [{"drafter": "runs/a/drafter", "tau": 2.1, "acceptance_by_depth": [0.7, 0.6, 0.5, 0.4, 0.3],
                  "tokens_per_s": 50.0, "speedup_vs_hf": 1.6,
                  "by_category": {"qa": {"tau": 2.0}, "rag": {"tau": 2.3}}},
                 {"drafter": "prompt-lookup", "tau": 1.6, "acceptance_by_depth": [0.35, 0.67],
                  "tokens_per_s": 40.0, "speedup_vs_hf": 1.2, "by_category": {"qa": {"tau": 1.4}}}]
    configs = [{"drafter": "a", "drafter_path": "runs/a/drafter", "temperature": 0.0, "batch_size": b,
                "speedup": s, "fell_back": fb, "tau": 2.0, "tokens_per_s": 10.0, "acceptance_by_depth": [],
                "calibration": {"acceptance_by_depth": [0.7]}}
               for b, s, fb in [(1, 1.8, False), (4, 1.3, False), (16, 1.0, True)]]
    path = write_report(summaries, {"configs": configs, "machine": {"device": "cpu: x", "torch": "2"}},
                        tmp_path)
    text = path.read_text()
    for png in ("acceptance_by_depth", "tau_by_category", "speedup_vs_batch"):
        assert f"]({png}.png)" in text and (tmp_path / f"{png}.png").is_file()
    assert text.count("| runs/a/drafter | 2.10 | 0.70 | 0.60 | 0.50 | 0.40 | 50.0 | 1.60 |") == 1
    assert "b1 T0 ×1.80, b4 T0 ×1.30, b16 T0 ×1.00 (fb)" in text
    assert "| prompt-lookup | 1.60 | 0.35 | 0.67 | – | – |" in text


def test_report_matches_a_drafter_named_relative_in_bench_absolute_in_eval(tmp_path, monkeypatch):
    (tmp_path / "runs" / "q" / "drafter").mkdir(parents=True)
    # the quickstart: pipeline summaries hold absolute paths, bench got relative ones
    monkeypatch.chdir(tmp_path)
    summary = {"drafter": str(tmp_path / "runs" / "q" / "drafter"), "tau": 1.5, "acceptance_by_depth": [0.4],
               "tokens_per_s": 30.0, "speedup_vs_hf": 0.9, "by_category": {}}
    config = {"drafter": "q", "drafter_path": "runs/q/drafter", "temperature": 0.0, "batch_size": 1,
              "speedup": 1.0, "fell_back": True, "tau": 1.0, "tokens_per_s": 30.0, "acceptance_by_depth": [],
              "calibration": {"acceptance_by_depth": [0.4], "tau": 1.5}}
    text = write_report([summary], {"configs": [config]}, tmp_path / "report").read_text()
    assert text.count("q/drafter |") == 1 and "b1 T0 ×1.00 (fb)" in text  # one row, with its bench column


def test_comparison_table_claims_greedy_equality_only_in_fp32():
    row = dict(drafter="d", tree="chain-4", temperature=0.0, n_prompts=12, tau=1.2, tokens_per_s=30.0)
    assert (summary_row(dict(row, dtype="float32", greedy_equal=True,
                             greedy_equal_count=12))[-1] == "yes (12/12)")
    assert (summary_row(dict(row, dtype="float32", greedy_equal=False,
                             greedy_equal_count=11))[-1] == "NO (11/12)")
    # near-ties flip in half precision
    bf16 = dict(row, dtype="bfloat16", greedy_equal=False, greedy_equal_count=6)
    assert (summary_row(bf16)[-1] == "6/12 (bfloat16: not claimed, fp32 is)"
            and "NO" not in format_table([bf16]))
