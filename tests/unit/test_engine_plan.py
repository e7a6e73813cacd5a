"""The engine plan (`draftsmith plan --engine vllm`): the choice rule, the files it writes, what eval then
serves.

No engine runs here: the engine's raw record is built by hand (tests/integration/test_engine_serve.py serves
for real).
"""

import json
from types import SimpleNamespace

import pytest

from draftsmith.eval.measure import engine, engine_plan
from draftsmith.eval.serving import Serving
from draftsmith.heads.registry import DrafterConfig


def cand(name: str, k: int, tps: float, tau: float | None) -> dict:
    return {"name": name, "k": k, "speculative_config": {"method": "eagle3", "num_speculative_tokens": k},
            "by_concurrency": {"1": {"tokens_per_s": tps, "tau": tau}}}


def test_the_fastest_candidate_beyond_margin_and_noise_is_chosen():
    c = [cand("chain-1", 1, 22.0, 1.4), cand("chain-3", 3, 26.0, 1.9), cand("ngram-3", 3, 21.0, 1.2)]
    choice = engine_plan.choose(c, [20.0, 20.0], "1", margin=0.03)
    assert choice["choice"] == "chain-3" and choice["speedup"] == pytest.approx(1.3)
    assert choice["speculative_config"]["num_speculative_tokens"] == 3


def test_a_lead_inside_the_measured_noise_is_plain_with_the_reason():
    # plain ran at 20 and 22 tok/s (noise 9.5%): a candidate at x1.08 does not clear 1 + 3% + 9.5%
    choice = engine_plan.choose([cand("chain-2", 2, 22.7, 1.5)], [20.0, 22.0], "1", margin=0.03)
    assert choice["choice"] == "plain" and choice["speculative_config"] is None
    assert "noise" in choice["why"] and "chain-2" in choice["why"]


def test_a_candidate_that_accepted_nothing_is_never_chosen():
    choice = engine_plan.choose([cand("chain-1", 1, 40.0, 1.0)], [20.0], "1", margin=0.0)
    assert choice["choice"] == "plain"


def plan_record(choice_1: str) -> dict:
    spec = None if choice_1 == "plain" else {"method": "eagle3", "model": "/x", "num_speculative_tokens": 4}
    return {"engine": "vllm", "engine_version": "0.32.0", "target": "/t", "dtype": "float32", "n_prompts": 8,
            "max_new_tokens": 64, "prompts": "spec-bench", "offset": 240, "concurrency": [1],
            "host": {"engine": {"cpu": "x86_64", "cpu_count": 2, "cpu_flags": ["avx2"]}},
            "choice": {"1": {"choice": choice_1, "speculative_config": spec, "speedup": 1.2, "tau": 1.8,
                             "why": "none faster"}}}


def test_the_plan_is_its_own_file_and_serve_md_carries_the_measured_command(tmp_path):
    (tmp_path / "SERVE.md").write_text("# Serving\n\nvLLM: ...\n")
    path = engine_plan.write_engine_plan(tmp_path, plan_record("chain-4"))
    assert path.name == "serving-vllm.json" and not (tmp_path / "serving.json").exists()
    text = (tmp_path / "SERVE.md").read_text()
    assert text.startswith("# Serving") and '"num_speculative_tokens": 4' in text and "2 cores" in text
    engine_plan.write_engine_plan(tmp_path, plan_record("plain"))  # a second plan replaces the section, once
    text = (tmp_path / "SERVE.md").read_text()
    assert (text.count("## Measured in vLLM") == 1 and "plain decoding" in text
            and "num_speculative_tokens" not in text)


def test_eval_engine_serves_the_planned_chain_unless_told(tmp_path):
    (tmp_path / "serving-vllm.json").write_text(json.dumps(plan_record("chain-4")))
    folder = SimpleNamespace(path=tmp_path, tree=None)
    assert engine.chain_k(Serving(DrafterConfig(kind="eagle3"), folder=folder)) == 4
    assert engine.chain_k(Serving(DrafterConfig(kind="eagle3", tree="chain-2"), folder=folder)) == 2


