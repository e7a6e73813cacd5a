"""draftsmith plan: measured serving settings, written where asked and served when named (or from the folder).

On a tiny target (timings mean nothing here; what is tested is the plumbing): the plan decodes the
calibration prompts (disjoint from eval's), records every candidate and the verify-cost curve, writes
serving.json; build_proposer then serves the chosen settings, `drafter.plan=false` the recipe's, and a
plan that chose plain decoding serves plain decoding, still lossless. Where a test needs a choice, the timings
are injected (`fake_timing`: a decode takes its new tokens x 1 ms / a speed the test sets), never read off
this machine: a candidate that accepted nothing is never chosen however fast it looks, and a choice must clear
the injected run-to-run noise. `draftsmith plan --out` writes there (a drafter folder only when asked), and
eval's summary says which serving settings it measured and where they came from.
"""

from __future__ import annotations

import itertools
import json
import statistics

import pytest
import torch
from helpers import build_tiny_model_dir

from draftsmith.distill.loading import load_target
from draftsmith.eval.decode.decoder import SpeculativeDecoder, hf_generate
from draftsmith.eval.measure import plan as plan_module
from draftsmith.eval.measure import plan_choice
from draftsmith.eval.measure.bench import Tally
from draftsmith.eval.measure.evaluate import EvalConfig, select_prompts
from draftsmith.eval.serving import build_proposer, decide, serving_line
from draftsmith.heads.medusa.model import MedusaConfig, MedusaHeads
from draftsmith.heads.registry import KINDS, SERVING_FIELDS, DrafterConfig
from draftsmith.heads.runtime.verify import SamplingConfig


@pytest.fixture()
def model_dir(tmp_path):
    return build_tiny_model_dir(tmp_path, "llama", layers=2)


@pytest.fixture()
def setup(tmp_path, model_dir):
    target = load_target(str(model_dir), dtype="float32")
    torch.manual_seed(0)
    heads = MedusaHeads(target.config.hidden_size, target.vocab_size, 3)
    folder = heads.save_pretrained(tmp_path / "drafter", target="tiny")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"p{i}", "category": ["a", "b"][i % 2],
                                           "prompt": f"say {i} " * 3}) + "\n"
                               for i in range(12)))
    return target, folder, str(prompts)


def fake_timing(monkeypatch, spec=1.0, plain=(1.0,)):
    """Inject the plan's timings: decoding a batch takes its new tokens x 1 ms / a speed, `spec` (a number, or
    a function of the decoder) for a speculative decoder and the next of `plain` (cycled) for each run of the
    plain loop. A candidate's speedup is then spec / plain whatever it accepted, and the noise the plain runs'
    spread."""
    runs = itertools.count()

    def decode(decoder, ids, max_new, batch=1):
        speed = (plain[next(runs) % len(plain)] if decoder.source is None else
                 spec(decoder) if callable(spec) else spec)
        tally = Tally()
        for i in range(0, len(ids), batch):
            out = decoder.generate_batch(ids[i: i + batch], max_new, SamplingConfig())
            tally.add(out.new_tokens, out.new_tokens * 1e-3 / speed, out.results, out.steps,
                      out.phase_seconds)
        return tally

    monkeypatch.setattr(plan_module, "_decode", decode)


