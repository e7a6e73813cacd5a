"""draftsmith plan: measured serving settings written into the drafter folder and served by default.

On a tiny target (timings mean nothing here; what is tested is the plumbing): the plan decodes the
calibration prompts (disjoint from eval's), records every candidate and the verify-cost curve, writes
serving.json; build_proposer then serves the chosen settings, `drafter.plan=false` the recipe's, and a
plan that chose plain decoding serves plain decoding, still lossless.
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import build_tiny_model_dir

from draftsmith.distill.target import load_target
from draftsmith.eval import plan as plan_module
from draftsmith.eval.benchmark import EvalConfig, select_prompts
from draftsmith.eval.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.proposers import build_proposer
from draftsmith.heads.folder import read_folder
from draftsmith.heads.medusa import MedusaConfig, MedusaHeads
from draftsmith.heads.registry import KINDS, SERVING_FIELDS, DrafterConfig


@pytest.fixture()
def setup(tmp_path):
    target = load_target(str(build_tiny_model_dir(tmp_path, "llama", layers=2)), dtype="float32")
    torch.manual_seed(0)
    heads = MedusaHeads(target.config.hidden_size, target.vocab_size, 3)
    folder = heads.save_pretrained(tmp_path / "drafter", target="tiny")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": ["a", "b"][i % 2], "prompt": f"say {i} " * 3}) + "\n"
                               for i in range(12)))
    return target, folder, str(prompts)


def test_calibration_prompts_are_disjoint_from_eval_prompts(setup):
    _, _, prompts = setup
    first = {r["id"] for r in select_prompts(EvalConfig(prompts=prompts, limit=6))}
    later = {r["id"] for r in select_prompts(EvalConfig(prompts=prompts, limit=4, offset=6))}
    assert len(first) == 6 and len(later) == 4 and not first & later
    with pytest.raises(ValueError, match="offset 20 leaves no prompt"):
        select_prompts(EvalConfig(prompts=prompts, limit=4, offset=20))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_names_its_plan_candidates_as_serving_settings(kind):
    """A kind's section says what the plan tries (heads/settings.py); each candidate builds a valid config."""
    cfg = DrafterConfig.for_kind(kind)
    options = cfg.settings.serving_candidates({"num_heads": 3})
    assert options and all(set(o) <= set(SERVING_FIELDS) for o in options)
    for overrides in options:
        cfg.with_plan({"chosen": {"settings": overrides}})


def test_plan_is_written_and_served(setup, monkeypatch):
    target, folder, prompts = setup
    monkeypatch.setattr(MedusaConfig, "serving_candidates", lambda self, config: [{"tree": "chain-1"}, {"tree": "chain-2"},
                                                                                   {"tree": "chain-9"}])
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, cfg, read_folder(folder), prompts=prompts, calibration=3, offset=6,
                                 max_new_tokens=6, margin=-1.0, progress=False)  # margin -1: always pick
    assert [r["label"] for r in made["candidates"]] == [
        "tree=chain-1", "tree=chain-2", "tree=chain-9", "prompt lookup alone, chain 5 (the drafter unused)",
        "prompt lookup alone, a trie of 3 matches x 8 (the drafter unused)"]
    assert "skipped" in made["candidates"][2]  # deeper than the 3 heads: refused, named, not fatal
    assert set(made["verify_cost_ms"]) >= {1, 8, 64} and made["calibration"]["offset"] == 6
    assert made["dtype"] == "float32" and {"cpu_capability", "cpu_native_bf16", "torch_threads"} <= set(made["machine"])
    if plan_module.lookup_alone(made["chosen"]["settings"]):  # timings on a tiny target can go either way
        made["chosen"] = made["by_batch"]["1"]["chosen"] = {"plain": False, "settings": {"tree": "chain-2"},
                                                             "label": "tree=chain-2"}
    assert not made["chosen"]["plain"] and made["chosen"]["settings"]["tree"] in ("chain-1", "chain-2")
    plan_module.write_plan(folder, made)
    served = build_proposer(cfg, target)
    assert served.tree == made["chosen"]["settings"]["tree"]
    recipe = build_proposer(DrafterConfig(kind="medusa", path=str(folder), plan=False), target)
    assert recipe.tree == "chain-3"  # the recipe's: no tree recorded in this folder, so a chain over the 3 heads
    prompt = target.chat_ids("say 3 say 3")
    assert SpeculativeDecoder(target, served).generate(prompt, 12).output_ids == hf_generate(target, prompt, 12)[0]


