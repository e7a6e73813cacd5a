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
- EAGLE-3.1's norm_before_fc (RULES["llamacpp-eagle3-norms"]: the converter reads the top-level flag and maps
  input_norm.weight to the fused features' RMSNorm): test_engine_eagle3.py's norm_before_fc transplant, and
  its twin converted with the flag dropped (the converter then writes no norm; llama.cpp feeds fc the raw
  features, f/100). Measured (2026-12-07, build 11434): served 0.7931 / 0.1954 / 0.1724 vs ours 0.7931 /
  0.1954 / 0.1839, greedy equal 4/4; the twin 0.1078 / 0.0 / 0.0.
- The draft LM (`gguf` -> `--spec-type draft-simple`): eight of the target's layers, untrained.
- DSpark (`gguf` -> `--spec-type draft-dspark`, RULES["llamacpp-dspark-gguf"]): test_engine_dspark.py's bigram
  drafter (a silenced block; the Markov head is the target's bigram table on these prompts), and the twin
  whose Markov rows are indexed by draft ids instead of target ids. Measured (2026-12-06, build 11434, 4
  prompts x 48 tokens): served α 1.000 / 0.979 / 0.917 vs ours 1.000 / 0.980 / 0.980, greedy equal 4/4; the
  twin 0 accepted of 135 drafted.
- DFlash (`gguf` -> `--spec-type draft-dflash`, RULES["llamacpp-dflash-gguf"]): an echo drafter like
  test_engine_dflash.py's (every mask slot drafts the block's anchor; a reduced draft vocabulary and a zero
  mask embedding), built so that a drafter folder keeps it: the folder reloads the target's frozen lm_head, so
  the echo lives in v_proj / o_proj (`tied_echo_drafter`). The same two twins as in vLLM: d2t shifted by one,
  and mask_embedding.pt left out (llama.cpp then embeds the mask slots with the target's row of the mask id).

Skipped without the built engine; each eval serves two llama.cpp runs (with and without the drafter) beside
our decoder.
"""

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_engine_dspark import bigram_drafter
from test_engine_eagle3 import AUX, PROMPTS, normed_transplant, transplant

from draftsmith.heads import llamacpp
from draftsmith.train.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.engine]

FLAGS = ["--tree", "chain-3", "--limit", "4", "--max-new-tokens", "48", "--dtype", "float32",
         "--engine-ngram", "none"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory, llamacpp_ready):
    """(EAGLE-3 drafter folder, draft LM drafter folder, prompts file, DFlash drafter folder, DSpark drafter
    folder, EAGLE-3 drafter folder with norm_before_fc)."""
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
    dflash = tied_echo_drafter(target.model, vocab).save_pretrained(root / "dflash", "smollm2-135m-instruct",
                                                                    target.tokenizer)
    dspark = bigram_drafter(target.model, [ids for ids, _ in answers])[0].save_pretrained(
        root / "dspark", "smollm2-135m-instruct", target.tokenizer)
    normed = normed_transplant(target, prompts, answers).save_pretrained(
        root / "eagle3-norm-before-fc", "smollm2-135m-instruct", target.tokenizer)
    prompt_file = root / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": f"repeat-{i}", "prompt": p}) + "\n"
                                   for i, p in enumerate(PROMPTS)))
    return eagle, draft, prompt_file, dflash, dspark, normed


def tied_echo_drafter(target_model, vocab: list[int]):
    """A one-layer DFlash drafter whose mask slots draft the block's anchor x_p, through the target's own
    (tied, frozen) lm_head. fc, q_proj, the MLP and the mask embedding are zero, so every query is zero and a
    mask slot averages the values it sees, of which only the anchor's is not zero; v_proj projects the
    anchor's normed embedding on the embedding matrix's top principal directions (one kv head's width each)
    and o_proj puts them back, so the slot's output is that projection of E[x_p] and the logits E·out peak at
    x_p for most tokens (the target's answers to echo prompts repeat their tokens)."""
    from draftsmith.heads.dflash.model import DFlashDrafter

    tc = target_model.config.get_text_config()
    drafter = DFlashDrafter(tc, AUX, num_layers=1, block_size=3, draft_vocab=vocab)
    drafter.copy_target_weights(target_model)
    layer, attn = drafter.layers[0], drafter.layers[0].self_attn
    width, group = attn.nkv * attn.hd, attn.nh // attn.nkv
    E = target_model.get_input_embeddings().weight.detach().double()  # [V, H]
    basis = torch.linalg.eigh(E.T @ E).eigenvectors[:, -width:].float()  # [H, width]: top directions
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                p.zero_()
        for norm in (drafter.hidden_norm, drafter.norm, layer.input_layernorm, layer.post_attention_layernorm,
                     attn.q_norm, attn.k_norm):
            norm.weight.fill_(1.0)
        attn.v_proj.weight.copy_(basis.T)
        for g in range(attn.nkv):  # kv head g feeds query heads g*group..: read back from the first of them
            col = g * group * attn.hd
            attn.o_proj.weight[:, col:col + attn.hd] = basis[:, g * attn.hd:(g + 1) * attn.hd]
    return drafter.eval()


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


def test_eagle3_behind_ngram_simple_drafts_with_both(folders, tmp_path):
    """RULES["llamacpp-spec-combined"] in llama.cpp itself: `--spec-type ngram-simple,draft-eagle3` (the
    drafter `--engine-combine`d behind the n-gram type) drafts with both. The n-gram type's drafts show as
    drafts longer than the drafter's chain of 3, which the drafter alone never makes (its twin, the eval's
    own row); the drafter's as verification steps where ngram-simple alone (the other twin) drafted nothing.
    Greedy output stays llama.cpp plain's. Measured (2026-12-07, build 11434, 4 prompts x 48 tokens):
    ngram-simple alone 6 drafts of 131 tokens, none accepted; behind it the drafter 84 drafts of 324 tokens,
    τ 2.214 (alone 83 of 249, 2.217)."""
    flags = [f for f in FLAGS if f not in ("--engine-ngram", "none")]
    assert main(["eval", "--engine", "llamacpp", "--drafter", str(folders[0]), "--prompts", str(folders[2]),
                 *flags, "--engine-ngram", "ngram-simple", "--engine-combine", "ngram-simple",
                 "--out", str(tmp_path)]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    both, ngram = s["combined"]["ngram-simple"], s["ngram"]["ngram-simple"]
    assert both["greedy_equal"] and s["greedy_equal"], (both["greedy_equal_count"], s["greedy_equal_count"])
    alone = s["by_concurrency"]["1"]
    assert alone["num_draft_tokens"] <= 3 * alone["num_drafts"]  # the drafter alone: chains of 3 at most
    assert both["num_draft_tokens"] > 3 * both["num_drafts"], both  # some draft was the n-gram type's
    assert both["num_drafts"] > ngram["num_drafts"] > 0, (both["num_drafts"], ngram["num_drafts"])


def test_eagle3_aux_ids_off_by_one_show_in_served_acceptance(folders, tmp_path, monkeypatch):
    """The twin: the GGUF converted from an eagle3 folder whose top-level ids are ours + 1."""
    def shifted(out):
        config = json.loads((out / "config.json").read_text())
        assert config["eagle_aux_hidden_state_layer_ids"] == AUX  # the only ids the converter reads
        config["eagle_aux_hidden_state_layer_ids"] = [layer + 1 for layer in AUX]
        (out / "config.json").write_text(json.dumps(config))

    assert_twin_shows(monkeypatch, "eagle3", shifted, folders[0], folders[2], tmp_path)


def test_served_norm_before_fc_equals_ours_and_its_twin_misses(folders, tmp_path, monkeypatch):
    s = engine_eval(folders[5], folders[2], tmp_path / "true")
    assert s["method"] == "draft-eagle3" and s["alpha_by_position"][0] >= 0.5, s["alpha_by_position"]
    assert s["comparison"]["agree"], s["comparison"]
    assert s["greedy_equal"], s["greedy_equal_count"]

    def dropped(out):
        config = json.loads((out / "config.json").read_text())
        assert config["norm_before_fc"] is True  # the converter's key
        (out / "config.json").write_text(json.dumps({**config, "norm_before_fc": False}))
        tensors = load_file(str(out / "model.safetensors"))
        tensors.pop("input_norm.weight")  # the converter would map it to a tensor llama.cpp never loads
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    assert_twin_shows(monkeypatch, "eagle3", dropped, folders[5], folders[2], tmp_path / "twin")


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


def test_served_dflash_acceptance_equals_ours(folders, tmp_path):
    s = engine_eval(folders[3], folders[2], tmp_path)
    assert s["method"] == "draft-dflash" and s["num_speculative_tokens"] == 3
    assert s["alpha_by_position"][0] >= 0.5, s["alpha_by_position"]
    assert s["comparison"]["agree"], s["comparison"]
    assert s["greedy_equal"], s["greedy_equal_count"]


@pytest.mark.parametrize("twin", ["d2t-shifted", "mask-embedding-absent"])
def test_dflash_twin_shows_in_served_acceptance(folders, twin, tmp_path, monkeypatch):
    def edited(out):
        if twin == "d2t-shifted":
            tensors = load_file(str(out / "model.safetensors"))
            tensors["d2t"] = (tensors["d2t"] + 1).contiguous()
            save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        else:
            (out / "mask_embedding.pt").unlink()

    assert_twin_shows(monkeypatch, "dflash", edited, folders[3], folders[2], tmp_path)


def test_served_dspark_acceptance_equals_ours(folders, tmp_path):
    s = engine_eval(folders[4], folders[2], tmp_path)
    assert s["method"] == "draft-dspark" and s["num_speculative_tokens"] == 3
    assert s["alpha_by_position"][0] >= 0.5, s["alpha_by_position"]
    assert s["comparison"]["agree"], s["comparison"]
    assert s["greedy_equal"], s["greedy_equal_count"]


def test_dspark_markov_rows_by_draft_id_show_in_served_acceptance(folders, tmp_path, monkeypatch):
    """Twin: W1's rows moved to the draft indices (llama.cpp's build_dspark_markov_head gets rows of W1 by the
    TARGET id argmax-ed at the slot before, after d2t)."""
    def edited(out):
        tensors = load_file(str(out / "model.safetensors"))
        w1, ids = tensors["markov_head.markov_w1.weight"], torch.arange(len(tensors["d2t"])) + tensors["d2t"]
        moved = torch.zeros_like(w1)
        moved[: len(ids)] = w1[ids]
        tensors["markov_head.markov_w1.weight"] = moved.contiguous()
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    assert_twin_shows(monkeypatch, "dspark", edited, folders[4], folders[2], tmp_path)


def assert_twin_shows(monkeypatch, kind: str, edit, folder, prompt_file, out):
    """Serve the GGUF converted from `kind`'s HF layout edited by `edit(hf_folder)` (our decoder keeps the
    true drafter): it converts and serves without a word, so served α must fall well below ours, and
    llama.cpp's output stays its plain output (a wrong drafter costs speed, never output)."""
    rule = llamacpp.GGUF_KINDS[kind]

    def write_hf(drafter, hf, base, dtype, folder_):
        rule.write_hf(drafter, hf, base, dtype, folder_)
        edit(hf)

    monkeypatch.setitem(llamacpp.GGUF_KINDS, kind, dataclasses.replace(rule, write_hf=write_hf))
    s = engine_eval(folder, prompt_file, out)
    assert not s["comparison"]["agree"], s["comparison"]
    assert s["alpha_by_position"][0] < s["ours"]["alpha_by_position"][0] - 0.3, (s["alpha_by_position"],
                                                                                 s["ours"])
    assert s["greedy_equal"]