def only_chain_1(monkeypatch):
    monkeypatch.setattr(MedusaConfig, "serving_candidates", lambda self, config: [{"tree": "chain-1"}])


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
    monkeypatch.setattr(MedusaConfig, "serving_candidates",
                        lambda self, config: [{"tree": "chain-1"}, {"tree": "chain-2"},
                                                                                   {"tree": "chain-9"}])
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=3, offset=6,
                                 max_new_tokens=6, margin=-1.0, progress=False)  # margin -1: always pick
    assert [r["label"] for r in made["candidates"]] == [
        "tree=chain-1", "tree=chain-2", "tree=chain-9", "prompt lookup alone, chain 5 (the drafter unused)",
        "prompt lookup alone, a trie of 3 matches x 8 (the drafter unused)"]
    assert "skipped" in made["candidates"][2]  # deeper than the 3 heads: refused, named, not fatal
    assert set(made["verify_cost_ms"]) >= {1, 8, 64} and made["calibration"]["offset"] == 6
    assert (made["dtype"] == "float32"
            and {"cpu_capability", "cpu_native_bf16", "torch_threads"} <= set(made["machine"]))
    assert made["drafter"] == str(folder) and set(made["noise"]) >= {"method", "relative", "runs"}
    # what is served from the file; the choice itself rests on timings (tested below with injected ones)
    made["chosen"] = made["by_batch"]["1"]["chosen"] = {"plain": False, "settings": {"tree": "chain-2"},
                                                         "label": "tree=chain-2"}
    plan_module.write_plan(folder, made)
    served = build_proposer(cfg, target)
    assert served.tree == made["chosen"]["settings"]["tree"]
    recipe = build_proposer(DrafterConfig(kind="medusa", path=str(folder), plan=False), target)
    # the recipe's: no tree recorded in this folder, so a chain over the 3 heads
    assert recipe.tree == "chain-3"
    prompt = target.chat_ids("say 3 say 3")
    assert (SpeculativeDecoder(target, served).generate(prompt, 12).output_ids
            == hf_generate(target, prompt, 12)[0])


def test_a_plan_from_another_machine_says_so(setup, monkeypatch, capsys):
    """Same device string, other kernels (an AVX512 host's plan served on an AVX2 one): timings do not carry
    over."""
    target, folder, prompts = setup
    monkeypatch.setattr(MedusaConfig, "serving_candidates", lambda self, config: [{"tree": "chain-1"}])
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=1, offset=6,
                                 max_new_tokens=2, margin=-1.0, progress=False)
    plan_module.write_plan(folder, made)

    def said():
        serving = decide(None, cfg)
        return serving_line(serving.record(serving.proposer(target), target))

    assert "re-run draftsmith plan here" not in said()
    made["machine"]["cpu_capability"] = "AMX" if made["machine"]["cpu_capability"] != "AMX" else "AVX2"
    plan_module.write_plan(folder, made)
    assert "not this machine" in said()


def test_a_plan_that_chose_plain_serves_plain(setup, monkeypatch):
    target, folder, prompts = setup
    only_chain_1(monkeypatch)
    fake_timing(monkeypatch, spec=1.5)
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=3, offset=6,
                                 # prompt lookup accepts over 24
                                 max_new_tokens=24, margin=100.0, progress=False)
    why = made["chosen"]["why"]  # the figures that decided it: τ, the step's cost, the verification curve
    assert (made["chosen"]["plain"] and "reached only" in why and "cost" in why
            and "one-token forwards" in why), why
    assert "margin 10000%" in why and "timing noise 0.0%" in why  # the injected plain runs do not vary
    row = next(r for r in made["candidates"] if not plan_choice.accepted_nothing(r))
    assert row["step_cost"] == pytest.approx(row["tau"] / row["speedup"], rel=1e-3)
    # the step's cost split as measured (ms per step drafting / verifying / accepting), in the file and the
    # reason
    assert set(row["step_ms"]) == set(row["plain_step_ms"]) == {"draft", "verify", "accept"}
    assert (row["step_ms"]["draft"] > 0 and row["step_ms"]["verify"] > 0 and "drafting" in why
            and "a plain step's" in why)
    plan_module.write_plan(folder, made)
    served = build_proposer(cfg, target)
    assert type(served).__name__ == "Proposer"  # plain decoding
    prompt = target.chat_ids("say 1")
    assert (SpeculativeDecoder(target, served).generate(prompt, 8).output_ids
            == hf_generate(target, prompt, 8)[0])


def test_a_drafter_folder_names_its_target_when_nothing_else_does(setup, tmp_path):
    """`eval/plan/bench --drafter DIR` without --target, -c or model.target=: the target the folder was
    trained for."""
    from draftsmith.train.commands import resolve

    _, folder, _ = setup
    recipe = tmp_path / "run.yaml"
    recipe.write_text("model:\n  target: other\n")
    assert resolve(None, [], drafter=str(folder))[1].model.target == "tiny"
    for named in (dict(target="other"), dict(config=str(recipe)), dict(overrides=["model.target=other"])):
        cfg, serving = resolve(named.get("config"), named.get("overrides", []), named.get("target"),
                               str(folder))
        assert serving.model.target == cfg.model.target == "other", named