def test_a_plan_from_another_machine_says_so(setup, monkeypatch, capsys):
    """Same device string, other kernels (an AVX512 host's plan served on an AVX2 one): timings do not carry over."""
    target, folder, prompts = setup
    monkeypatch.setattr(MedusaConfig, "serving_candidates", lambda self, config: [{"tree": "chain-1"}])
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, cfg, read_folder(folder), prompts=prompts, calibration=1, offset=6,
                                 max_new_tokens=2, margin=-1.0, progress=False)
    plan_module.write_plan(folder, made)
    build_proposer(cfg, target)
    assert "re-run draftsmith plan here" not in capsys.readouterr().out
    made["machine"]["cpu_capability"] = "AMX" if made["machine"]["cpu_capability"] != "AMX" else "AVX2"
    plan_module.write_plan(folder, made)
    build_proposer(cfg, target)
    assert "not this machine" in capsys.readouterr().out


def test_a_plan_that_chose_plain_serves_plain(setup, monkeypatch):
    target, folder, prompts = setup
    monkeypatch.setattr(MedusaConfig, "serving_candidates", lambda self, config: [{"tree": "chain-1"}])
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, cfg, read_folder(folder), prompts=prompts, calibration=2, offset=6,
                                 max_new_tokens=4, margin=100.0, progress=False)
    why = made["chosen"]["why"]  # the figures that decided it: τ, the step's cost, the verification curve
    assert made["chosen"]["plain"] and "reached only" in why and "cost" in why and "one-token forwards" in why, why
    row = made["candidates"][0]
    assert row["step_cost"] == pytest.approx(row["tau"] / row["speedup"], rel=1e-3)
    # the step's cost split as measured (ms per step drafting / verifying / accepting), in the file and the reason
    assert set(row["step_ms"]) == set(row["plain_step_ms"]) == {"draft", "verify", "accept"}
    assert row["step_ms"]["draft"] > 0 and row["step_ms"]["verify"] > 0 and "drafting" in why and "a plain step's" in why
    plan_module.write_plan(folder, made)
    served = build_proposer(cfg, target)
    assert type(served).__name__ == "Proposer"  # plain decoding
    prompt = target.chat_ids("say 1")
    assert SpeculativeDecoder(target, served).generate(prompt, 8).output_ids == hf_generate(target, prompt, 8)[0]


def test_a_drafter_folder_names_its_target_when_nothing_else_does(setup):
    """`eval/plan/bench --drafter DIR` without --target, -c or model.target=: the target the folder was trained for."""
    import argparse

    from draftsmith.train.cli import eval_overrides

    _, folder, _ = setup

    def flags(**kw):
        base = dict(target=None, drafter=str(folder), tree=None, categories=None, prompts=None, limit=None,
                    max_new_tokens=None, dtype=None, temperature=None, out=None, config=None, overrides=[])
        return argparse.Namespace(**{**base, **kw})

    assert "model.target=tiny" in eval_overrides(flags())
    for named in (dict(target="other"), dict(config="run.yaml"), dict(overrides=["model.target=other"])):
        assert "model.target=tiny" not in eval_overrides(flags(**named)), named


def test_a_plan_where_prompt_lookup_alone_wins_serves_it_and_says_why(setup, monkeypatch):
    """Where the drafter costs more than it adds over free n-gram drafts, the plan serves prompt lookup alone (the
    drafter not even loaded), says by how much, and stays lossless."""
    from draftsmith.eval.proposers.lookup import PromptLookupProposer

    target, folder, prompts = setup
    monkeypatch.setattr(MedusaConfig, "serving_candidates", lambda self, config: [{"tree": "chain-1"}])
    real = plan_module._decode

    def lookup_is_free(decoder, ids, max_new, batch=1):  # this tiny target's timings decide nothing: lookup wins
        tally = real(decoder, ids, max_new, batch)
        tally.seconds /= 100 if isinstance(decoder.proposer, PromptLookupProposer) else 1
        return tally

    monkeypatch.setattr(plan_module, "_decode", lookup_is_free)
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, cfg, read_folder(folder), prompts=prompts, calibration=2, offset=6,
                                 max_new_tokens=6, margin=0.03, progress=False)
    chosen = made["chosen"]
    assert chosen["settings"] in (plan_module.LOOKUP_ALONE, plan_module.LOOKUP_TRIE) and not chosen["plain"]
    assert "beat every setting that drafts with the medusa drafter" in chosen["why"] and "tree=chain-1" in chosen["why"]
    assert "the drafter unused" in plan_module.format_plan(made)
    plan_module.write_plan(folder, made)
    served = build_proposer(cfg, target)
    assert isinstance(served, PromptLookupProposer) and served.served_by_plan
    assert served.tree == ("chain-5" if chosen["settings"] == plan_module.LOOKUP_ALONE else "lookup trie, 3 matches x 8")
    prompt = target.chat_ids("say 2 say 2 say 2")
    assert SpeculativeDecoder(target, served).generate(prompt, 12).output_ids == hf_generate(target, prompt, 12)[0]


