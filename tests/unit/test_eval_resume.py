"""`draftsmith eval` stopped half-way (an error, Ctrl-C, a kill) and run again: the finished outputs stay as
they were, the same command continues after the last whole record and ends with what one sitting writes; other
settings, or a drafter folder changed since, start over (the negative twins)."""

from __future__ import annotations

import json
import os

import pytest
from helpers import build_tiny_model_dir

from draftsmith.distill.loading import ModelConfig
from draftsmith.eval.decode.decoder import SpeculativeDecoder
from draftsmith.eval.measure.evaluate import EvalConfig, run_eval
from draftsmith.eval.serving import decide
from draftsmith.heads.registry import DrafterConfig

pytestmark = pytest.mark.usefixtures("one_thread")

# figures a resumed eval must reproduce (timings differ by sitting)
SAME = ("id", "output_ids", "accept_lengths", "draft_depths", "accepted_drafts", "equal_to_hf")


@pytest.fixture(scope="module")
def serving(tmp_path_factory):
    target = build_tiny_model_dir(tmp_path_factory.mktemp("target"))
    return decide(ModelConfig(target=str(target), device="cpu"), DrafterConfig(kind="prompt-lookup"))


def stopping(monkeypatch, after: int, error: type[BaseException] = KeyboardInterrupt) -> list:
    """SpeculativeDecoder.generate raising `error` on its call after `after` calls; returns the call log."""
    calls, generate = [], SpeculativeDecoder.generate

    def generate_or_stop(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == after + 1:
            raise error("stopped half-way")
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(SpeculativeDecoder, "generate", generate_or_stop)
    return calls


def records(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]


CFG = dict(prompts="mt-bench", limit=4, max_new_tokens=6, warmup=0, temperature=0.0)


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_stopped_eval_continues_where_it_stopped_and_ends_as_one_sitting(serving, tmp_path, monkeypatch,
                                                                           temperature):
    """Greedy and sampled (every prompt seeds its own generators, HF generate's global one too)."""
    cfg = dict(CFG, temperature=temperature)
    whole = tmp_path / "whole"
    one = run_eval(serving, EvalConfig(**cfg), whole, progress=False)
    out = tmp_path / "eval"
    # each prompt calls generate twice (our plain loop and speculative, alternating order): stop in the third
    stopping(monkeypatch, after=5)
    with pytest.raises(KeyboardInterrupt):
        run_eval(serving, EvalConfig(**cfg), out, progress=False)
    # no finished output, no half of one
    assert sorted(p.name for p in out.iterdir()) == ["samples.jsonl.partial"]
    lines = (out / "samples.jsonl.partial").read_text().splitlines()
    assert len(lines) == 1 + 2 and json.loads(lines[0])["sittings"] == [0]
    monkeypatch.undo()
    calls = stopping(monkeypatch, after=10 ** 6)
    resumed = run_eval(serving, EvalConfig(**cfg), out, progress=False)
    assert len(calls) == 2 * 2  # only the two prompts left were decoded
    same = [[{k: r[k] for k in SAME} for r in records(folder)] for folder in (out, whole)]
    assert same[0] == same[1]
    for key in ("tau", "acceptance_by_depth", "greedy_equal_count", "n_prompts", "new_tokens"):
        assert resumed[key] == one[key], key
    assert resumed["sittings"] == [0, 2] and one["sittings"] == [0]
    assert sorted(p.name for p in out.iterdir()) == ["samples.jsonl", "summary.json"]


def test_a_record_a_kill_cut_short_is_decoded_again(serving, tmp_path, monkeypatch):
    out = tmp_path / "eval"
    stopping(monkeypatch, after=5, error=RuntimeError)
    with pytest.raises(RuntimeError, match="half-way"):
        run_eval(serving, EvalConfig(**CFG), out, progress=False)
    partial = out / "samples.jsonl.partial"
    text = partial.read_text()
    partial.write_text(text[: len(text) - 40])  # the second record cut mid-line, as a kill leaves it
    monkeypatch.undo()
    calls = stopping(monkeypatch, after=10 ** 6)
    run_eval(serving, EvalConfig(**CFG), out, progress=False)
    assert len(calls) == 3 * 2 and len(records(out)) == 4


@pytest.mark.parametrize("change", ["max_new_tokens", "drafter folder"])
def test_other_settings_start_over(serving, tmp_path, monkeypatch, change):
    """Twins: a stopped eval is not continued under another setting, nor after its drafter folder changed."""
    out, drafter = tmp_path / "eval", build_tiny_model_dir(tmp_path, layers=1, seed=7)
    drafter_cfg = DrafterConfig(kind="draft-lm", path=str(drafter), num_speculative_tokens=2)
    served = decide(serving.model, drafter_cfg)
    stopping(monkeypatch, after=5)
    with pytest.raises(KeyboardInterrupt):
        run_eval(served, EvalConfig(**CFG), out, progress=False)
    monkeypatch.undo()
    cfg = dict(CFG)
    if change == "max_new_tokens":
        cfg["max_new_tokens"] += 1
    else:
        weights = next(drafter.glob("*.safetensors"))
        os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10 ** 9))  # retrained
    calls = stopping(monkeypatch, after=10 ** 6)
    summary = run_eval(served, EvalConfig(**cfg), out, progress=False)
    assert len(calls) == 4 * 2 and summary["sittings"] == [0]


def test_a_stopped_eval_leaves_a_finished_ones_files_as_they_were(tmp_path, monkeypatch):
    """`draftsmith eval` writes config.resolved.yaml beside the summary it made: an eval stopped in a folder
    holding a finished one's leaves that one's config, summary and samples together (twin: finished, the new
    config replaces the old)."""
    import yaml

    from draftsmith.train.cli import main

    target, out = build_tiny_model_dir(tmp_path / "target"), tmp_path / "eval"

    def evaluate(limit: int) -> int:
        return main(["eval", "--target", str(target), "--prompts", "mt-bench", "--limit", str(limit),
                     "--max-new-tokens", "4", "--dtype", "float32", "--out", str(out),
                     "drafter.kind=prompt-lookup", "eval.warmup=0",
                     "eval.baselines=false", "log.progress=false"])

    def limits() -> tuple[int, int]:
        config = yaml.safe_load((out / "config.resolved.yaml").read_text())
        return config["eval"]["limit"], json.loads((out / "summary.json").read_text())["n_prompts"]

    assert evaluate(2) == 0 and limits() == (2, 2)
    stopping(monkeypatch, after=1)
    with pytest.raises(KeyboardInterrupt):
        evaluate(3)
    assert limits() == (2, 2) and (out / "samples.jsonl.partial").is_file()
    monkeypatch.undo()
    assert evaluate(3) == 0 and limits() == (3, 3)