def test_a_plan_where_prompt_lookup_alone_wins_serves_it_and_says_why(setup, monkeypatch):
    """Where the drafter costs more than it adds over free n-gram drafts, the plan serves prompt lookup alone
    (the drafter not even loaded), says by how much, and stays lossless."""
    from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer

    target, folder, prompts = setup
    only_chain_1(monkeypatch)
    # this tiny target's timings decide nothing: lookup is made 3x faster than plain, the Medusa chain no
    # faster
    fake_timing(monkeypatch,
                spec=lambda decoder: 3.0 if isinstance(decoder.proposer, PromptLookupProposer) else 1.0)
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=3, offset=6,
                                 # prompt lookup accepts over 24
                                 max_new_tokens=24, margin=0.03, progress=False)
    chosen = made["chosen"]
    assert chosen["settings"] in (plan_module.LOOKUP_ALONE, plan_module.LOOKUP_TRIE) and not chosen["plain"]
    assert ("beat every setting that drafts with the medusa drafter" in chosen["why"]
            and "tree=chain-1" in chosen["why"])
    assert "the drafter unused" in plan_choice.format_plan(made)
    plan_module.write_plan(folder, made)
    served = build_proposer(cfg, target)
    assert isinstance(served, PromptLookupProposer) and decide(None, cfg).by_plan
    assert (served.tree == ("chain-5" if chosen["settings"] == plan_module.LOOKUP_ALONE
                            else "lookup trie, 3 matches x 8"))
    prompt = target.chat_ids("say 2 say 2 say 2")
    assert (SpeculativeDecoder(target, served).generate(prompt, 12).output_ids
            == hf_generate(target, prompt, 12)[0])


def test_a_plan_with_a_datastore_measures_its_twins_and_serves_the_one_chosen(setup, monkeypatch, tmp_path):
    """`drafter.lookup_datastore` set: each prompt-lookup candidate is measured again drafting from the
    datastore; the choice carries the datastore in serving.json, so the folder serves it without the setting
    typed again."""
    from draftsmith.heads.prompt_lookup.proposer import PromptLookupProposer

    target, folder, prompts = setup
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                                        {"role": "assistant", "content": f"say {i} " * 4}]})
                               + "\n"
                               for i in range(4)))
    monkeypatch.setattr(MedusaConfig, "serving_candidates",
                        lambda self, config: [{"tree": "chain-1", "lookup_branch": 2}])

    def datastore_is_free(decoder):  # timings decide nothing here: the datastore twins win
        lookup = getattr(decoder.proposer, "lookup", decoder.proposer)
        return 3.0 if getattr(lookup, "datastore", None) is not None else 1.0

    fake_timing(monkeypatch, spec=datastore_is_free)
    cfg = DrafterConfig(kind="medusa", path=str(folder), lookup_datastore=[str(answers)])
    made = plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=3, offset=6,
                                 # prompt lookup accepts over 24
                                 max_new_tokens=24, margin=0.03, progress=False)
    labels = [r["label"] for r in made["candidates"]]
    assert (len(labels) == 6
            and sum(label.endswith("+ datastore") or "datastore (the" in label for label in labels) == 3)
    assert made["chosen"]["settings"]["lookup_datastore"] == [str(answers)], plan_choice.format_plan(made)
    plan_module.write_plan(folder, made)
    served = build_proposer(DrafterConfig(kind="medusa", path=str(folder)), target)
    lookup = served if isinstance(served, PromptLookupProposer) else served.lookup
    assert lookup.datastore is not None and "datastore" in served.tree
    prompt = target.chat_ids("say 2 say 2")
    assert (SpeculativeDecoder(target, served).generate(prompt, 12).output_ids
            == hf_generate(target, prompt, 12)[0])
    off = build_proposer(DrafterConfig(kind="medusa", path=str(folder), plan=False, lookup_branch=2), target)
    assert off.lookup.datastore is None  # the recipe's settings: no datastore unless typed