def test_each_engine_eval_serves_its_own_plans_chain(tmp_path):
    """llama.cpp's eval reads serving-llamacpp.json, not vLLM's plan (each engine measured its own)."""
    from draftsmith.eval.measure.engine_llamacpp import LLAMACPP_PLAN

    (tmp_path / "serving-vllm.json").write_text(json.dumps(plan_record("chain-4")))
    (tmp_path / LLAMACPP_PLAN).write_text(json.dumps(plan_record("chain-2")))
    serving = Serving(DrafterConfig(kind="eagle3"), folder=SimpleNamespace(path=tmp_path, tree=None))
    assert engine.chain_k(serving) == 4 and engine.chain_k(serving, LLAMACPP_PLAN) == 2


def test_a_llamacpp_plan_with_its_own_draft_threads_gives_its_chain_and_threads(tmp_path):
    """`plan --engine llamacpp` may choose `chain-K-tdN` (the draft model on N threads) or
    `TYPE+chain-K[-tdN]` (the drafter behind an n-gram type): the eval serves chain K with N threads (behind
    TYPE); plain or an n-gram choice alone leaves the chain to the folder (negative twins)."""
    from draftsmith.eval.measure.engine_llamacpp import LLAMACPP_PLAN

    plan = tmp_path / LLAMACPP_PLAN
    serving = Serving(DrafterConfig(kind="eagle3", num_speculative_tokens=5),
                      folder=SimpleNamespace(path=tmp_path, tree=None))
    plan.write_text(json.dumps(plan_record("chain-1-td1")))
    assert engine.planned_chain(plan) == (1, 1, None) and engine.chain_k(serving, LLAMACPP_PLAN) == 1
    plan.write_text(json.dumps(plan_record("chain-3")))
    assert engine.planned_chain(plan) == (3, None, None) and engine.chain_k(serving, LLAMACPP_PLAN) == 3
    plan.write_text(json.dumps(plan_record("ngram-map-k4v+chain-2-td1")))
    assert engine.planned_chain(plan) == (2, 1, "ngram-map-k4v")
    assert engine.chain_k(serving, LLAMACPP_PLAN) == 2
    plan.write_text(json.dumps(plan_record("ngram-simple+chain-4")))
    assert engine.planned_chain(plan) == (4, None, "ngram-simple")
    for choice in ("plain", "ngram-simple", "ngram-simple+plain"):
        plan.write_text(json.dumps(plan_record(choice)))
        assert engine.planned_chain(plan) is None and engine.chain_k(serving, LLAMACPP_PLAN) == 5
    assert engine.planned_chain(tmp_path / "none.json") is None


def test_ngram_baseline_sets_both_lookup_bounds():
    cfg = engine_plan.ngram_config(5)
    assert cfg["method"] == "ngram" and cfg["num_speculative_tokens"] == 5
    assert cfg["prompt_lookup_min"] <= cfg["prompt_lookup_max"]


def test_a_finished_engine_job_is_not_served_again(tmp_path, monkeypatch):
    """A rerun after a later failure (our decoder's half, a kill) reuses the engine's record of the same
    job."""
    job = {"runs": [{"name": "plain", "speculative_config": None}], "prompts": [[1, 2]]}
    (tmp_path / "job.json").write_text(json.dumps(job))
    (tmp_path / "engine.json").write_text(json.dumps({"host": {}, "runs": [{"name": "plain"}]}))
    monkeypatch.setattr(engine, "get_engine", lambda name: type("E", (), {"ready": True, "python": "py"})())

    def serve(*args, **kwargs):
        raise RuntimeError("served")

    monkeypatch.setattr(engine.subprocess, "run", serve)
    assert engine.serve_job("vllm", job, tmp_path)["runs"] == [{"name": "plain"}]
    with pytest.raises(RuntimeError, match="served"):  # another job (here: other prompts) is served
        engine.serve_job("vllm", {**job, "prompts": [[3]]}, tmp_path)
