"""Our exports served by llama.cpp (build 11434, `draftsmith engine install llamacpp`): served acceptance per
position equals our decoder's, through `draftsmith eval --engine llamacpp` (fp32 target GGUF with an f32 KV
cache, the drafter's GGUF in f32, T=0, a chain of 3, batch 1; eval/measure/engine_llamacpp.py).

- EAGLE-3 (`gguf` -> `--spec-type draft-eagle3`): the transplanted drafter of test_engine_eagle3.py (its layer
  is the target's layer 29 fed the state entering it, so α@1 is high on prompts that repeat a token), with its
  reduced draft vocabulary (d2t). Agreement here shows that llama.cpp's aux-layer numbering is ours
  (heads/engines.py RULES["llamacpp-aux-ids"]): the converter reads the top-level ids and llama.cpp captures
  the input of layer l.
- The negative twin: the same drafter converted with its aux ids off by one ([3, 16, 30]). It converts and
  serves without a word (llama.cpp has no way to know), so only served acceptance shows it: served α@1 must
  fall well below ours, and the output stays llama.cpp's plain output.
- The draft LM (`gguf` -> `--spec-type draft-simple`): eight of the target's layers, untrained.

Skipped without the built engine; each eval serves two llama.cpp runs (with and without the drafter) beside
our decoder.
"""

import json

import pytest
from test_engine_eagle3 import AUX, PROMPTS, transplant

from draftsmith.heads import llamacpp
from draftsmith.train.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.engine]

FLAGS = ["--tree", "chain-3", "--limit", "4", "--max-new-tokens", "48", "--dtype", "float32",
         "--engine-ngram", "none"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, llamacpp_ready):
    """(EAGLE-3 drafter folder, draft LM drafter folder, prompts file)."""
    from draftsmith.distill.loading import load_target
    from draftsmith.heads.registry import DrafterConfig, build_drafter

    root = tmp_path_factory.mktemp("llamacpp")
    target = load_target("smollm2-135m-instruct", dtype="float32", device="cpu")
    prompts = [target.chat_ids(p) for p in PROMPTS]
    answers = target.generate(prompts, 48)
    vocab = sorted({tok for ids, _ in answers for tok in ids})
    eagle = transplant(target.model, AUX, vocab).save_pretrained(root / "eagle3", "smollm2-135m-instruct",
                                                                  target.tokenizer)
    draft = build_drafter(DrafterConfig.for_kind("draft-lm", layers=[0, 1, 2, 3, 26, 27, 28, 29],
                                                 num_speculative_tokens=3), target.model)
    draft = draft.save_pretrained(root / "draft-lm", "smollm2-135m-instruct", target.tokenizer)
    prompt_file = root / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": f"repeat-{i}", "prompt": p}) + "\n"
                                   for i, p in enumerate(PROMPTS)))
    return eagle, draft, prompt_file


def engine_eval(folder, prompt_file, out) -> dict:
    assert main(["eval", "--engine", "llamacpp", "--drafter", str(folder), "--prompts", str(prompt_file),
                 *FLAGS, "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text())


def test_served_eagle3_acceptance_equals_ours(folders, tmp_path):
    s = engine_eval(folders[0], folders[2], tmp_path)
    assert s["engine"] == "llamacpp" and s["method"] == "draft-eagle3" and s["served_format"] == "gguf"
    assert s["num_speculative_tokens"] == 3 and len(s["alpha_by_position"]) == 3
    assert s["alpha_by_position"][0] >= 0.5, s["alpha_by_position"]
    assert s["comparison"]["agree"], s["comparison"]
    assert s["greedy_equal"], s["greedy_equal_count"]


def test_eagle3_aux_ids_off_by_one_show_in_served_acceptance(folders, tmp_path, monkeypatch):
    """The twin: the GGUF converted from an eagle3 folder whose top-level ids are ours + 1."""
    rule = llamacpp.GGUF_KINDS["eagle3"]

    def shifted(drafter, out, base, dtype, folder):
        rule.write_hf(drafter, out, base, dtype, folder)
        config = json.loads((out / "config.json").read_text())
        assert config["eagle_aux_hidden_state_layer_ids"] == AUX  # the only ids the converter reads
        config["eagle_aux_hidden_state_layer_ids"] = [layer + 1 for layer in AUX]
        (out / "config.json").write_text(json.dumps(config))

    monkeypatch.setitem(llamacpp.GGUF_KINDS, "eagle3", llamacpp.GgufKind(
        shifted, rule.spec_type, rule.needs_target_dir, rule.quantized))
    s = engine_eval(folders[0], folders[2], tmp_path)
    assert not s["comparison"]["agree"], s["comparison"]
    assert s["alpha_by_position"][0] < s["ours"]["alpha_by_position"][0] - 0.3, (s["alpha_by_position"],
                                                                                 s["ours"])
    assert s["greedy_equal"]  # a wrong drafter costs speed, never output


def test_served_draft_lm_acceptance_equals_ours(folders, tmp_path):
    s = engine_eval(folders[1], folders[2], tmp_path)
    assert s["method"] == "draft-simple" and s["num_speculative_tokens"] == 3
    assert s["comparison"]["agree"], s["comparison"]
    assert s["greedy_equal"], s["greedy_equal_count"]


SAMPLED = ["--temperature", "0.7", "--top-p", "0.9"]


def test_sampled_draft_lm_acceptance_equals_ours(folders, tmp_path):
    """T=0.7, top-p 0.9: llama.cpp drafts the argmax and keeps d iff its own sample equals it
    (heads/engines.py RULES llamacpp-sampling), each request's sampler chain set to ours; ours drafts the
    argmax verified as one-hot, so served α per position agrees within 3 standard errors. Outputs are draws:
    not compared."""
    assert main(["eval", "--engine", "llamacpp", "--drafter", str(folders[1]), "--prompts", str(folders[2]),
                 *FLAGS, *SAMPLED, "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["temperature"] == 0.7 and s["draft_sampling"] == "greedy" and s["greedy_equal"] is None
    assert s["comparison"]["agree"], s["comparison"]
    assert s["alpha_by_position"][0] > 0, s["alpha_by_position"]  # drafts really accepted at T > 0