def test_zero_model_tokens_is_only_a_lookup_setting():
    assert DrafterConfig(kind="eagle3", num_speculative_tokens=0, lookup_branch=5).lookup_branch == 5
    with pytest.raises(ValueError, match="0 only beside drafter.lookup_branch > 0"):
        DrafterConfig(kind="eagle3", num_speculative_tokens=0)


def test_a_plan_per_batch_size_serves_the_one_measured_at_that_size(setup, monkeypatch, capsys):
    """`draftsmith plan --batch-sizes 1,2`: each batch size gets its own measured choice; eval and bench build
    the proposer for their batch size (one not measured takes the largest measured below it, and says so)."""
    target, folder, prompts = setup
    monkeypatch.setattr(MedusaConfig, "serving_candidates",
                        lambda self, config: [{"tree": "chain-1"}, {"tree": "chain-2"}])
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=2, offset=6,
                                 max_new_tokens=4, margin=-1.0, progress=False, batch_sizes=[2, 1])
    assert made["batch_sizes"] == [1, 2] and set(made["by_batch"]) == {"1", "2"} and made["batch_size"] == 1
    assert (made["candidates"] == made["by_batch"]["1"]["candidates"]
            and set(made["by_batch"]["2"]["verify_cost_ms"]) >= {1, 64})
    assert [r["label"] for r in made["by_batch"]["2"]["candidates"]][:2] == ["tree=chain-1", "tree=chain-2"]
    # timings on a tiny target decide nothing: fix the choices
    for batch, tree in (("1", "chain-2"), ("2", "chain-1")):
        made["by_batch"][batch]["chosen"] = {"plain": False, "settings": {"tree": tree},
                                             "label": f"tree={tree}", "speedup": 1.1, "tau": 1.5}
    made["chosen"] = made["by_batch"]["1"]["chosen"]
    assert "chosen at batch 2: tree=chain-1" in plan_choice.format_plan(made)
    plan_module.write_plan(folder, made)
    assert build_proposer(cfg, target).tree == "chain-2" and build_proposer(cfg, target, 2).tree == "chain-1"
    serving = decide(None, cfg)
    assert "measured at batch" not in serving_line(serving.record(serving.proposer(target, 2), target, 2))
    served = serving.proposer(target, 4)
    assert served.tree == "chain-1"
    assert "measured at batch 2, served at 4" in serving_line(serving.record(served, target, 4))
    batch = [target.chat_ids("say 1 say 1"), target.chat_ids("say 22")]
    out = SpeculativeDecoder(target, served).generate_batch(batch, 10)
    assert [r.output_ids for r in out.results] == [hf_generate(target, p, 10)[0] for p in batch]


def test_one_proposer_is_built_per_measured_plan_not_per_batch_size(setup):
    """bench keys its decoders by the batch size whose plan serves them: batch sizes served by one plan share
    one."""
    _, folder, _ = setup
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    assert decide(None, cfg).plan_batch(4) is None  # no serving.json yet
    part = {"chosen": {"plain": False, "settings": {"tree": "chain-1"}, "label": "tree=chain-1"}}
    plan_module.write_plan(folder, {"batch_size": 1, **part, "by_batch": {"1": {"batch_size": 1, **part},
                                                                          "4": {"batch_size": 4, **part}}})
    assert [decide(None, cfg).plan_batch(b) for b in (1, 2, 4, 16)] == [1, 1, 4, 4]
    assert decide(None, DrafterConfig(kind="medusa", path=str(folder), plan=False)).plan_batch(4) is None


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
    made = plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=2, offset=6,
                                 max_new_tokens=4, margin=-1.0, progress=False, contexts=[48, 8])
    assert sorted(measured) == [(1, 8), (1, 48)]  # each context really measured, once per batch size
    assert set(made["verify_cost_ms_by_context"]) == {"8", "48"}
    assert all(set(curve) >= {1, 64} for curve in made["verify_cost_ms_by_context"].values())
    typical = sum(len(target.chat_ids(r["prompt"])) for r in select_prompts(
        EvalConfig(prompts=prompts, limit=2, offset=6))) / 2 + 2
    assert made["verify_context"] == min((8, 48), key=lambda c: abs(c - typical))
    assert made["verify_cost_ms"] == made["verify_cost_ms_by_context"][str(made["verify_context"])]
    shown = plan_choice.format_plan(made)
    assert "after 8 tokens" in shown and "after 48 tokens" in shown
    window = target.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"window of {window}"):
        plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=2, offset=6,
                              max_new_tokens=4, progress=False, contexts=[window])