def test_a_plan_with_a_datastore_measures_its_twins_and_serves_the_one_chosen(setup, monkeypatch, tmp_path):
    """`drafter.lookup_datastore` set: each prompt-lookup candidate is measured again drafting from the datastore;
    the choice carries the datastore in serving.json, so the folder serves it without the setting typed again."""
    from draftsmith.eval.proposers.lookup import PromptLookupProposer

    target, folder, prompts = setup
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                        {"role": "assistant", "content": f"say {i} " * 4}]}) + "\n"
                               for i in range(4)))
    monkeypatch.setattr(MedusaConfig, "serving_candidates", lambda self, config: [{"tree": "chain-1", "lookup_branch": 2}])
    real = plan_module._decode

    def datastore_is_free(decoder, ids, max_new, batch=1):  # timings decide nothing here: the datastore twins win
        tally = real(decoder, ids, max_new, batch)
        lookup = getattr(decoder.proposer, "lookup", decoder.proposer)
        tally.seconds /= 100 if getattr(lookup, "datastore", None) is not None else 1
        return tally

    monkeypatch.setattr(plan_module, "_decode", datastore_is_free)
    cfg = DrafterConfig(kind="medusa", path=str(folder), lookup_datastore=[str(answers)])
    made = plan_module.make_plan(target, cfg, read_folder(folder), prompts=prompts, calibration=2, offset=6,
                                 max_new_tokens=6, margin=0.03, progress=False)
    labels = [r["label"] for r in made["candidates"]]
    assert len(labels) == 6 and sum(label.endswith("+ datastore") or "datastore (the" in label for label in labels) == 3
    assert made["chosen"]["settings"]["lookup_datastore"] == [str(answers)]
    plan_module.write_plan(folder, made)
    served = build_proposer(DrafterConfig(kind="medusa", path=str(folder)), target)
    lookup = served if isinstance(served, PromptLookupProposer) else served.lookup
    assert lookup.datastore is not None and "datastore" in served.tree
    prompt = target.chat_ids("say 2 say 2")
    assert SpeculativeDecoder(target, served).generate(prompt, 12).output_ids == hf_generate(target, prompt, 12)[0]
    off = build_proposer(DrafterConfig(kind="medusa", path=str(folder), plan=False, lookup_branch=2), target)
    assert off.lookup.datastore is None  # the recipe's settings: no datastore unless typed


def test_zero_model_tokens_is_only_a_lookup_setting():
    assert DrafterConfig(kind="eagle3", num_speculative_tokens=0, lookup_branch=5).lookup_branch == 5
    with pytest.raises(ValueError, match="0 only beside drafter.lookup_branch > 0"):
        DrafterConfig(kind="eagle3", num_speculative_tokens=0)