def old_rule(made: dict, margin: float) -> dict | None:
    """The choice before issue 36: the fastest measured candidate, if it beat plain by `margin` (the negative
    twin)."""
    best = max((r for r in made["candidates"] if "speedup" in r), key=lambda r: r["speedup"])
    return best if best["speedup"] >= 1 + margin else None


def test_a_candidate_that_accepted_nothing_is_never_chosen_however_fast_it_looks(setup, monkeypatch):
    """Over 6 tokens nothing here accepts a draft (τ 1.00): each candidate does plain decoding's work plus
    drafting, so its lead is timing noise. Injected timings make every candidate look 1.2x faster than plain;
    the rule before chose one (the twin), the plan now chooses plain decoding and says why."""
    target, folder, prompts = setup
    only_chain_1(monkeypatch)
    fake_timing(monkeypatch, spec=1.2)
    cfg = DrafterConfig(kind="medusa", path=str(folder))
    made = plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=1, offset=6,
                                 max_new_tokens=6, margin=0.03, progress=False, contexts=[16])
    rows = [r for r in made["candidates"] if "speedup" in r]
    assert (rows
            and all(plan_choice.accepted_nothing(r) and r["accepted"] == 0 and r["tau"] == 1.0 for r in rows))
    assert all(r["speedup"] == pytest.approx(1.2) for r in rows)  # injected: 1.2 / 1.0
    assert old_rule(made, 0.03) is not None  # the twin: timing noise reported as a choice
    chosen = made["chosen"]
    assert chosen["plain"] and "no candidate accepted a draft token" in chosen["why"], chosen
    assert "looked x1.200 but accepted no draft token" in chosen["why"]
    # not even with the noise guard off (a negative margin): nothing accepted is never a choice
    made = plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=1, offset=6,
                                 max_new_tokens=6, margin=-1.0, progress=False, contexts=[16])
    assert made["chosen"]["plain"]


def test_a_choice_must_beat_plain_beyond_the_measured_noise(setup, monkeypatch):
    """Every candidate is made 1.1x faster than the plain run beside it when plain runs at speed 1.0; the
    plain runs alternate speeds 1.0 and 1.25 (noise 25%): no choice clears 1 + 3% + 25%, plain decoding is
    chosen and the reason quotes the noise, recorded in the plan. The twin: steady plain runs (no noise), the
    same 1.1x is chosen."""
    target, folder, prompts = setup
    only_chain_1(monkeypatch)
    cfg = DrafterConfig(kind="medusa", path=str(folder))

    def plan(plain):
        fake_timing(monkeypatch, spec=1.1, plain=plain)
        return plan_module.make_plan(target, decide(None, cfg), prompts=prompts, calibration=3, offset=6,
                                     # prompt lookup accepts over 24
                                     max_new_tokens=24, margin=0.03, progress=False, contexts=[16])

    noisy = plan(plain=(1.0, 1.25))
    runs = noisy["noise"]["runs"]
    rates = [1000 * (1.0, 1.25)[i % 2] for i in range(runs)]  # tokens/s of the injected plain runs
    spread = (max(rates) - min(rates)) / statistics.median(rates)
    assert runs == 3 and noisy["noise"]["relative"] == pytest.approx(spread)
    assert (any(not plan_choice.accepted_nothing(r) and r["speedup"] == pytest.approx(1.1)
                for r in noisy["candidates"]))
    assert noisy["chosen"]["plain"] and "timing noise 25.0%" in noisy["chosen"]["why"], noisy["chosen"]
    assert noisy["chosen"]["bar"] == pytest.approx(1.28)
    assert "timing noise 25.0%" in plan_choice.format_plan(noisy)
    steady = plan(plain=(1.0,))
    chosen = steady["chosen"]
    assert (steady["noise"]["relative"] == 0.0 and not chosen["plain"]
            and chosen["speedup"] == pytest.approx(1.1))
    assert plan_choice.lookup_alone(chosen["settings"])  # the Medusa chain accepted nothing: never chosen


def test_the_choice_rule_on_given_figures():
    """The bar is 1 + margin + noise, and a candidate's speedup less one standard error must clear it."""
    row = {"settings": {"tree": "chain-2"}, "label": "tree=chain-2", "tau": 1.6, "accepted": 9,
           "speedup": 1.2, "speedup_se": 0.0, "speedup_low": 1.2, "step_cost": 1.33}
    curve = {1: 1.0, 4: 1.5, 8: 2.0, 16: 3.0}

    def choose(noise, **changes):
        return plan_choice.choose([{**row, **changes}], curve, 0.03, "medusa", {"method": "plain-runs-range",
                                                                                "runs": 5, "relative": noise})

    assert not choose(0.10)["plain"]  # 1.2 > 1.13
    # 1.2 < 1.33: within the noise
    assert choose(0.30)["plain"] and "timing noise 30.0%" in choose(0.30)["why"]
    assert choose(0.10, speedup_se=0.15, speedup_low=1.05)["plain"]  # its lower end, 1.05, below 1.13
    assert choose(0.0, accepted=0)["plain"] and choose(0.0, tau=1.0)["plain"]


def test_plan_writes_where_asked_and_eval_says_what_it_served(setup, model_dir, monkeypatch, tmp_path,
                                                              capsys):
    """`plan --out NEW/DIR` creates the folder and writes there, leaving the drafter folder alone, so a
    following `eval --drafter` measures the drafter (its config's settings, said and recorded);
    `eval --serving FILE` serves the plan and names it; `--into-drafter` writes into the folder, whose plan
    eval then serves by default, and says so."""
    from draftsmith.train.cli import main

    _, folder, prompts = setup
    only_chain_1(monkeypatch)
    common = ["--target", str(model_dir), "--prompts", prompts, "--dtype", "float32"]
    plan_flags = ["plan", "--drafter", str(folder), "--calibration", "1", "--offset", "6", "--max-new-tokens",
                  "2", "--contexts", "16", *common]
    out = tmp_path / "new" / "plans"
    assert main([*plan_flags, "--out", str(out), "log.progress=false"]) == 0
    assert (out / "serving.json").is_file() and not (folder / "serving.json").exists()
    assert "the drafter folder is unchanged" in capsys.readouterr().out

    def evaluate(name, *flags, overrides=()):
        assert main(["eval", "--drafter", str(folder), "--limit", "1", "--max-new-tokens", "4", *common,
                     "--out", str(tmp_path / name), *flags, "log.progress=false", *overrides]) == 0
        return json.loads((tmp_path / name / "summary.json").read_text()), capsys.readouterr().out

    summary, said = evaluate("eval")
    assert (summary["drafter_kind"] == "medusa" and summary["tree"] == "chain-3"
            and not summary["served_by_plan"])
    assert summary["serving"]["source"] == "config" and summary["serving"]["settings"]["tree"] is None
    assert "[serving] config: tree chain-3" in said
    summary, said = evaluate("eval-served", "--serving", str(out / "serving.json"))
    plan = json.loads((out / "serving.json").read_text())
    assert (summary["serving"]["source"] == f"serving.json at {out / 'serving.json'}"
            and summary["served_by_plan"])
    assert summary["serving"]["label"] == plan["chosen"].get("label", "plain decoding")
    assert f"[serving] serving.json at {out / 'serving.json'}" in said
    assert (main([*plan_flags, "--into-drafter", "log.progress=false"]) == 0
            and (folder / "serving.json").is_file())
    summary, said = evaluate("eval-folder")
    assert (summary["serving"]["source"] == f"serving.json at {folder / 'serving.json'}"
            and summary["served_by_plan"])
    summary, said = evaluate("eval-recipe", overrides=["drafter.plan=false"])
    assert summary["serving"]["source"] == "config" and "ignored" in summary["serving"] and "ignored" in said