def test_a_plan_per_batch_size_serves_the_one_measured_at_that_size(setup, monkeypatch, capsys):
    """`draftsmith plan --batch-sizes 1,2`: each batch size gets its own measured choice; eval and bench build the
    proposer for their batch size (one not measured takes the largest measured below it, and says so)."""
    target, folder, prompts = setup
    monkeypatch.setattr(MedusaConfig, "serving_candidates", lambda self, config: [{"tree": "chain-1"}, {"tree": "chain-2"}])
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, cfg, read_folder(folder), prompts=prompts, calibration=2, offset=6,
                                 max_new_tokens=4, margin=-1.0, progress=False, batch_sizes=[2, 1])
    assert made["batch_sizes"] == [1, 2] and set(made["by_batch"]) == {"1", "2"} and made["batch_size"] == 1
    assert made["candidates"] == made["by_batch"]["1"]["candidates"] and set(made["by_batch"]["2"]["verify_cost_ms"]) >= {1, 64}
    assert [r["label"] for r in made["by_batch"]["2"]["candidates"]][:2] == ["tree=chain-1", "tree=chain-2"]
    for batch, tree in (("1", "chain-2"), ("2", "chain-1")):  # timings on a tiny target decide nothing: fix the choices
        made["by_batch"][batch]["chosen"] = {"plain": False, "settings": {"tree": tree}, "label": f"tree={tree}",
                                             "speedup": 1.1, "tau": 1.5}
    made["chosen"] = made["by_batch"]["1"]["chosen"]
    assert "chosen at batch 2: tree=chain-1" in plan_module.format_plan(made)
    plan_module.write_plan(folder, made)
    capsys.readouterr()
    assert build_proposer(cfg, target).tree == "chain-2" and build_proposer(cfg, target, 2).tree == "chain-1"
    assert "measured at batch" not in capsys.readouterr().out
    served = build_proposer(cfg, target, 4)
    assert served.tree == "chain-1" and "measured at batch 2, served at 4" in capsys.readouterr().out
    batch = [target.chat_ids("say 1 say 1"), target.chat_ids("say 22")]
    out = SpeculativeDecoder(target, served).generate_batch(batch, 10)
    assert [r.output_ids for r in out.results] == [hf_generate(target, p, 10)[0] for p in batch]
    old = {k: v for k, v in made.items() if k not in ("by_batch", "batch_sizes")}  # a plan written before by_batch
    assert plan_module.plan_at(old, 4)["chosen"]["settings"] == {"tree": "chain-2"}


def test_one_proposer_is_built_per_measured_plan_not_per_batch_size(setup):
    """bench keys its decoders by the batch size whose plan serves them: batch sizes served by one plan share one."""
    from draftsmith.eval.proposers import served_plan_batch

    _, folder, _ = setup
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    assert served_plan_batch(cfg, 4) is None  # no serving.json yet
    part = {"chosen": {"plain": False, "settings": {"tree": "chain-1"}, "label": "tree=chain-1"}}
    plan_module.write_plan(folder, {"batch_size": 1, **part, "by_batch": {"1": {"batch_size": 1, **part},
                                                                          "4": {"batch_size": 4, **part}}})
    assert [served_plan_batch(cfg, b) for b in (1, 2, 4, 16)] == [1, 1, 4, 4]
    assert served_plan_batch(DrafterConfig(kind="medusa", path=str(folder), plan=False), 4) is None


def test_verification_is_measured_at_each_context_asked_and_explained_at_the_nearest(setup, monkeypatch):
    """`draftsmith plan --contexts 8,48`: one verify-cost curve per context length (long contexts cost more
    attention); the one nearest the calibration prompts' own context explains the choice. A context past the
    target's window is refused before any decoding, naming the window."""
    target, folder, prompts = setup
    monkeypatch.setattr(MedusaConfig, "serving_candidates", lambda self, config: [{"tree": "chain-1"}])
    real, measured = plan_module.verify_cost, []

    def recorded(target, **kw):
        measured.append((kw["batch"], kw["context"]))
        return real(target, **kw)

    monkeypatch.setattr(plan_module, "verify_cost", recorded)
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, cfg, read_folder(folder), prompts=prompts, calibration=2, offset=6,
                                 max_new_tokens=4, margin=-1.0, progress=False, contexts=[48, 8])
    assert sorted(measured) == [(1, 8), (1, 48)]  # each context really measured, once per batch size
    assert set(made["verify_cost_ms_by_context"]) == {"8", "48"}
    assert all(set(curve) >= {1, 64} for curve in made["verify_cost_ms_by_context"].values())
    typical = sum(len(target.chat_ids(r["prompt"])) for r in select_prompts(
        EvalConfig(prompts=prompts, limit=2, offset=6))) / 2 + 2
    assert made["verify_context"] == min((8, 48), key=lambda c: abs(c - typical))
    assert made["verify_cost_ms"] == made["verify_cost_ms_by_context"][str(made["verify_context"])]
    shown = plan_module.format_plan(made)
    assert "after 8 tokens" in shown and "after 48 tokens" in shown
    window = target.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"window of {window}"):
        plan_module.make_plan(target, cfg, read_folder(folder), prompts=prompts, calibration=2, offset=6,
                              max_new_tokens=4, progress=False, contexts=[window])