def test_plan_fails_before_measuring_when_it_cannot_write(setup, model_dir, monkeypatch, tmp_path, capsys):
    """An --out that cannot be created (under a file) fails at once, naming the folder and the fix; so do
    --into-drafter beside another --out, and eval's --serving beside --tree or naming no file."""
    import draftsmith.distill.loading as target_module
    from draftsmith.train.cli import main

    _, folder, prompts = setup

    def never(*args, **kwargs):
        raise AssertionError("measured before checking where the plan goes")

    monkeypatch.setattr(target_module, "load_target", never)
    monkeypatch.setattr(plan_module, "make_plan", never)
    (tmp_path / "a-file").write_text("")
    base = ["plan", "--drafter", str(folder), "--target", str(model_dir), "--prompts", prompts]
    assert main([*base, "--out", str(tmp_path / "a-file" / "plans")]) == 2
    err = capsys.readouterr().err
    assert f"cannot write the plan into {tmp_path / 'a-file' / 'plans'}" in err and "pass --out" in err
    assert main([*base, "--into-drafter", "--out", str(tmp_path / "elsewhere")]) == 2
    assert "pass one of them" in capsys.readouterr().err
    assert main(["eval", "--drafter", str(folder), "--serving", "x.json", "--tree", "chain-1"]) == 2
    assert "--serving and --tree" in capsys.readouterr().err
    assert main(["eval", "--drafter", str(folder), "--engine-draft-threads", "1"]) == 2
    assert "add --engine llamacpp" in capsys.readouterr().err


def test_the_default_plan_folder_is_beside_the_runs_not_in_the_drafter(tmp_path):
    assert (plan_module.default_out("runs",
                                    "runs/eagle3-all/drafter") == plan_module.Path("runs/plan/eagle3-all"))
    assert plan_module.default_out("runs", "runs/draft/export/hf") == plan_module.Path("runs/plan/draft-hf")


def test_eval_refuses_a_plan_of_another_kind_or_no_plan(setup, tmp_path):
    _, folder, _ = setup
    other = tmp_path / "other.json"
    part = {"batch_size": 1, "chosen": {"plain": True}}
    other.write_text(json.dumps({"kind": "eagle3", **part, "by_batch": {"1": part}}))
    with pytest.raises(ValueError, match="plan for a eagle3 drafter, not this medusa one"):
        decide(None, DrafterConfig(kind="medusa", path=str(folder)), other)
    other.write_text(json.dumps({"settings": {}}))
    with pytest.raises(ValueError, match="holds no plan"):
        decide(None, DrafterConfig(kind="medusa", path=str(folder)), other)
    with pytest.raises(FileNotFoundError, match="--serving"):
        decide(None, DrafterConfig(kind="medusa", path=str(folder)), tmp_path / "missing.json")


def test_eval_names_a_recorded_tree_as_its_source(setup):
    """No plan served: the tree the folder recorded (draftsmith.json) is the source, unless the config names
    one."""
    from draftsmith.heads.files import update_meta
    from draftsmith.heads.runtime.tree import chain_entry

    def serve(cfg, target):
        serving = decide(None, cfg)
        proposer = serving.proposer(target)
        return proposer, serving.record(proposer, target)

    target, folder, _ = setup
    update_meta(folder, tree=chain_entry(2))
    proposer, record = serve(DrafterConfig(kind="medusa", path=str(folder)), target)
    assert (record["source"] == "recorded tree in draftsmith.json"
            and proposer.tree == record["tree"] == "chain-2")
    _, record = serve(DrafterConfig(kind="medusa", path=str(folder), tree="chain-1"), target)
    assert record["source"] == "config" and record["settings"]["tree"] == "chain-1"


def test_several_drafters_are_planned_on_the_same_prompts_and_one_is_served(setup, model_dir, monkeypatch,
                                                                            tmp_path,
                                                                             capsys):
    """`plan --drafter A --drafter B`: one plan per drafter (OUT/NAME/serving.json, same calibration prompts)
    and OUT/choice.json saying what to serve. Untrained heads accept nothing here, prompt lookup does over 24
    tokens: with injected timings (every speculative decode 1.3x plain, steady plain) both plans choose prompt
    lookup alone, and the choice serves it as one setting, not two rivals. `--engine` beside several drafters
    fails at once. (Which drafter wins on given figures: test_the_drafter_choice_rule_on_given_plans.)"""
    from draftsmith.train.cli import main

    target, folder_a, prompts = setup
    torch.manual_seed(1)
    folder_b = MedusaHeads(target.config.hidden_size, target.vocab_size, 2).save_pretrained(
        tmp_path / "two-heads" / "drafter", target="tiny")
    only_chain_1(monkeypatch)
    fake_timing(monkeypatch, spec=1.3)
    out = tmp_path / "compare"
    flags = ["plan", "--drafter", str(folder_a), "--drafter", str(folder_b), "--target", str(model_dir),
             "--prompts", prompts, "--calibration", "2", "--offset", "6", "--max-new-tokens", "24",
             "--contexts", "16", "--dtype", "float32"]
    assert main([*flags, "--out", str(out), "log.progress=false"]) == 0
    said = capsys.readouterr().out
    choice = json.loads((out / "choice.json").read_text())
    name_a = tmp_path.name  # tmp_path/drafter: a drafter folder is named by its run, the folder above it
    plan_a = json.loads((out / name_a / "serving.json").read_text())
    plan_b = json.loads((out / "two-heads" / "serving.json").read_text())
    assert plan_a["calibration"]["ids"] == plan_b["calibration"]["ids"] and plan_b["drafter"] == str(folder_b)
    chosen = choice["chosen"]
    assert (chosen["kind"] == "prompt-lookup" and chosen["drafter"] is None
            and chosen["speedup"] == pytest.approx(1.3))
    assert set(choice["plans"]) == {name_a, "two-heads"} and "prompt lookup alone" in choice["why"]
    assert "serve: prompt lookup alone: draftsmith eval --drafter" in said
    assert main([*flags, "--out", str(out), "--engine", "vllm"]) == 2
    assert "one drafter at a time" in capsys.readouterr().err


def test_the_drafter_choice_rule_on_given_plans():
    """compare_plans: the fastest choice over its own plain wins; a lead within the larger noise is called a
    tie; prompt lookup alone chosen by two plans is one setting, not a rival; every plan choosing plain serves
    plain."""
    def plan(kind, speedup, noise=0.02, label="tree=chain-2", settings=None):
        chosen = {"plain": True} if speedup is None else {
            "plain": False, "settings": settings or {"tree": "chain-2"}, "label": label, "speedup": speedup,
            "speedup_low": speedup, "tau": 1.5}
        part = {"chosen": chosen, "noise": {"relative": noise}, "plain_tokens_per_s": 30.0,
                "candidates": [{"label": label, "tokens_per_s": 30.0 * (speedup or 1.0), "step_ms": None}]}
        return {"kind": kind, "drafter": f"runs/{kind}/drafter", "dtype": "float32", "machine": {},
                "calibration": {}, "batch_sizes": [1], "by_batch": {"1": part}, **part}

    compare = plan_choice.compare_plans
    got = compare({"eagle3": plan("eagle3", 1.20), "dflash": plan("dflash", 1.40)})
    assert (got["chosen"]["name"] == "dflash" and got["chosen"]["clear"]
            and got["chosen"]["lead"] == round(1.4 / 1.2 - 1, 4))
    got = compare({"eagle3": plan("eagle3", 1.20), "dflash": plan("dflash", 1.22, noise=0.05)})
    assert got["chosen"]["name"] == "dflash" and not got["chosen"]["clear"] and "a tie" in got["why"]
    lookup = {"num_speculative_tokens": 0, "lookup_branch": 5}
    got = compare({"eagle3": plan("eagle3", 1.5, label="lookup", settings=lookup),
                   "dflash": plan("dflash", 1.5, label="lookup", settings=lookup),
                   "peagle": plan("peagle", 1.1)})
    assert got["chosen"]["drafter"] is None and got["chosen"]["kind"] == "prompt-lookup"
    assert "peagle" in got["why"] and got["chosen"]["clear"]
    got = compare({"eagle3": plan("eagle3", None), "dflash": plan("dflash", None)})
    assert got["chosen"] == {"plain": True} and "chose plain" in got["why"]
    got = compare({"eagle3": plan("eagle3", 1.3), "dflash": plan("dflash", None)})
    assert got["chosen"]["name"] == "eagle3" and "dflash (dflash, plain decoding) x1.000" in got["why"]
